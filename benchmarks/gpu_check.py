"""The GPU check in one command: the product's DP-SGD engine on a Llama-7B-shaped model.

Runs the parts of ``gpu_check_parts.py`` one after another, each in its own process under a time
limit (a slow or hung part cannot eat the others' time, and each mode's peak memory is its own),
and writes, as the parts finish:

    OUT/gpu_check.json   every figure, the parts' status and the targets' verdicts
    OUT/gpu_check.md     the same as tables (docs/results/gpu.md takes them)

    python benchmarks/gpu_check.py --shape 7b --out $OUT      # on the GPU (scripts/gpu_check.sh)
    python benchmarks/gpu_check.py --shape tiny --out /tmp/x  # the CPU rehearsal's shape
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from sample_size import note

HERE = Path(__file__).resolve().parent
TARGET_TOKENS = 0.85  # DP tokens/s >= 0.85x non-DP
TARGET_MEMORY = 1.10  # DP peak memory <= 1.1x non-DP
SEARCH = "16,24,32,48,64,96,128"


def plan(shape: str, work: Path, search: str = SEARCH) -> list[tuple[str, list[str], int]]:
    """(name, arguments, time limit in s) of each part, in order."""
    adapter = str(work / "dp_adapter")
    train = lambda mode, *extra: (f"train:{mode}", ["train", "--mode", mode, "--shape", shape, "--search", search,  # noqa: E731
                                                    "--search-budget-s", "45", *extra], 75)
    return [
        ("env", ["env"] + (["--require-gpu"] if shape == "7b" else []), 45),
        ("correctness", ["correctness"], 90),
        train("nondp"),
        train("hooks", "--save-adapter", adapter),
        ("generate", ["generate", "--shape", shape, "--adapter", adapter], 60),
        train("ghost"),
        train("fsdp2"),
    ]


def run_part(name: str, argv: list[str], limit: float, json_path: Path) -> dict:
    """Run one part in its own process group; kill the group at the time limit."""
    start = time.perf_counter()
    cmd = [sys.executable, str(HERE / "gpu_check_parts.py"), *argv, "--json", str(json_path)]
    proc = subprocess.Popen(cmd, cwd=HERE, start_new_session=True)
    try:
        rc = proc.wait(timeout=limit)
        status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        status = f"stopped at its {limit:.0f} s limit"
    result = json.loads(json_path.read_text()) if json_path.is_file() else {}
    return {"part": name, "status": status, "seconds": round(time.perf_counter() - start, 1), "result": result}


def summarize(parts: list[dict]) -> dict:
    """The ratio table: each mode against non-DP at the same batch, and the targets' verdicts."""
    train = {p["part"].split(":", 1)[1]: p["result"] for p in parts if p["part"].startswith("train:")}
    ref = train.get("nondp", {}).get("at_batch")
    rows = []
    for mode, res in train.items():
        at = res.get("at_batch")
        row = {"mode": mode, "at_batch": at, "largest_batch": res.get("largest_batch"), "search": res.get("search")}
        if at and ref:
            row["tokens_vs_nondp"] = at["tokens_per_s"] / ref["tokens_per_s"]
            if at.get("peak_gib") and ref.get("peak_gib"):
                row["memory_vs_nondp"] = at["peak_gib"] / ref["peak_gib"]
            if mode != "nondp":
                row["meets_tokens_target"] = row["tokens_vs_nondp"] >= TARGET_TOKENS
                if "memory_vs_nondp" in row:
                    row["meets_memory_target"] = row["memory_vs_nondp"] <= TARGET_MEMORY
        rows.append(row)
    checks = next((p["result"].get("checks", []) for p in parts if p["part"] == "correctness"), [])
    return {"modes": rows, "checks": checks,
            "generation": next((p["result"].get("generation") for p in parts if p["part"] == "generate"), None)}


def _f(x, fmt="{:.0f}") -> str:
    return "–" if x is None else fmt.format(x)


