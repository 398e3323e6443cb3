"""One WASP iteration with two PLMs on HF vs vLLM: ``dpsynth run wasp`` end to end, one run per engine.

    .venv/bin/python benchmarks/wasp_engines.py [--config configs/wasp_demo.yaml] [--order hf vllm] [--json out.json]

The config's PLMs, data, N and prompts, with ``iterations: 1`` (a zero-shot round, then one iteration: the DP vote and
a contrastive round), ``evaluate: false`` and ``baselines: false``, and every PLM's ``engine`` set to the engine
measured. Each run is a real, private run (its own ledger, OS-entropy noise) in a fresh directory; reported: the
command's wall time (Ray start, engine loads and the release included) and, from its metrics.json, the seconds of
the zero-shot round and of the iteration (vote + generation) with the samples each generated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from sample_size import note


def config_for(base: dict, engine: str, out: Path) -> Path:
    cfg = {**base, "iterations": 1, "evaluate": False, "baselines": False, "output_dir": str(out / engine),
           "plms": [{**p, "engine": engine} for p in base["plms"]]}
    path = out / f"wasp_{engine}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_engine(engine: str, config: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dpsynth", "run", "wasp", "--config", str(config)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{engine}: dpsynth run wasp exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    cfg = yaml.safe_load(config.read_text())
    metrics = json.loads(next(Path(cfg["output_dir"]).rglob("metrics.json")).read_text())
    zero, it = metrics["history"][0], metrics["history"][1]
    row = {"engine": engine, "plms": metrics["plms"], "wall_s": round(wall, 1), "run_seconds": metrics["run_seconds"],
           "zero_shot_s": zero["generate_seconds"], "zero_shot_samples": zero["generated"],
           "iteration_s": round(it["vote_seconds"] + it["generate_seconds"], 2), "iteration_vote_s": it["vote_seconds"],
           "iteration_samples": it.get("generated"), "load_avg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
           "stdout_tail": proc.stdout.strip().splitlines()[-3:], "stderr_lines": len(proc.stderr.strip().splitlines())}
    print(json.dumps(row), flush=True)
    return row


def summary(rows: list[dict]) -> str:
    lines = [f"{r['engine']}: iteration 1 (vote + generation) {r['iteration_s']} s, zero-shot round {r['zero_shot_s']} s, "
             f"whole command {r['wall_s']} s " + note(f"{r['iteration_samples']} samples in the iteration, "
                                                      f"{r['zero_shot_samples']} zero-shot, {len(r['plms'])} PLMs", 1)
             for r in rows]
    by = {r["engine"]: r for r in rows}
    if {"hf", "vllm"} <= set(by):
        hf, vllm = by["hf"], by["vllm"]
        lines.append(f"HF / vLLM: iteration {hf['iteration_s'] / vllm['iteration_s']:.1f}x, whole command "
                     f"{hf['wall_s'] / vllm['wall_s']:.1f}x " + note(f"{vllm['iteration_samples']} samples per iteration",
                                                                   1, "HF (times are HF's over vLLM's)")
                     + ", order " + " then ".join(r["engine"] for r in rows))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/wasp_demo.yaml")
    parser.add_argument("--order", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_engine(engine, config_for(base, engine, Path(tmp))) for engine in args.order]
    print(summary(rows), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
