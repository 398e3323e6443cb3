"""`dpsynth submit` against a real local head (`ray start --head` on loopback): run a small job, fetch its logs."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def local_head(tmp_path_factory):
    gcs, dash = _free_port(), _free_port()
    # Every port this head opens is a free one: with the defaults its dashboard agent collides with
    # the test session's own Ray (already up when this runs after other tests) and jobs never start.
    agent_ports = [
        f"--{name}={_free_port()}"
        for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
                     "runtime-env-agent-port", "node-manager-port", "object-manager-port",
                     "ray-client-server-port")
    ]
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"  # a loopback-only test head; real clusters pass RAY_AUTH_TOKEN
    temp_dir = tmp_path_factory.mktemp("rayhead")
    start = [
        str(BIN / "ray"), "start", "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=1",
        "--include-dashboard=true", f"--temp-dir={temp_dir}", "--disable-usage-stats", *agent_ports,
    ]
    # --block keeps `ray start` in the foreground; terminating it stops THIS head only. (`ray stop`
    # would kill every Ray process on the machine, the test session's own Ray included.)
    head = subprocess.Popen([*start, "--block"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_dashboard(dash, head)
        yield f"http://127.0.0.1:{dash}", env
    finally:
        head.terminate()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()


def _wait_for_dashboard(port: int, head: subprocess.Popen, timeout: float = 180.0) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"`ray start --head` exited with code {head.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=5)
            return
        except urllib.error.HTTPError:  # it answers (e.g. 401 under token auth): it is up
            return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"the local head's dashboard did not come up on port {port}")


def test_submit_runs_a_job_and_fetches_its_logs(local_head):
    address, env = local_head
    cmd = [
        str(BIN / "dpsynth"), "submit", "--address", address, "--working-dir", str(REPO), "--",
        "privacy", "epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.0",
        "--steps", "1000", "--delta", "1e-5",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = out.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    assert f"{job_id}: SUCCEEDED" in out.stdout

    logs = subprocess.run([str(BIN / "dpsynth"), "jobs", "logs", job_id, "--address", address],
                          env=env, capture_output=True, text=True, timeout=120)
    assert logs.returncode == 0
    assert "1.8" in logs.stdout  # the PLD epsilon of that point, about 1.83, computed on the cluster
    status = subprocess.run([str(BIN / "dpsynth"), "jobs", "status", job_id, "--address", address],
                            env=env, capture_output=True, text=True, timeout=120)
    assert status.stdout.strip() == "SUCCEEDED"


def test_submit_to_unreachable_cluster_is_a_clear_error():
    port = _free_port()
    out = subprocess.run(
        [str(BIN / "dpsynth"), "submit", "--address", f"http://127.0.0.1:{port}", "--", "models", "list"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2
    assert f"127.0.0.1:{port}" in out.stderr and "cannot reach" in out.stderr
