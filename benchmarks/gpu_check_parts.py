"""The parts of the GPU check (``gpu_check.py`` runs each in its own process, under a time limit).

Every part drives the product's DP-SGD engine (``dpsynth_core.dpsgd.engine.DpSgdEngine`` and
``fsdp.FsdpDpSgdEngine``), never a replica of it, on a model with random weights built straight
on the device. Token ids come from a word-level tokenizer made here (the GPU machine has no
network and no tokenizer files); the weights and the "data" are public noise, so the fixed seeds
are fine. Each part writes its JSON after every measurement, so a part stopped at its time limit
still leaves what it measured.

    python benchmarks/gpu_check_parts.py env --json env.json
    python benchmarks/gpu_check_parts.py train --mode hooks --shape tiny --json hooks.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", message=".*[Bb]ackward hook.*")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning, module="torch")

from sample_size import note  # noqa: E402
from gpu_check_model import (  # noqa: E402 - after the warning filters
    MODES,
    SHAPES,
    TARGET_MODULES,
    device_and_dtype,
    examples,
    free,
    init_process_group,
    make_engine,
    random_base,
    sync,
)

PACKAGES = ("torch", "transformers", "peft", "accelerate", "opacus", "pydantic", "numpy", "tokenizers")
# Kept out of the DP-SGD import path, so the check needs no Ray, Serve, smartnoise or vLLM wheels.
HEAVY_MODULES = ("ray", "serving", "ray_jobs", "snsynth", "vllm", "sentence_transformers", "dp_accounting")

# name: (model config, sequence length, physical batch, tokens generated)
class Results:
    """A part's results, rewritten to disk after every update."""

    def __init__(self, path: str | None):
        self.path, self.data = path, {}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        if self.path:
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.data, fh, indent=1)
            os.replace(tmp, self.path)


def timed_steps(engine, device, steps: int, warmup: int) -> dict:
    """Tokens/s over ``steps`` logical steps after ``warmup``, and the peak GPU memory over them."""
    import torch

    for _ in range(warmup):
        engine.train_step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if engine.sampler.sampling_rate != 1.0:
        raise ValueError("timed_steps counts every row in every step: build the engine with sampling rate 1")
    tokens = steps * sum(len(t.prompt_ids) + len(t.target_ids) for t in engine.tokenized)
    start = time.perf_counter()
    for _ in range(steps):
        engine.train_step()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"tokens_per_s": tokens / seconds, "peak_gib": peak, "tokens": tokens, "seconds": seconds}


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


# --- parts -----------------------------------------------------------------------------------------
def part_env(args, out: Results) -> int:
    """GPU, versions, and the engine's import path (light: no Ray, Serve, smartnoise, vLLM)."""
    import importlib.metadata as md
    import platform

    missing = []
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    out.put("versions", versions)
    import torch

    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda,
               "capability": f"{props.major}.{props.minor}"}
    out.put("gpu", gpu)
    try:
        import dpsynth_core.dpsgd.engine  # noqa: F401
        import dpsynth_core.dpsgd.fsdp  # noqa: F401
        import opacus  # noqa: F401
    except ImportError as exc:
        missing.append(f"{exc.name} (imported by the engine)")
    heavy = sorted(m for m in HEAVY_MODULES if m in sys.modules)
    out.put("engine_imports_heavy_modules", heavy)
    out.put("missing", missing)
    if missing:
        print(f"gpu_check: missing {', '.join(missing)}: carry them as wheels (scripts/gpu_wheels.sh)", flush=True)
        return 3
    if heavy:
        print(f"gpu_check: the engine's import path pulls in {', '.join(heavy)}", flush=True)
        return 3
    if args.require_gpu and gpu is None:
        print("gpu_check: no GPU visible to torch", flush=True)
        return 3
    print(f"gpu_check env: {gpu['name'] if gpu else 'CPU'}; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    return 0


def part_train(args, out: Results) -> int:
    """One mode at the shape's physical batch (the ratio figures), then the largest batch that fits."""
    device, dtype = device_and_dtype(args.shape)
    spec = SHAPES[args.shape]
    seq, batch, vocab = spec["seq"], spec["batch"], spec["config"]["vocab_size"]
    started = time.perf_counter()
    out.put("mode", args.mode)
    out.put("setup", {"shape": args.shape, "device": device.type, "base_dtype": dtype, "adapter_dtype": "fp32",
                      "seq": seq, "physical_batch": batch, "lora_r": 16, "lora_targets": TARGET_MODULES,
                      "logical_batch": 2 * batch, "sampling_rate": 1.0})
    # q = 1 over 2 * batch rows: every logical step is exactly two full physical batches, in every mode
    rows = examples(2 * batch, seq, vocab)
    t0 = time.perf_counter()
    engine = make_engine(args.mode, args.shape, device, dtype, rows, batch)
    sync(device)
    out.put("build_s", time.perf_counter() - t0)
    out.put("at_batch", {"batch": batch, **timed_steps(engine, device, steps=args.steps, warmup=1)})
    at = out.data["at_batch"]
    print(f"gpu_check {args.mode}: batch {batch} x {seq}: {at['tokens_per_s']:.0f} tokens/s "
          + note(f"{at['tokens']} tokens over {args.steps} timed steps", 1), flush=True)
    if args.save_adapter:
        engine.save_adapter(args.save_adapter)
        out.put("adapter", args.save_adapter)
    engine = None
    free()
    largest, tried = None, []
    for b in args.search:
        if time.perf_counter() - started > args.search_budget_s:
            tried.append({"batch": b, "result": "not tried: time box"})
            break
        try:
            engine = make_engine(args.mode, args.shape, device, dtype, examples(b, seq, vocab), b)
            largest = {"batch": b, **timed_steps(engine, device, steps=1, warmup=1)}
            tried.append({"batch": b, "result": "fits"})
            out.put("largest_batch", largest)
        except Exception as exc:  # noqa: BLE001 - an OOM ends the search; anything else is a failure
            if not is_oom(exc):
                raise
            tried.append({"batch": b, "result": "out of memory"})
            out.put("search", tried)
            break
        finally:
            engine = None
            free()
        out.put("search", tried)
    out.put("search", tried)
    return 0


def part_generate(args, out: Results) -> int:
    """HF ``generate`` through the DP adapter: tokens/s at batch 1 and 32, unmerged, then merged."""
    import torch
    from peft import PeftModel

    device, dtype = device_and_dtype(args.shape)
    spec = SHAPES[args.shape]
    model, _ = random_base(args.shape, device, dtype)
    if args.adapter and Path(args.adapter, "adapter_config.json").is_file():
        model = PeftModel.from_pretrained(model, args.adapter)
        out.put("adapter", "DP-trained (hooks part)")
    else:  # the hooks part did not finish: an untrained adapter of the same shape costs the same
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGET_MODULES))
        out.put("adapter", "untrained (no DP-trained adapter was saved)")
    model.eval()
    model.config.use_cache = True
    new = spec["gen_tokens"]
    rows = {}
    for merged in (False, True):
        if merged:
            model = model.merge_and_unload()
        for batch in (1, 32):
            ids = torch.randint(4, spec["config"]["vocab_size"], (batch, 16), generator=torch.Generator().manual_seed(batch))
            ids = ids.to(device)
            with torch.no_grad():
                model.generate(input_ids=ids[:, :4], attention_mask=torch.ones_like(ids[:, :4]), max_new_tokens=2,
                               do_sample=True, pad_token_id=0)  # warm-up
                sync(device)
                start = time.perf_counter()
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=True, top_k=0, pad_token_id=0)
                sync(device)
            seconds = time.perf_counter() - start
            key = f"{'merged' if merged else 'unmerged'}_batch{batch}"
            rows[key] = {"tokens_per_s": (gen.shape[1] - ids.shape[1]) * batch / seconds, "new_tokens": new,
                         "batch": batch}
            out.put("generation", rows)
            print(f"gpu_check generate {key}: {rows[key]['tokens_per_s']:.0f} tokens/s "
                  + note(f"{batch} rows x {new} new tokens", 1), flush=True)
    return 0


