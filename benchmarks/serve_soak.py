"""Soak test of a local `dpsynth serve`: valid, malformed and oversized requests under concurrency.

    .venv/bin/python benchmarks/serve_soak.py [--model tiny-llama] [--requests 500] [--concurrency 32]

1. `dpsynth serve start --detach` (loopback, a free port) and, at once, `dpsynth serve status`:
   detach must return only once the state file is written and the app answers.
2. ``--requests`` requests at ``--concurrency`` in flight: about 70 % valid (completions and chat),
   the rest malformed (empty or blank prompt, bad JSON, unknown field, over a cap, unknown model,
   empty chat message), plus 5 oversized bodies (4 with Content-Length, 1 chunked 50 MB).
   By default the generator holds 16 + queues 8 (< 32 in flight), so back-pressure (503) is
   exercised; ``--queued 32`` gives room for every request in flight (latency without shedding).
3. /health and /ready are polled every 0.5 s throughout.
4. `dpsynth serve stop`.
Prints counts per status code, unexpected answers, p50/p99 latency of the valid requests, and what
/health and /ready said. Loopback only; every loop is bounded. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sample_size import note

CLI = [sys.executable, "-c", "from dpsynth.cli.main import app; app()"]
MODEL = "gen"
PROMPTS = ["Write a sentence about cells.", "Describe a mouse study.", "Summarise a CRISPR screen.", "Hello"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def _config(model: str, port: int, max_tokens: int, queued: int) -> dict:
    return {
        "app_name": "dpsynth-soak",
        "models": [{"name": MODEL, "model": model, "max_batch_size": 16, "batch_wait_timeout_s": 0.05,
                    "num_cpus": 1, "max_ongoing_requests": 16, "max_queued_requests": queued}],
        "http": {"host": "127.0.0.1", "port": port, "ready_probe_timeout_s": 2.0},
        "limits": {"max_tokens": max_tokens, "max_n": 4, "max_tokens_per_prompt": 4 * max_tokens,
                   "max_tokens_per_request": 16 * max_tokens, "request_timeout_s": 60, "retry_after_s": 2},
    }


# ---- the request mix ---------------------------------------------------------------------
def _valid(rng: random.Random, max_tokens: int) -> tuple[str, str, dict]:
    tokens = rng.randint(4, max_tokens)
    if rng.random() < 0.3:
        return "valid", "/v1/chat/completions", {
            "model": MODEL, "max_tokens": tokens, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
    prompts = rng.sample(PROMPTS, rng.randint(1, 2))
    return "valid", "/v1/completions", {"model": MODEL, "prompt": prompts, "max_tokens": tokens,
                                        "n": rng.randint(1, 2)}


MALFORMED = [
    {"model": MODEL, "prompt": "", "max_tokens": 4},
    {"model": MODEL, "prompt": ["ok", "  \n "], "max_tokens": 4},
    {"model": MODEL, "prompt": "x", "max_tokens": -1},
    {"model": MODEL, "prompt": "x", "bogus_field": 1},
    {"model": MODEL, "prompt": "x", "max_tokens": 10_000},
    {"model": MODEL, "prompt": "x", "n": 4, "max_tokens": 10_000},
    {"model": MODEL, "prompt": ["a"] * 8, "n": 4, "max_tokens": 64},  # over the work cap
    {"model": "no-such-model", "prompt": "x"},
    {"model": MODEL},
    "{not json",
    {"model": MODEL, "messages": [{"role": "user", "content": " "}]},
]


def _malformed(rng: random.Random) -> tuple[str, str, object]:
    body = rng.choice(MALFORMED)
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    return "malformed", path, body


def _send(client: httpx.Client, url: str, job: tuple[str, str, object]) -> tuple[str, int, float, str]:
    kind, path, body = job
    start = time.perf_counter()
    try:
        if kind == "oversized-chunked":
            status = _chunked_upload(url, 50 * 1024 * 1024)
        elif kind == "oversized":
            r = client.post(url + path, content=b'{"prompt": "' + b"a" * (5 * 1024 * 1024) + b'"}',
                            headers={"content-type": "application/json"})
            status = r.status_code
        elif isinstance(body, str):
            status = client.post(url + path, content=body.encode(), headers={"content-type": "application/json"}
                                 ).status_code
        else:
            r = client.post(url + path, json=body)
            status = r.status_code
            if status == 503 and "retry-after" not in r.headers:
                return kind, status, time.perf_counter() - start, "503 without Retry-After"
    except httpx.HTTPError as exc:
        return kind, -1, time.perf_counter() - start, type(exc).__name__
    return kind, status, time.perf_counter() - start, ""


def _chunked_upload(url: str, total: int, chunk: int = 64 * 1024) -> int:
    """A chunked body of up to ``total`` bytes; stops at the server's first answer. Returns its status."""
    host, port = url.split("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        frame, sent = f"{chunk:x}\r\n".encode() + b"a" * chunk + b"\r\n", 0
        while sent < total and not select.select([sock], [], [], 0.01)[0]:
            try:
                sock.sendall(frame)
            except OSError:
                break
            sent += chunk
        head = sock.recv(4096).split(b"\r\n", 1)[0].split()
    print(f"  chunked upload: server answered after {sent / 2**20:.1f} MiB of 50 MiB", flush=True)
    return int(head[1]) if len(head) > 1 else -1


# ---- probes ------------------------------------------------------------------------------
def _poll(url: str, stop: threading.Event, out: list) -> None:
    with httpx.Client(timeout=5) as client:
        for _ in range(10_000):  # bounded; ends when the load ends
            if stop.is_set():
                return
            row = {"t": time.monotonic()}
            for route in ("health", "ready"):
                start = time.perf_counter()
                try:
                    r = client.get(f"{url}/{route}")
                    row[route], row[f"{route}_s"] = r.status_code, time.perf_counter() - start
                    if route == "ready" and r.status_code != 200:
                        row["why"] = json.dumps(r.json().get("models"))
                except httpx.HTTPError as exc:
                    row[route], row[f"{route}_s"] = type(exc).__name__, time.perf_counter() - start
            out.append(row)
            stop.wait(0.5)


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--queued", type=int, default=8,
                        help="max_queued_requests of the generator (16 ongoing + this < concurrency: 503s)")
    parser.add_argument("--seed", type=int, default=0)  # the request mix only
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    config = Path(tempfile.mkdtemp(prefix="dpsynth-soak-")) / "serve.json"
    config.write_text(json.dumps(_config(args.model, port, args.max_tokens, args.queued)))  # JSON is YAML

    start = time.perf_counter()
    proc = _cli("serve", "start", "--detach", "--config", str(config), "--num-cpus", "2", "--ready-timeout", "600")
    print(f"serve start --detach: exit {proc.returncode} after {time.perf_counter() - start:.1f} s: "
          f"{(proc.stdout or proc.stderr).strip().splitlines()[-1:]}", flush=True)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-2000:])
    status = _cli("serve", "status", timeout=60)
    print(f"serve status right after: exit {status.returncode}: {status.stdout.strip().splitlines()[:1]}", flush=True)

    try:
        rng = random.Random(args.seed)
        jobs = [_valid(rng, args.max_tokens) if rng.random() < 0.7 else _malformed(rng) for _ in range(args.requests)]
        for k, at in enumerate(rng.sample(range(len(jobs)), 5)):
            jobs[at] = ("oversized-chunked" if k == 0 else "oversized", "/v1/completions", None)
        probes: list[dict] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(url, stop, probes), daemon=True)
        poller.start()
        load_start = time.perf_counter()
        with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=args.concurrency)) as client, \
                ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(lambda job: _send(client, url, job), jobs))
        wall = time.perf_counter() - load_start
        time.sleep(3)  # /ready should come back once the load is gone
        stop.set()
        poller.join(10)
    finally:
        stopped = _cli("serve", "stop", timeout=120)
        print(f"serve stop: exit {stopped.returncode}: {stopped.stdout.strip()}", flush=True)

    _report(results, probes, wall)


