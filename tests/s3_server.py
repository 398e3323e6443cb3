"""moto's S3 server in its own process on 127.0.0.1 (the real S3 HTTP API; any credentials accepted).

Not a thread in the test process: moto's server imports Flask, whose unbound context proxies raise on
attribute access, and vLLM's CPU platform scans every loaded module's attributes when it starts an
engine, so a later vLLM test in the same worker would fail."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3_server(timeout_s: float = 60.0) -> Iterator[str]:
    """Yield the endpoint URL of a moto S3 server that lives as long as the context."""
    port = _free_port()
    server = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
