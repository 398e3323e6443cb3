"""`dpsynth serve start|status|stop`: the Ray Serve generation service.

``start`` runs on an embedded local Ray by default (``--address ray://...`` for a cluster); blocking
by default, ``--detach`` runs it in a background process (local) or leaves it on the cluster. A
small state file (``$DPSYNTH_CACHE/serve/state.json``) lets ``status`` and ``stop`` find it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer

from dpsynth_core.errors import ConfigError

app = typer.Typer(help="Ray Serve generation service.", no_args_is_help=True)


def _state_file() -> Path:
    from dpsynth_core.models import cache_dir

    return cache_dir() / "serve" / "state.json"


def _write_state(state: dict) -> None:
    path = _state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def _read_state() -> dict | None:
    path = _state_file()
    return json.loads(path.read_text()) if path.is_file() else None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _healthy(url: str, timeout: float = 2.0) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


@app.command()
def start(
    config: Path = typer.Option(..., "--config", "-c", help="Serve config YAML (serving.config.ServeConfig)."),
    address: str | None = typer.Option(
        None, "--address", help="Ray cluster (ray://host:10001); default: $RAY_ADDRESS, else an embedded local Ray."),
    detach: bool = typer.Option(False, "--detach", help="Return once the service is up."),
    num_cpus: int = typer.Option(2, "--num-cpus", help="CPUs of the embedded local Ray."),
    ready_timeout_s: float = typer.Option(600.0, "--ready-timeout", help="Seconds to wait for --detach."),
) -> None:
    """Deploy the generation app and print its URL."""
    from dpsynth_core.config import load_config
    from ray_jobs.cluster import cluster_address
    from serving.app import api_key_digest, http_url
    from serving.config import ServeConfig

    address = cluster_address(address)  # --address, else RAY_ADDRESS; None: embedded local Ray
    cfg = load_config(config, ServeConfig)
    api_key_digest(cfg)  # fail now, not in the background, if the key's env var is missing
    url = http_url(cfg)
    previous = _read_state()
    if previous and _alive(previous.get("pid")) and previous.get("address") is None:
        raise ConfigError(f"a generation service already runs (pid {previous['pid']}, {previous['url']}); "
                          "`dpsynth serve stop` first")

    if detach and address is None:  # a local Ray dies with its process: run a blocking child in the background
        log = _state_file().parent / "serve.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-c", "from dpsynth.cli.main import app; app()", "serve", "start", "--config", str(config),
               "--num-cpus", str(num_cpus)]
        with open(log, "ab") as out:
            child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise ConfigError(f"the service exited with status {child.returncode}; see {log}")
            # Up = the child recorded itself (so `serve stop` finds it) and the app answers.
            if (_read_state() or {}).get("pid") == child.pid and _healthy(url):
                typer.echo(f"serving at {url}  (OpenAI base_url: {url}/v1, pid {child.pid}, log {log})")
                return
            time.sleep(0.5)
        os.kill(child.pid, signal.SIGTERM)
        raise ConfigError(f"the service did not become ready within {ready_timeout_s:.0f} s; see {log}")

    import ray

    from serving.app import deploy, undeploy

    from ray_jobs.cluster import ensure_ray

    env = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    ensure_ray(address, num_cpus=None if address else num_cpus, env_vars=env)  # join, or embed num_cpus
    deploy(cfg)
    _write_state({"pid": os.getpid(), "url": url, "app_name": cfg.app_name, "address": address,
                  "config": str(config.resolve())})
    typer.echo(f"serving at {url}  (OpenAI base_url: {url}/v1)")
    if detach:  # cluster mode: the app stays on the cluster
        return

    stopping = {"flag": False}

    def _stop(*_):
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stopping["flag"]:
            time.sleep(0.5)
    finally:
        typer.echo("stopping")
        undeploy(cfg)
        # an embedded Ray takes Serve down with it; serve.shutdown() first would kill its controller mid-call
        # and Ray would print that call's failure
        ray.shutdown()
        state = _read_state()
        if state and state.get("pid") == os.getpid():
            _state_file().unlink(missing_ok=True)


@app.command()
def status() -> None:
    """Where the service runs and whether it answers."""
    state = _read_state()
    if state is None:
        typer.echo("no generation service recorded (start one with `dpsynth serve start --config FILE`)")
        sys.exit(1)  # typer.Exit would return 0 from the non-standalone CLI
    healthy = _healthy(state["url"])
    where = state["address"] or f"local pid {state['pid']} ({'alive' if _alive(state['pid']) else 'not running'})"
    typer.echo(f"app {state['app_name']} at {state['url']} on {where}: {'healthy' if healthy else 'NOT answering'}")
    if healthy:
        import httpx

        models = httpx.get(state["url"] + "/health", timeout=5).json().get("models", [])
        typer.echo(f"models: {', '.join(models)}")
    sys.exit(0 if healthy else 1)


@app.command()
def stop(timeout_s: float = typer.Option(60.0, "--timeout")) -> None:
    """Stop the service started by `serve start` (local process, or the app on the cluster)."""
    state = _read_state()
    if state is None:
        typer.echo("no generation service recorded")
        return
    if state.get("address"):
        import ray
        from ray import serve

        from ray_jobs.cluster import ensure_ray

        ensure_ray(state["address"])
        from serving.ray_llm_tools import tools_app_name

        running = serve.status().applications
        for name in (tools_app_name(state["app_name"]), state["app_name"]):  # the first exists for app ray_llm
            if name in running:
                serve.delete(name)
        ray.shutdown()
    elif _alive(state.get("pid")):
        os.kill(state["pid"], signal.SIGTERM)  # the blocking `start` cleans up Serve and Ray on SIGTERM
        deadline = time.monotonic() + timeout_s
        while _alive(state["pid"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(state["pid"]):
            raise ConfigError(f"pid {state['pid']} did not stop within {timeout_s:.0f} s")
    _state_file().unlink(missing_ok=True)
    typer.echo(f"stopped {state['app_name']}")
