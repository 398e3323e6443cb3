"""Generation engines compared in-process: HF batched ``generate`` vs vLLM, same prompts, same model.

    .venv/bin/python benchmarks/generation_engines.py \
        [--models smollm2-135m-instruct gemma3-270m] [--prompts 32 128] [--new-tokens 64] \
        [--backends hf vllm] [--hf-batch-size 32] [--kv-cache-gib 4] [--adapter] [--two-plms | --lora-modes] \
        [--json out.json]

For each model: load each engine, one small warm-up call, then ``--prompts`` prompts submitted
at once, each asking for ``--new-tokens`` sampled tokens (temperature 1). Reported: engine load time, generated tokens/s
(tokens counted by re-encoding the returned texts with the model's tokenizer, the same way for both
backends), p50/p99 latency per prompt (time from submission of the batch until that prompt's
completion: HF finishes a whole batch at a time, vLLM each sequence as it ends). HF runs in the
project's float32, vLLM in dtype auto (dpsynth_core.engines.vllm_cpu: float32 on an AVX2 host) with ``enforce_eager``.

``--adapter``: both backends serve a LoRA adapter in the DP-SGD adapter's shape (random weights), each the way
the product does by default (``EngineConfig.lora_mode``), as a generating stage after DP-SGD would.

``--two-plms``: loads both models in vLLM in one process (as WASP / Aug-PE with two PLMs would),
each with ``--kv-cache-gib`` of KV cache, runs ``--prompts`` prompts through each, and reports the
peak resident memory of this process and the engine processes it started.

``--lora-modes``: vLLM with a LoRA adapter on the first model (r 8 on q_proj/v_proj, the DP-SGD adapter's
shape, random weights), served through vLLM's LoRA kernels and as a merged copy (``EngineConfig.lora_mode``),
both loaded at once, the order alternating; the table's last column is merged/LoRA tokens/s.

In-process; the same comparison through Ray Serve over HTTP is benchmarks/serve_engines.py.
Both backends of a model are loaded at once and each prompt count runs on both, the order
alternating, so a ratio's two numbers share the machine's state.
The machine may be shared: the load average is printed before and after; read ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

from sample_size import note

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TOPICS = ["protein folding in yeast", "gene expression in mouse neurons", "CRISPR screening in human cells",
          "bacterial growth models", "tumour microenvironments", "plant drought response",
          "viral evolution", "sleep and memory consolidation"]
TASKS = ["Write a short abstract about {}.", "Describe a new study of {}.", "Summarise recent findings on {}.",
         "Explain an experiment on {}."]


def make_prompts(count: int) -> list[str]:
    base = [t.format(topic) for topic in TOPICS for t in TASKS]
    return [base[i % len(base)] for i in range(count)]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class PeakMemory:
    """Peak resident memory (GiB) of this process plus its children, sampled every 0.2 s."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def current(self) -> float:
        total = 0
        for proc in [self.process, *self.process.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except Exception:  # a child that just exited
                pass
        return total / 2**30

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.current())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


def engine_config(model: str, backend: str, args):
    from dpsynth_core.engines import EngineConfig

    return EngineConfig(model=model, backend=backend, hf_batch_size=args.hf_batch_size,
                        kv_cache_gib=args.kv_cache_gib, max_num_seqs=max(args.prompts),
                        max_model_len=args.max_model_len, torch_threads=os.cpu_count())


def sampling(args, chat: bool):
    from dpsynth_core.engines import SamplingParams

    return SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0, seed=0, chat=chat)