def _report(results: list, probes: list[dict], wall: float) -> None:
    print(f"\n{len(results)} requests in {wall:.1f} s (one run)")
    for kind in ("valid", "malformed", "oversized", "oversized-chunked"):
        codes = Counter(status for k, status, _, _ in results if k == kind)
        print(f"  {kind:18s} {dict(sorted(codes.items(), key=lambda kv: str(kv[0])))}")
    # Under overload a valid request may be shed (503 + Retry-After) or cut at request_timeout_s (504).
    expected = {"valid": {200, 503, 504}, "malformed": {400, 404, 422}, "oversized": {413},
                "oversized-chunked": {413}}
    unexpected = Counter((k, s, note) for k, s, _, note in results if s not in expected[k] or note)
    print(f"unexpected answers: {sum(unexpected.values())} of {len(results)} requests (one run) "
          f"{dict(unexpected) if unexpected else ''}")
    ok = [lat for k, s, lat, _ in results if k == "valid" and s == 200]
    print(f"valid 200s: {len(ok)}; latency p50 {_pct(ok, 0.5):.2f} s, p99 {_pct(ok, 0.99):.2f} s, "
          f"max {max(ok, default=float('nan')):.2f} s " + note(f"{len(ok)} valid requests answered 200", 1))
    health = Counter(p.get("health") for p in probes)
    ready = Counter(p.get("ready") for p in probes)
    print(f"/health polls ({len(probes)}): {dict(health)}, slowest {max((p['health_s'] for p in probes), default=0):.2f} s")
    print(f"/ready polls ({len(probes)}): {dict(ready)}, slowest {max((p['ready_s'] for p in probes), default=0):.2f} s")
    reasons = Counter(p["why"] for p in probes if "why" in p)
    for why, count in reasons.most_common(3):
        print(f"  /ready 503 x{count}: {why[:160]}")
    last = probes[-1] if probes else {}
    print(f"after the load: /health {last.get('health')}, /ready {last.get('ready')}")
    shed = sum(1 for k, s, _, _ in results if k == "valid" and s == 503)
    late = sum(1 for k, s, _, _ in results if k == "valid" and s == 504)
    print(f"valid requests shed with 503 + Retry-After: {shed}; cut at the request timeout (504): {late}")


if __name__ == "__main__":
    main()
