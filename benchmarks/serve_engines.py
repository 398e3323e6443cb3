"""Generation engines through Ray Serve over HTTP: HF batched replicas vs vLLM, same requests.

    .venv/bin/python benchmarks/serve_engines.py [--model smollm2-135m-instruct] [--requests 32 128] \
        [--new-tokens 64] [--vllm-app ray_llm|dpsynth] [--adapter] [--pairs 2] [--json out.json]

Two Serve apps on one HTTP port, both loaded before anything is timed: ``/hf`` is the dpsynth app
with an HF replica (``@serve.batch``, ``--hf-batch-size`` rows per forward), ``/vllm`` is vLLM —
Ray's own OpenAI app (``app: ray_llm``, ray.serve.llm) or the dpsynth app with a vLLM replica
(``--vllm-app dpsynth``). For each request count, that many single-prompt ``/v1/completions``
requests (``--new-tokens`` sampled tokens each, temperature 1) go out at once; tokens/s counts the
servers' ``usage.completion_tokens``, latency is per request. Counts alternate the order (hf, vllm,
then vllm, hf) so a ratio's two numbers share the machine's state; the load average is printed.
``--pairs N`` repeats every count N times (the order alternating on every repeat) and prints each ratio.

``--adapter``: both apps serve a LoRA adapter in the DP-SGD adapter's shape (random weights), merged into the base
weights as the product does (``merge_adapter: true``). Ray starts as ``dpsynth`` commands start it
(``ray_jobs.cluster.ensure_ray``: the quiet environment and the worker setup hook), so library notices stay off
the screen.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from generation_engines import load_average, make_prompts, percentile  # noqa: E402  (same prompts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_configs(args, port: int, adapter: str | None = None) -> dict:
    from serving.config import ServeConfig

    http = {"port": port}
    vllm_kwargs = {"max_num_seqs": args.vllm_max_num_seqs or max(args.requests)}
    limits = {"request_timeout_s": 3600, "max_tokens_per_request": 10**6}
    hf = ServeConfig(app_name="bench-hf", http={**http, "route_prefix": "/hf"}, limits=limits, models=[{
        "name": "m", "model": args.model, "adapter_dir": adapter, "backend": "hf", "max_batch_size": args.hf_batch_size,
        "max_ongoing_requests": max(args.requests), "torch_threads": os.cpu_count(), "num_cpus": 1}])
    vllm = ServeConfig(app=args.vllm_app, app_name="bench-vllm", http={**http, "route_prefix": "/vllm"}, limits=limits,
                       models=[{"name": "m", "model": args.model, "adapter_dir": adapter, "backend": "vllm",
                                "kv_cache_gib": args.kv_cache_gib, "max_ongoing_requests": max(args.requests),
                                "dtype": args.vllm_dtype,
                                "num_cpus": 1, "vllm_engine_kwargs": vllm_kwargs}])
    return {"hf": hf, "vllm": vllm}


def complete(url: str, prompt: str, new_tokens: int, seed: int) -> tuple[float, int]:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": new_tokens, "temperature": 1.0,
                       "top_p": 1.0, "seed": seed}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as response:
        usage = json.loads(response.read())["usage"]
    return time.perf_counter() - start, int(usage["completion_tokens"])


def measure(base: str, backend: str, count: int, args, repeat: int) -> dict:
    url = f"{base}/{backend}/v1/completions"
    prompts = make_prompts(count)
    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        results = list(pool.map(lambda i: complete(url, prompts[i], args.new_tokens, i), range(count)))
    wall = time.perf_counter() - start
    latencies, tokens = [r[0] for r in results], sum(r[1] for r in results)
    row = {"model": args.model, "backend": backend, "app": args.vllm_app if backend == "vllm" else "dpsynth",
           "adapter": "merged DP-shaped LoRA" if args.adapter else None, "repeat": repeat,
           "vllm_dtype": args.vllm_dtype if backend == "vllm" else None,
           "requests": count, "new_tokens": args.new_tokens, "wall_s": round(wall, 1), "tokens": tokens,
           "tokens_per_s": round(tokens / wall, 1), "p50_s": round(percentile(latencies, 0.5), 1),
           "p99_s": round(percentile(latencies, 0.99), 1), "load_avg": load_average()}
    print(json.dumps(row), flush=True)
    return row


def ratio_lines(rows: list[dict]) -> list[str]:
    """vLLM / HF tokens/s per request count and repeat, each with its sample size and its baseline (the HF app)."""
    lines = []
    for count in sorted({r["requests"] for r in rows}):
        repeats = sorted({r["repeat"] for r in rows if r["requests"] == count})
        for repeat in repeats:
            hf, vllm = (next(r for r in rows if r["backend"] == b and r["requests"] == count and r["repeat"] == repeat)
                        for b in ("hf", "vllm"))
            first = "HF first" if rows.index(hf) < rows.index(vllm) else "vLLM first"
            lines.append(f"{count} requests x {hf['new_tokens']} tokens, pair {repeat + 1} of {len(repeats)} "
                         f"({first}): vLLM {vllm['tokens_per_s']} / HF app {hf['tokens_per_s']} tokens/s = "
                         f"{vllm['tokens_per_s'] / hf['tokens_per_s']:.1f}x the HF app (baseline)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--vllm-max-num-seqs", type=int, help="vLLM's max_num_seqs (default: the largest count)")
    parser.add_argument("--vllm-app", choices=["ray_llm", "dpsynth"], default="ray_llm")
    parser.add_argument("--vllm-dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="vLLM's dtype (auto: the product's choice, bfloat16 where the CPU has it natively)")
    parser.add_argument("--adapter", action="store_true", help="both apps serve a merged DP-shaped LoRA adapter")
    parser.add_argument("--pairs", type=int, default=1, help="repeats of every count, the order alternating")
    parser.add_argument("--num-cpus", type=int, default=4, help="the local Ray's logical CPUs")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from dpsynth_core.quiet import quiet_process

    quiet_process()  # as the CLI's entry does, before Ray, transformers or vLLM are imported
    import tempfile

    from ray import serve

    from generation_engines import random_adapter
    from ray_jobs.cluster import ensure_ray
    from serving.app import deploy, http_url

    print(f"load average before: {load_average()} ({os.cpu_count()} CPUs)", flush=True)
    ensure_ray(num_cpus=args.num_cpus, env_vars={"HF_HUB_OFFLINE": "1"})  # as `dpsynth serve start` starts it
    with tempfile.TemporaryDirectory() as tmp:
        adapter = random_adapter(args.model, tmp) if args.adapter else None
        configs = serve_configs(args, free_port(), adapter)
        # Serve's controller and proxy log every deployment step at INFO: started here first with WARNING
        # (deploy keeps options already in force), so what reaches the screen is the benchmark's own lines
        serve.start(http_options={"host": "127.0.0.1", "port": configs["hf"].http.port},
                    logging_config={"log_level": "WARNING"})
        start = time.perf_counter()
        for config in configs.values():
            deploy(config)
        print(json.dumps({"deploy_s": round(time.perf_counter() - start, 1), "apps": 2, "runs": "one run"}), flush=True)
        base = http_url(configs["hf"]).rsplit("/hf", 1)[0]
        backends = list(configs)
        for backend in backends:  # warm-up: one short request each
            complete(f"{base}/{backend}/v1/completions", "Hello", 4, 0)
        rows = []
        for repeat in range(args.pairs):  # each count's order flips on every repeat, and between counts
            for i, count in enumerate(args.requests):
                order = backends if (repeat + i) % 2 == 0 else backends[::-1]
                rows += [measure(base, b, count, args, repeat) for b in order]
        for line in ratio_lines(rows):
            print(line, flush=True)
        print(f"load average after: {load_average()}", flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(rows, fh, indent=2)
        serve.shutdown()
    import ray

    ray.shutdown()


if __name__ == "__main__":  # vLLM spawns its engine process: building it at import time would fail
    main()