def measure(engine, model: str, count: int, args, load_s: float, label: str | None = None) -> dict:
    chat = "instruct" in model
    start = time.perf_counter()
    batch = engine.run(make_prompts(count), sampling(args, chat))
    wall = time.perf_counter() - start
    # re-encoded texts, the same count for both backends (HF's engine can only count this way)
    tokens = sum(len(engine.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in batch.texts)
    row = {
        "model": model, "backend": label or engine.backend, "prompts": count, "new_tokens": args.new_tokens,
        "load_s": round(load_s, 1),
        "wall_s": round(wall, 1), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
        "p50_s": round(percentile(batch.latencies_s, 0.5), 1),
        "p99_s": round(percentile(batch.latencies_s, 0.99), 1), "load_avg": load_average(),
    }
    print(json.dumps(row), flush=True)
    return row


def bench_model(model: str, args) -> list[dict]:
    """Every backend loaded at once, then each prompt count on each backend, the order alternating
    (hf, vllm, then vllm, hf): the pair of a ratio shares the machine's state."""
    from dpsynth_core.engines import SamplingParams, load_engine

    import tempfile

    engines, load_s = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        adapter = random_adapter(model, tmp) if args.adapter else None
        try:
            for backend in args.backends:
                config = engine_config(model, backend, args).model_copy(update={"adapter_dir": adapter})
                start = time.perf_counter()
                engines[backend] = load_engine(config)
                load_s[backend] = time.perf_counter() - start
                engines[backend].run(make_prompts(2), SamplingParams(max_new_tokens=4, seed=0,
                                                                     chat="instruct" in model))
            rows = []
            for i, count in enumerate(args.prompts):
                order = args.backends if i % 2 == 0 else args.backends[::-1]
                rows += [measure(engines[b], model, count, args, load_s[b]) for b in order]
            return rows
        finally:
            for engine in engines.values():
                engine.close()


def two_plms(args) -> dict:
    from dpsynth_core.engines import load_engine

    engines = []
    with PeakMemory() as memory:
        try:
            for model in args.models:
                engines.append(load_engine(engine_config(model, "vllm", args)))
            loaded = memory.current()
            for engine, model in zip(engines, args.models):
                engine.run(make_prompts(max(args.prompts)), sampling(args, "instruct" in model))
        finally:
            for engine in engines:
                engine.close()
    return {"models": args.models, "prompts_each": max(args.prompts), "new_tokens": args.new_tokens, "runs": "one run",
            "kv_cache_gib_each": args.kv_cache_gib,
            "rss_after_load_gib": round(loaded, 2), "peak_rss_gib": round(memory.peak, 2)}


def random_adapter(model: str, out: str) -> str:
    """A LoRA adapter in the DP-SGD adapter's shape with random B (peft's default B = 0 is the base model)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.models import load_causal_lm

    base, _ = load_causal_lm(model)
    torch.manual_seed(0)  # benchmark weights, not DP randomness
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(out)
    return out


def lora_modes(args) -> list[dict]:
    import tempfile

    from dpsynth_core.engines import load_engine

    model = args.models[0]
    engines, load_s = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        adapter = random_adapter(model, tmp)
        try:
            for mode in ("lora", "merged"):
                config = engine_config(model, "vllm", args).model_copy(update={"adapter_dir": adapter, "lora_mode": mode})
                start = time.perf_counter()
                engines[mode] = load_engine(config)
                load_s[mode] = time.perf_counter() - start
                engines[mode].run(make_prompts(2), sampling(args, "instruct" in model))
            rows = []
            for i, count in enumerate(args.prompts):
                for mode in ("lora", "merged") if i % 2 == 0 else ("merged", "lora"):
                    rows.append(measure(engines[mode], model, count, args, load_s[mode], f"vllm {mode}"))
            return rows
        finally:
            for engine in engines.values():
                engine.close()


def lora_table(rows: list[dict]) -> str:
    lines = ["| model | serving | prompts | load s | wall s | tokens | tokens/s | merged/LoRA |", "|---" * 8 + "|"]
    lora = {r["prompts"]: r["tokens_per_s"] for r in rows if r["backend"] == "vllm lora"}
    for r in rows:
        ratio = f"{r['tokens_per_s'] / lora[r['prompts']]:.1f}x" if r["backend"] == "vllm merged" else ""
        lines.append(f"| {r['model']} | {r['backend']} | {r['prompts']} | {r['load_s']} | {r['wall_s']} | "
                     f"{r['tokens']} | {r['tokens_per_s']} | {ratio} |")
    lines.append(note(f"the row's prompts x {_tokens(rows)} sampled tokens", 1,
                      "vLLM's LoRA kernels (merged/LoRA: the merged copy's tokens/s over the LoRA row's, same prompts)"))
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| model | backend | prompts | load s | wall s | tokens | tokens/s | p50 s | p99 s | vLLM/HF |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    hf = {(r["model"], r["prompts"]): r["tokens_per_s"] for r in rows if r["backend"] == "hf"}
    for r in rows:
        base = hf.get((r["model"], r["prompts"]))
        ratio = f"{r['tokens_per_s'] / base:.1f}x" if r["backend"] == "vllm" and base else ""
        lines.append(f"| {r['model']} | {r['backend']} | {r['prompts']} | {r['load_s']} | {r['wall_s']} | "
                     f"{r['tokens']} | {r['tokens_per_s']} | {r['p50_s']} | {r['p99_s']} | {ratio} |")
    lines.append(note(f"the row's prompts x {_tokens(rows)} sampled tokens", 1,
                      "HF (vLLM/HF: vLLM's tokens/s over the HF row of the same model and prompt count)"))
    return "\n".join(lines)


def _tokens(rows: list[dict]) -> str:
    return "/".join(str(t) for t in sorted({r.get("new_tokens") for r in rows if r.get("new_tokens")})) or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--prompts", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--adapter", action="store_true", help="both backends serve a DP-shaped LoRA adapter")
    parser.add_argument("--two-plms", action="store_true", help="only the two-PLM memory measurement")
    parser.add_argument("--lora-modes", action="store_true",
                        help="only vLLM with a LoRA adapter: LoRA kernels vs a merged copy")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    print(f"load average before: {load_average()} ({os.cpu_count()} CPUs)", flush=True)
    if args.two_plms:
        result = two_plms(args)
        print(json.dumps(result))
    elif args.lora_modes:
        result = lora_modes(args)
        print(lora_table(result))
    else:
        result = [row for model in args.models for row in bench_model(model, args)]
        print(table(result))
    print(f"load average after: {load_average()}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":  # vLLM spawns its engine process: building it at import time would fail
    main()