def part_profile(args, out: Results) -> int:
    """Where a logical step's time goes, per mode (``--modes``): torch.profiler over one step after a
    warm-up, the top operators by self device time and by self CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    device, dtype = device_and_dtype(args.shape)
    spec = SHAPES[args.shape]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for mode in args.modes.split(","):
        if mode == "fsdp2":
            init_process_group(device)
        engine = make_engine(mode, args.shape, device, dtype, examples(2 * spec["batch"], spec["seq"],
                                                                         spec["config"]["vocab_size"]), spec["batch"])
        engine.train_step()
        sync(device)
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            engine.train_step()
            sync(device)
        wall = time.perf_counter() - start
        events = prof.key_averages()
        device_key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        top = lambda key: [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3}  # noqa: E731
                           for e in sorted(events, key=lambda e: -getattr(e, key))[:15]]
        busy = sum(getattr(e, device_key) for e in events) / 1e6
        out.put(mode, {"step_wall_s": wall, "device_busy_s": busy, "top_device": top(device_key),
                       "top_cpu": top("self_cpu_time_total")})
        print(f"gpu_check profile {mode}: step {wall:.3f} s, device busy {busy:.3f} s "
              + note("one profiled logical step after one warm-up step", 1), flush=True)
        print(events.table(sort_by=device_key if device.type == "cuda" else "self_cpu_time_total", row_limit=12),
              flush=True)
        engine = None
        free()
    return 0


def main(argv=None) -> int:
    from gpu_check_correctness import part_correctness

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["env", "correctness", "train", "generate", "profile"])
    ap.add_argument("--json", default=None, help="results file (rewritten after every measurement)")
    ap.add_argument("--shape", choices=["7b", "tiny"], default="tiny")
    ap.add_argument("--mode", choices=MODES, default="hooks")
    ap.add_argument("--steps", type=int, default=3, help="timed logical steps (two physical batches each)")
    ap.add_argument("--search", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                    help="physical batches to try, in order, until one runs out of memory")
    ap.add_argument("--search-budget-s", type=float, default=60.0, help="no new batch is tried after this")
    ap.add_argument("--save-adapter", default=None, help="train: save the adapter here (for the generate part)")
    ap.add_argument("--adapter", default=None, help="generate: the adapter the hooks part saved")
    ap.add_argument("--require-gpu", action="store_true")
    ap.add_argument("--modes", default="nondp,hooks", help="profile: the modes to profile")
    args = ap.parse_args(argv)
    out = Results(args.json)
    parts = {"env": part_env, "correctness": part_correctness, "train": part_train, "generate": part_generate,
             "profile": part_profile}
    return parts[args.part](args, out)


if __name__ == "__main__":
    sys.exit(main())
