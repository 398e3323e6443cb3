"""DPFairLLM row generation on HF vs vLLM: the same rows wanted from the same DP-shaped adapter, one run each.

    .venv/bin/python benchmarks/dpfair_generation_engines.py [--config configs/dpfair_demo.yaml] [--rows 200] \
        [--order hf vllm] [--json out.json]

HF is the generate stage's own path (``stages_model._generate``: the base with the peft adapter, rows under the
constrained logits processor); vLLM is ``open_row_generator(..., engine="vllm")`` (the adapter merged, rows under
the row regex as structured outputs). Both use the config's public schema restricted to its columns (dpfair_demo's
all have public bounds, so no private data is read), its serialization and generation batch size, with
fairness-aware generation off: vLLM cannot run it (it needs the full logits), so a run with it stays on HF whatever
this says. The adapter is random (``generation_engines.random_adapter``: r 8 on q_proj / v_proj, the DP-SGD
adapter's shape), a timing stand-in for a trained one. Each engine: load (timed), a 2-row warm-up, then ``--rows``
rows (timed); the engines run in ``--order``, one after the other, each loaded only for its turn.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from sample_size import note

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def settings_and_serializer(config: str, rows: int):
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.run_schema import public_schema
    from dpsynth_core.tabular.serialize import RowSerializer

    cfg = load_dpfair_config(config)
    schema = public_schema(cfg)
    schema.require_resolved()  # every column's domain public: nothing estimated from private rows
    s = cfg.serialization
    ser = RowSerializer(schema, separator=s.separator, prefix=s.prefix, random_order=s.random_order,
                        seed=cfg.training.seed)
    g = cfg.generation.model_copy(update={"num_rows": rows, "fairness": cfg.generation.fairness.model_copy(
        update={"enabled": False}), "calibrate": cfg.generation.calibrate.model_copy(update={"enabled": False})})
    return cfg, ser, g


def run_engine(engine: str, cfg, ser, g, adapter: str) -> dict:
    from pathlib import Path

    from dpsynth_core.config.placement import resolve_placement
    from dpsynth_core.engines.adapters import load_hf_model
    from dpsynth_core.tabular.generation import generate_rows, open_row_generator

    start = time.perf_counter()
    if engine == "hf":  # what the generate stage does
        model, tok = load_hf_model(cfg.training.model, Path(adapter), resolve_placement(g.device, g.dtype))
    else:
        model, tok = open_row_generator(cfg.training.model, Path(adapter), g, engine="vllm"), None
    load_s = time.perf_counter() - start
    try:
        generate_rows(model, tok, ser, g.model_copy(update={"num_rows": 2}), progress=False)  # warm-up
        start = time.perf_counter()
        result = generate_rows(model, tok, ser, g, progress=False)
        wall = time.perf_counter() - start
    finally:
        if hasattr(model, "close"):
            model.close()
    row = {"engine": engine, "rows_wanted": g.num_rows, "rows": len(result.frame), "attempted": result.attempted,
           "invalid": result.invalid, "batch_size": g.batch_size, "load_s": round(load_s, 1), "wall_s": round(wall, 1),
           "rows_per_s": round(len(result.frame) / wall, 2), "load_avg": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    print(json.dumps(row), flush=True)
    return row


def summary(rows: list[dict]) -> str:
    """Wall time per engine with its rows, and vLLM's speed-up over HF (the generate stage's engine)."""
    by = {r["engine"]: r for r in rows}
    lines = [f"{r['engine']}: {r['rows']} rows ({r['attempted']} attempted, {r['invalid']} invalid) in {r['wall_s']} s "
             f"+ load {r['load_s']} s " + note(f"{r['rows']} rows", 1) for r in rows]
    if {"hf", "vllm"} <= set(by):
        order = " then ".join(r["engine"] for r in rows)
        lines.append(f"vLLM / HF generation wall time: {by['hf']['wall_s'] / by['vllm']['wall_s']:.1f}x faster; with "
                     f"load: {(by['hf']['wall_s'] + by['hf']['load_s']) / (by['vllm']['wall_s'] + by['vllm']['load_s']):.1f}x "
                     + note(f"{by['vllm']['rows']} rows each", 1, "HF, the generate stage's engine") + f", order {order}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/dpfair_demo.yaml")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--order", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()

    from dpsynth_core.quiet import quiet_process

    quiet_process()
    from generation_engines import random_adapter

    cfg, ser, g = settings_and_serializer(args.config, args.rows)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        adapter = random_adapter(cfg.training.model, tmp)
        rows = [run_engine(engine, cfg, ser, g, adapter) for engine in args.order]
    print(summary(rows), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":  # vLLM spawns its engine process: building it at import time would fail
    main()
