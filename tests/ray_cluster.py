"""A real two-node Ray cluster on this machine for the submission tests (no mocks).

``ray start --head`` on loopback with every port free (the defaults collide with the test session's
own Ray), then ``ray start --address=HEAD`` for a second node with its own free ports. Each
``ray start --block`` runs in its own process group, so a test can stop one node (gracefully, or
SIGKILL its whole group as a node crash) without touching any other Ray on the machine -- never
``ray stop``, which kills every Ray process here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
_NODE_PORTS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
               "runtime-env-agent-port", "node-manager-port", "object-manager-port")


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """``n`` distinct free ports, none in ``avoid`` (ports picked earlier, not yet bound by Ray). Every
    socket stays bound until all are picked: asked one at a time, the OS can hand the same port out
    twice, and ``ray start`` then refuses ("trying to use a port number ... used by other components")."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] not in avoid:
                ports.append(s.getsockname()[1])
        return ports


def cluster_env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"  # a loopback-only test cluster; real clusters pass RAY_AUTH_TOKEN
    # A node's raylet must register within this (default 30 s); on a loaded 2-core machine it did
    # not ("The current node timed out during startup ... RAY_raylet_start_wait_time_s").
    env["RAY_raylet_start_wait_time_s"] = "180"
    return env


@dataclass
class LocalCluster:
    """A head (and optionally more nodes) started with ``ray start --block``."""

    temp_dir: Path
    env: dict[str, str] = field(default_factory=cluster_env)
    gcs_port: int = 0  # 0: two distinct free ports for these two
    dashboard_port: int = 0
    nodes: list[subprocess.Popen] = field(default_factory=list)
    # Ray's AF_UNIX socket paths (under --temp-dir) must stay below 108 bytes; pytest's tmp paths
    # (longer under xdist: .../popen-gw0/...) do not, so Ray's own files go to a short /tmp dir.
    ray_temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp")))
    node_temp_dirs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.gcs_port and self.dashboard_port):
            self.gcs_port, self.dashboard_port = free_ports(2)

    @property
    def address(self) -> str:
        """The job-submission (dashboard) address."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def _start(self, args: list[str], more_ports: tuple[str, ...] = ()) -> subprocess.Popen:
        names = (*_NODE_PORTS, *more_ports)
        picked = free_ports(len(names), avoid=frozenset({self.gcs_port, self.dashboard_port}))
        ports = [f"--{name}={port}" for name, port in zip(names, picked)]
        cmd = [str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *ports, *args,
               "--block"]
        log = open(self.temp_dir / f"ray-start-{len(self.nodes)}.log", "wb")  # why a node did not start
        node = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: int = 1) -> None:
        head = self._start(["--head", f"--port={self.gcs_port}", "--dashboard-host=127.0.0.1",
                            f"--dashboard-port={self.dashboard_port}", f"--num-cpus={num_cpus}",
                            "--include-dashboard=true", f"--temp-dir={self.ray_temp_dir}"],
                           more_ports=("ray-client-server-port",))
        _wait_for_dashboard(self.dashboard_port, head)
        self._wait(lambda nodes: len(nodes) >= 1, head, "the head did not register", 300.0)  # slow on a loaded machine

    def add_node(self, num_cpus: int = 1, num_gpus: int = 0, timeout: float = 300.0) -> subprocess.Popen:
        """Join a node (``--num-gpus`` declares logical GPUs; no device needed) and wait until it is alive."""
        before = {n["node_id"] for n in self.alive_nodes()}
        # Its own temp dir, as on a separate machine. Sharing the head's, this node's runtime-env agent
        # deletes the job's working_dir package when its own task releases it: that is the driver's
        # cwd, and the driver then dies ("Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so" at
        # `import torch`, or FileNotFoundError from os.getcwd()).
        own_temp = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))
        self.node_temp_dirs.append(own_temp)
        node = self._start([f"--address={self.gcs_address}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                            f"--temp-dir={own_temp}"])
        self._wait(lambda nodes: any(n["node_id"] not in before for n in nodes), node, "the node did not join", timeout)
        return node

    def _wait(self, ok, proc: subprocess.Popen, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ok(self.alive_nodes()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(what)
            time.sleep(1.0)

    def alive_nodes(self) -> list[dict]:
        """The alive nodes (node_id, resources_total, ...) from the head's state API."""
        import json

        try:
            with urllib.request.urlopen(f"{self.address}/api/v0/nodes", timeout=10) as r:
                rows = json.load(r)["data"]["result"]["result"]
        except (OSError, KeyError, ValueError):
            return []
        return [n for n in rows if n.get("state") == "ALIVE"]

    def kill_node(self, node: subprocess.Popen) -> None:
        """A node crash: SIGKILL its whole process group (raylet, workers, agents)."""
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.wait(timeout=30)

    def stop(self) -> None:
        """Stop every node of this cluster: SIGTERM to each process group, SIGKILL what lingers."""
        for node in reversed(self.nodes):  # other nodes first, the head last
            if node.poll() is None:
                try:
                    os.killpg(node.pid, signal.SIGTERM)
                    node.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
                except ProcessLookupError:
                    continue
            try:
                os.killpg(node.pid, signal.SIGKILL)  # anything of that node still in its group
            except ProcessLookupError:
                pass
            node.wait(timeout=30)
        for temp in (self.ray_temp_dir, *self.node_temp_dirs):  # Ray's session files, logs, spilled objects
            shutil.rmtree(temp, ignore_errors=True)


def _wait_for_dashboard(port: int, head: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"`ray start --head` exited with code {head.returncode} (log: ray-start-*.log in "
                               "the cluster's temp_dir)")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=5)
            return
        except urllib.error.HTTPError:  # it answers (e.g. 401 under token auth): it is up
            return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"the local head's dashboard did not come up on port {port}")
