"""Cost of differential privacy in the DP-SGD LoRA engine: DP vs non-DP step time and peak memory.

    .venv/bin/python benchmarks/dpsgd_overhead.py [--quick] [--out results.json]

What is compared. Both sides run ``DpSgdEngine.train_step`` -- the per-step code that
``dpsynth train`` runs (Poisson sampling, physical batches, per-row target-only loss, flattened
gradient, noise, AdamW on the LoRA weights). The DP side uses the clipper named by ``--modes``
(opacus ``hooks`` or ``ghost``) and noise multiplier 1.0. The non-DP side is the same engine with
the clipper replaced by a plain backward that sums the batch gradient (no per-sample work, no
clipping) and noise multiplier 0. Same model, same LoRA (r=8 on q_proj/v_proj, the config
default), same logical batch, same physical batch.

Workload. ``batch`` records of exactly ``--seq`` tokens each (prompt + target, truncated). The
training set holds exactly ``batch`` records, so the Poisson rate is q = 1 and every logical
batch is the full ``batch`` (a Poisson batch of varying size would add noise to step times).
Privacy accounting (noise calibration, the epsilon curve) is per run, not per step, and is left out.

Time. All engines of one (model, batch) live in one process and their steps are interleaved
(round-robin, order rotated every round), so the load of the shared machine hits DP and non-DP
alike; the figure is the median over ``--repeats`` timed steps after ``--warmup`` steps.

Memory. Peak resident memory of the training step: each (model, batch, mode) runs in a fresh
subprocess that builds the engine (model loaded), resets the kernel's high-water mark
(``/proc/self/clear_refs``), runs ``--mem-steps`` steps and reads ``VmHWM`` from
``/proc/self/status``; the figure is VmHWM minus the resident size just before the steps, i.e.
what training adds on top of the loaded model (activations, logits, per-sample gradients or
norms, optimizer state, allocator slack). Where clear_refs is not available it falls back to
``ru_maxrss``, which also counts the load peak. Ratios are DP / non-DP.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sample_size import note

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NON_DP = "none"
FULL_MODELS = ["tiny-llama", "smollm2-135m-instruct"]
SHORT = {"tiny-llama": "tiny-llama", "smollm2-135m-instruct": "SmolLM2-135M"}

# Target from issue 3 (CPU, LoRA).
TIME_TARGET, MEM_TARGET = 1.3, 1.2

_WORDS = ("cells protein expression genome sequencing mutation pathway neuron receptor signal "
          "model analysis cohort variant tissue enzyme binding structure membrane kinase").split()


# --- workload -------------------------------------------------------------------------------------
def make_examples(n: int, seq: int):
    """``n`` records whose prompt + target is longer than ``seq`` tokens (truncated to exactly ``seq``)."""
    from dpsynth_core.dpsgd import TrainExample

    out = []
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(seq * 2)]
        out.append(TrainExample(f"Category: topic {i % 5}\nAbstract: ", " ".join(words)))
    return out


def non_private_clipper(model, max_grad_norm: float):
    """The non-DP baseline: the batch gradient summed by one ordinary backward, no clipping."""
    from dpsynth_core.dpsgd.clipping import BatchGradientSum

    return BatchGradientSum(model, max_grad_norm)


def build_engine(model: str, batch: int, mode: str, seq: int, physical: int):
    from dpsynth_core.dpsgd import DpSgdConfig
    from dpsynth_core.dpsgd.engine import DpSgdEngine

    config = DpSgdConfig(
        model=model, epsilon=1.0, steps=1000, expected_batch_size=batch, physical_batch_size=physical,
        clipping=mode if mode != NON_DP else "hooks", max_seq_len=seq, sampling_seed=0, device="cpu",
    )
    engine = DpSgdEngine(
        make_examples(batch, seq), config,
        noise_multiplier=0.0 if mode == NON_DP else 1.0, sampling_seed=0,
        clipper_factory=non_private_clipper if mode == NON_DP else None,
    )
    lengths = {len(r.prompt_ids) + len(r.target_ids) for r in engine.tokenized}
    assert lengths == {seq}, f"rows are not all {seq} tokens: {sorted(lengths)}"
    return engine


def close_engine(engine) -> None:
    module = engine.clipper.module
    if hasattr(module, "_close"):
        module._close()  # remove opacus hooks


# --- memory: one fresh process per configuration ------------------------------------------------------
def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def memory_worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    engine = build_engine(spec["model"], spec["batch"], spec["mode"], spec["seq"], spec["physical"])
    gc.collect()
    before_kb = _status_kb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM after clear_refs"
    except OSError:
        method = "ru_maxrss (includes the load peak)"
    t0 = time.perf_counter()
    for _ in range(spec["steps"]):
        engine.train_step()
    elapsed = time.perf_counter() - t0
    peak_kb = _status_kb("VmHWM") if method.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rss_before_mb": before_kb / 1024, "peak_mb": peak_kb / 1024, "delta_mb": (peak_kb - before_kb) / 1024,
            "method": method, "seconds": elapsed}


def measure_memory(spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--memory-worker", json.dumps(spec)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker failed for {spec}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- time: engines of one (model, batch) interleaved in this process -----------------------------
def measure_time(model: str, batch: int, modes: list[str], seq: int, physical: int, warmup: int, repeats: int) -> dict:
    engines = {m: build_engine(model, batch, m, seq, physical) for m in [NON_DP, *modes]}
    times: dict[str, list[float]] = {m: [] for m in engines}
    order = list(engines)
    try:
        for r in range(warmup + repeats):
            k = r % len(order)
            for m in order[k:] + order[:k]:  # rotate so no mode always runs first
                t0 = time.perf_counter()
                engines[m].train_step()
                dt = time.perf_counter() - t0
                if r >= warmup:
                    times[m].append(dt)
    finally:
        for e in engines.values():
            close_engine(e)
        del engines
        gc.collect()
    return {m: {"median": statistics.median(t), "all": t} for m, t in times.items()}


# --- report -------------------------------------------------------------------------------------------
def render_table(rows: list[dict]) -> str:
    """The table, each row with its timed steps per side; ratios are DP over the non-DP engine (the baseline)."""
    head = ("| model | batch | mode | timed steps per side | non-DP s/step | DP s/step | time ratio | non-DP mem (MB) "
            "| DP mem (MB) | mem ratio |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {SHORT.get(r['model'], r['model'])} | {r['batch']} | {r['mode']} | {len(r['dp_times'])} | "
            f"{r['nondp_s']:.3f} | {r['dp_s']:.3f} | "
            f"{r['time_ratio']:.2f} | {r['nondp_mem_mb']:.0f} | {r['dp_mem_mb']:.0f} | {r['mem_ratio']:.2f} |"
        )
    seq = sorted({r["seq"] for r in rows})
    lines.append(note(f"the timed steps per side (median s/step) of batch records of {'/'.join(map(str, seq))} tokens; "
                      "memory: one fresh process per side and row", 1,
                      "the same engine without DP (ratios are DP / non-DP)"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(FULL_MODELS))
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--modes", default="hooks,ghost")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--physical", type=int, default=None,
                    help="physical batch size (default: the DpSgdConfig default; capped at the logical batch)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per engine (median reported)")
    ap.add_argument("--mem-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny-llama only, 2 timed steps (a few minutes on 2 busy cores)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows and settings as JSON")
    ap.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_worker:
        print(json.dumps(memory_worker(json.loads(args.memory_worker))))
        return 0

    import torch

    from dpsynth_core.dpsgd import DpSgdConfig

    torch.set_num_threads(args.threads)
    if args.quick:
        args.models, args.repeats = "tiny-llama", 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    default_physical = DpSgdConfig.model_fields["physical_batch_size"].default
    started = time.time()
    load_before = os.getloadavg()

    def write_json(done: bool) -> None:
        if not args.out:
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "complete": done,
            "settings": {"seq": args.seq, "warmup": args.warmup, "repeats": args.repeats, "mem_steps": args.mem_steps,
                         "threads": args.threads, "lora": "config default (r=8, alpha=16, q_proj+v_proj)",
                         "noise_multiplier_dp": 1.0, "torch": torch.__version__, "machine": platform.machine(),
                         "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_now": os.getloadavg(),
                         "wall_s": time.time() - started, "argv": sys.argv[1:]},
            "targets": {"time_ratio": TIME_TARGET, "mem_ratio": MEM_TARGET},
            "rows": rows,
            "table_markdown": render_table(rows),
        }, indent=1), encoding="utf-8")

    rows = []
    for model in models:
        for batch in batches:
            physical = min(batch, args.physical or default_physical)
            t = measure_time(model, batch, modes, args.seq, physical, args.warmup, args.repeats)
            print(f"# {model} batch {batch} s/step: " + ", ".join(f"{m} {v['median']:.3f} {[round(x, 2) for x in v['all']]}"
                  for m, v in t.items()), file=sys.stderr, flush=True)
            mem = {}
            for m in [NON_DP, *modes]:
                spec = {"model": model, "batch": batch, "mode": m, "seq": args.seq, "physical": physical,
                        "threads": args.threads, "steps": args.mem_steps}
                mem[m] = measure_memory(spec)
            for m in modes:
                rows.append({
                    "model": model, "batch": batch, "physical_batch": physical, "seq": args.seq, "mode": m,
                    "nondp_s": t[NON_DP]["median"], "dp_s": t[m]["median"],
                    "time_ratio": t[m]["median"] / t[NON_DP]["median"],
                    "nondp_mem_mb": mem[NON_DP]["delta_mb"], "dp_mem_mb": mem[m]["delta_mb"],
                    "mem_ratio": mem[m]["delta_mb"] / mem[NON_DP]["delta_mb"],
                    "nondp_times": t[NON_DP]["all"], "dp_times": t[m]["all"],
                    "nondp_peak_rss_mb": mem[NON_DP]["peak_mb"], "dp_peak_rss_mb": mem[m]["peak_mb"],
                    "mem_method": mem[m]["method"],
                })
            print(f"# done {model} batch {batch} ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
            write_json(False)  # partial results survive an interrupted run

    print(render_table(rows))
    print(f"\nTarget (CPU, LoRA): time ratio <= {TIME_TARGET}, memory ratio <= {MEM_TARGET}. "
          f"Memory = peak RSS added by training steps over the loaded model (fresh process per row).")
    write_json(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