def markdown(report: dict) -> str:
    env = next((p["result"] for p in report["parts"] if p["part"] == "env"), {})
    gpu = env.get("gpu") or {}
    setup = next((p["result"].get("setup") for p in report["parts"] if p["part"].startswith("train:")
                  and p["result"].get("setup")), {}) or {}
    lines = [f"# GPU check: {gpu.get('name', 'no GPU (rehearsal)')}, {report['date']}", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items()), "",
             f"## DP-SGD LoRA through the product's engine ({report['shape']} shape)", "",
             f"LoRA r {setup.get('lora_r')} on {', '.join(setup.get('lora_targets', []))}, sequence {setup.get('seq')}, "
             f"{setup.get('base_dtype')} base, fp32 adapter, physical batch {setup.get('physical_batch')} "
             f"(logical batch {setup.get('logical_batch')}, sampling rate 1), same rows in every mode. "
             "Ratios are to non-DP in this one run. " + note("the tokens timed per mode (its timed steps)", 1,
                                                             "the same engine without DP (non-DP)"), "",
             "| mode | tokens timed | tokens/s | vs non-DP | peak GiB | vs non-DP | largest batch | tokens/s there "
             "| peak GiB there |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["summary"]["modes"]:
        at, big = r.get("at_batch") or {}, r.get("largest_batch") or {}
        lines.append(f"| {r['mode']} | {_f(at.get('tokens'))} | {_f(at.get('tokens_per_s'))} | "
                     f"{_f(r.get('tokens_vs_nondp'), '{:.3f}')} | "
                     f"{_f(at.get('peak_gib'), '{:.1f}')} | {_f(r.get('memory_vs_nondp'), '{:.3f}')} | "
                     f"{_f(big.get('batch'))} | {_f(big.get('tokens_per_s'))} | {_f(big.get('peak_gib'), '{:.1f}')} |")
    lines += ["", f"Targets: DP tokens/s >= {TARGET_TOKENS}x non-DP, DP peak memory <= {TARGET_MEMORY}x non-DP."]
    for r in report["summary"]["modes"]:
        if "meets_tokens_target" in r:
            lines.append(f"- {r['mode']}: tokens {'met' if r['meets_tokens_target'] else 'missed'}"
                         + (f", memory {'met' if r['meets_memory_target'] else 'missed'}" if "meets_memory_target" in r
                            else ""))
    lines += ["", "## Correctness on the device", "", "| check | value | bound | passed |", "|---|---|---|---|"]
    for c in report["summary"]["checks"]:
        lines.append(f"| {c['check']} | {c['value']:.3g} | {c['bound']} | {'yes' if c['passed'] else '**no**'} |")
    gen = report["summary"].get("generation") or {}
    if gen:
        new = next(iter(gen.values()))["new_tokens"]
        lines += ["", f"## HF generation with the DP adapter ({new} new tokens per row, tokens/s)", "",
                  note(f"the batch's rows x {new} new tokens, one generate call per cell", 1,
                       "the unmerged adapter"), "",
                  "| adapter | batch 1 | batch 32 |", "|---|---|---|"]
        for kind in ("unmerged", "merged"):
            lines.append(f"| {kind} | {_f(gen.get(f'{kind}_batch1', {}).get('tokens_per_s'))} | "
                         f"{_f(gen.get(f'{kind}_batch32', {}).get('tokens_per_s'))} |")
    lines += ["", "## Parts", "", "| part | status | seconds |", "|---|---|---|"]
    lines += [f"| {p['part']} | {p['status']} | {p['seconds']} |" for p in report["parts"]]
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path) -> None:
    report["summary"] = summarize(report["parts"])
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (out / "gpu_check.md").write_text(markdown(report))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["7b", "tiny"], default="7b")
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--budget-s", type=float, default=480, help="all parts together stop within this")
    ap.add_argument("--parts", default=None, help="comma-separated part names to run (default: all)")
    ap.add_argument("--search", default=SEARCH, help="physical batches tried for each mode's largest batch")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget_s
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    report = {"shape": args.shape, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "parts": []}
    wanted = set(args.parts.split(",")) if args.parts else None
    for name, argv_part, limit in plan(args.shape, work, args.search):
        if wanted is not None and name not in wanted:
            continue
        left = deadline - time.perf_counter()
        if left < 10:
            report["parts"].append({"part": name, "status": "not run: the time budget is spent", "seconds": 0,
                                    "result": {}})
            write(report, out)
            continue
        print(f"gpu_check: {name} (limit {min(limit, left):.0f} s)", flush=True)
        part = run_part(name, argv_part, min(limit, left), work / f"{name.replace(':', '_')}.json")
        report["parts"].append(part)
        write(report, out)
        if name == "env" and part["status"] != "ok":
            print("gpu_check: stopped: the environment is not ready (see above)", flush=True)
            return 3
    print(markdown(report), flush=True)
    ok = all(p["status"] == "ok" for p in report["parts"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
