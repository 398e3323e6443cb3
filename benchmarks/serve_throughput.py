"""Throughput of the Serve generation service vs one ``generate`` per request in sequence.

    .venv/bin/python benchmarks/serve_throughput.py [--requests 32] [--new-tokens 64] [--seq-requests 8]

1. Sequential baseline: SmolLM2 loaded in this process, ``model.generate`` per request, one at a
   time (``--seq-requests`` of them; throughput per request is constant so a subset suffices).
2. Serve: ``--requests`` concurrent HTTP requests (OpenAI ``/v1/completions``) of ``--new-tokens``
   tokens through one batched Generator replica; tokens/s and p50/p99 latency.
3. Bounded load test: ``--load-requests`` requests at ``--load-concurrency`` in flight, loopback
   only; counts errors.
The machine is shared, so timings are noisy: run it when the machine is quiet, read ratios.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from sample_size import note

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPTS = [
    "Write a short abstract about protein folding in yeast.",
    "Describe a study of gene expression in mouse neurons.",
    "Summarise a paper on CRISPR screening in human cells.",
    "Explain a computational model of bacterial growth.",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def sequential(model_name: str, n: int, new_tokens: int) -> dict:
    import torch

    from dpsynth_core.models import load_causal_lm

    torch.set_num_threads(2)
    model, tok = load_causal_lm(model_name)
    tokens, latencies = 0, []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        enc = tok(PROMPTS[i % len(PROMPTS)], return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=True, temperature=1.0,
                                 pad_token_id=tok.pad_token_id)
        tokens += out.shape[1] - enc["input_ids"].shape[1]
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    del model
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "p50": _pct(latencies, 0.5),
            "p99": _pct(latencies, 0.99), "errors": 0, "requests": n}


def http_burst(url: str, model: str, n: int, concurrency: int, new_tokens: int) -> dict:
    import httpx

    client = httpx.Client(base_url=url, timeout=900)

    def one(i: int):
        t0 = time.perf_counter()
        try:
            r = client.post("/v1/completions", json={"model": model, "prompt": PROMPTS[i % len(PROMPTS)],
                                                     "max_tokens": new_tokens, "temperature": 1.0})
            ok = r.status_code == 200
            used = r.json()["usage"]["completion_tokens"] if ok else 0
        except httpx.HTTPError:
            ok, used = False, 0
        return ok, used, time.perf_counter() - t0

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - start
    client.close()
    latencies = [r[2] for r in results]
    tokens = sum(r[1] for r in results)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "p50": _pct(latencies, 0.5),
            "p99": _pct(latencies, 0.99), "errors": sum(not r[0] for r in results), "requests": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seq-requests", type=int, default=8)
    parser.add_argument("--load-requests", type=int, default=500)
    parser.add_argument("--load-concurrency", type=int, default=32)
    parser.add_argument("--load-new-tokens", type=int, default=8)
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args()

    rows = {}
    print(f"sequential baseline: {args.seq_requests} requests x {args.new_tokens} tokens ...", flush=True)
    rows["sequential generate (1 process)"] = sequential(args.model, args.seq_requests, args.new_tokens)

    import ray
    from ray import serve

    from serving.app import deploy, http_url
    from serving.config import ServeConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    cfg = ServeConfig(app_name="dpsynth-bench", models=[{
        "name": "smollm2", "model": args.model, "max_batch_size": args.max_batch_size, "batch_wait_timeout_s": 0.1,
        "num_cpus": 1, "torch_threads": 2}], http={"port": _free_port()}, limits={"max_sequences": 1024})
    try:
        handle = deploy(cfg)
        url = http_url(cfg)
        http_burst(url, "smollm2", 2, 2, 4)  # warm-up
        print(f"serve: {args.requests} concurrent requests x {args.new_tokens} tokens ...", flush=True)
        rows[f"Serve, {args.requests} concurrent"] = http_burst(url, "smollm2", args.requests, args.requests,
                                                                 args.new_tokens)
        print(f"load test: {args.load_requests} requests, {args.load_concurrency} in flight ...", flush=True)
        rows[f"load test ({args.load_new_tokens} tok)"] = http_burst(
            url, "smollm2", args.load_requests, args.load_concurrency, args.load_new_tokens)
        stats = handle.stats.remote().result()
    finally:
        serve.shutdown()
        ray.shutdown()

    print(summary(rows, args.requests))
    print(f"replica batching: {stats}")


def summary(rows: dict, requests: int) -> str:
    """The table (each row with its requests: the sample size) and the speed-up against the sequential baseline."""
    lines = [f"\n{'run':34s} {'reqs':>5s} {'tokens':>7s} {'wall s':>8s} {'tok/s':>8s} {'p50 s':>7s} {'p99 s':>7s} "
             f"{'errors':>6s}"]
    for name, r in rows.items():
        lines.append(f"{name:34s} {r['requests']:5d} {r['tokens']:7d} {r['wall_s']:8.1f} {r['tok_s']:8.1f} "
                     f"{r['p50']:7.2f} {r['p99']:7.2f} {r['errors']:6d}")
    base = rows["sequential generate (1 process)"]
    burst = rows[f"Serve, {requests} concurrent"]
    lines.append(f"\nspeed-up (Serve batched / sequential tokens/s): {burst['tok_s'] / base['tok_s']:.2f}x (target >= 4x) "
                 + note(f"{burst['requests']} requests through Serve", 1,
                        f"sequential generate in one process, {base['requests']} requests"))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
