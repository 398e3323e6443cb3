"""Collect tabular run summaries into one comparison table (markdown) and a bar plot.

    dpsynth run dpfair --config experiments/configs/dpfair_eps4.yaml
    dpsynth run dpfair --config experiments/configs/dpfair_eps4_nofair.yaml
    dpsynth run aim --config configs/aim_eps4.yaml
    python benchmarks/dpfair_table.py runs/dpfair/dpfair_eps4 runs/dpfair/dpfair_eps4_nofair runs/aim/aim_eps4 \
        --out runs/dpfair/comparison
    python benchmarks/dpfair_table.py runs/*/*_s[0-9] --seeds    # mean ± sd over seeds per (method, epsilon)

Reads ``stages/evaluate.done`` of each run directory (a DPFairLLM run or an AIM run: one release
each) and ``stages/reference.done`` (classifiers trained on the real sample, DPFairLLM runs). The
numbers are the owner-side evaluation of each run; nothing here touches the data again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from sample_size import note

COLUMNS = [
    ("acc_lr", "acc LR"), ("f1_lr", "F1 LR"), ("acc_gb", "acc GB"), ("f1_gb", "F1 GB"),
    ("dp_diff_lr", "DP diff LR"), ("eo_diff_lr", "EO diff LR"), ("dp_diff_gb", "DP diff GB"), ("eo_diff_gb", "EO diff GB"),
    ("tvd_1way", "TVD 1-way"), ("tvd_2way", "TVD 2-way"), ("jsd_1way", "JSD 1-way"), ("jsd_2way", "JSD 2-way"),
    ("valid_fraction", "% valid"), ("label_pos_rate", "P(Y=pos) synth"),
]


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _method(run: Path, summary: dict) -> str:
    if summary.get("method") == "aim":
        return "AIM (smartnoise-synth)"
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    fairness = (cfg or {}).get("fairness") or {}
    fair = (fairness.get("lambda_dp") or 0) > 0 or (fairness.get("lambda_eo") or 0) > 0
    calibrate = ((cfg or {}).get("generation") or {}).get("calibrate") or {}
    how = ""
    if calibrate.get("enabled"):  # generation.calibrate: raked to the DP 1-way (and (column, Y)) tables
        how = ", calibrated to DP 1-way" + (" + (column, Y) tables" if calibrate.get("pairs_with_target") else " marginals")
        how += " + (column, A) tables" if calibrate.get("pairs_with_sensitive") else ""
        # select went with issue 41: a run without the key selected as 'balanced' did
        how += ", balanced selection" if calibrate.get("select", "balanced") == "balanced" else ""
        if calibrate.get("labels") == "dp_tables":
            how += ", labels from the DP tables" + (f" (T = {calibrate['label_temperature']:g})" if calibrate.get("label_temperature") else "")
            how += f" with {calibrate['label_prior']:g} noise sd of pseudo-rows" if calibrate.get("label_prior") else ""
        if calibrate.get("stratify"):
            strata = calibrate["stratify"]
            if strata == "auto" and (run / "resolved_config.yaml").is_file():  # the run's choice from its DP tables
                strata = yaml.safe_load((run / "resolved_config.yaml").read_text())["generation"]["calibrate"]["stratify"]
            how += ", pool stratified by " + (" x ".join(strata) if isinstance(strata, list) else str(strata))
    gen_fair = ((cfg or {}).get("generation") or {}).get("fairness") or {}
    if gen_fair.get("rate_mix"):  # where the labels' per-group rates aim: runs aiming elsewhere must not merge
        how += f", label rates {gen_fair['rate_mix']:g} of the way to the DP P(Y | A)"
    elif gen_fair.get("target_rates"):
        how += f", label rates {gen_fair['target_rates']}"
    training = (cfg or {}).get("training") or {}
    if training.get("steps") and training.get("expected_batch_size"):  # runs at different DP-SGD lengths differ
        how += f", DP-SGD {training['steps']}x{training['expected_batch_size']}"
    return f"DPFairLLM {'with' if fair else 'without'} fairness terms{how}"


def collect(run_dirs: list[Path]) -> list[dict]:
    rows, seen_ref = [], set()
    for run in run_dirs:
        ev = _load(run / "stages" / "evaluate.done")
        if ev:  # epsilon: the composed total of the run's own ledger
            rows.append({**ev, "method": _method(run, ev), "run": run.name})
        ref = _load(run / "stages" / "reference.done")
        if ref:
            key = json.dumps({k: ref.get(k) for k in ("acc_lr", "acc_gb")})
            if key not in seen_ref:  # same real sample in every run: one reference row
                seen_ref.add(key)
                rows.append({**ref, "method": "real data (train on real sample)", "run": run.name})
    return rows


# sample sizes and the trivial baselines of the accuracy / F1 columns, printed beside them (issue 38)
COUNTS = [("n_synthetic", "n synthetic rows"), ("n_test", "n real test rows"),
          ("majority_acc", "majority-class acc (baseline)"), ("constant_f1", "constant predictor's F1 (baseline)")]
CAPTION = ("TSTR classifiers trained on each row's synthetic (or real) rows, tested on the real test rows; gaps on "
           "the same test rows")


def _count(v) -> str:
    return "–" if v is None else (f"{v:.3f}" if isinstance(v, float) and not float(v).is_integer() else f"{int(v)}")


def markdown(rows: list[dict]) -> str:
    head = "| method | ε (spent) | " + " | ".join(h for _, h in COUNTS + COLUMNS) + " |"
    sep = "|" + "---|" * (len(COUNTS) + len(COLUMNS) + 2)
    lines = [head, sep]
    for r in rows:
        eps = r.get("epsilon")
        cells = []
        for k, _ in COLUMNS:
            v = r.get(k)
            if v is None:
                cells.append("–")
            elif k == "valid_fraction":
                cells.append(f"{100 * v:.1f}")
            else:
                cells.append(f"{v:.3f}")
        counts = [_count(r.get(k)) for k, _ in COUNTS]
        lines.append(f"| {r['method']} | {'–' if eps is None else f'{eps:.3f}'} | " + " | ".join(counts + cells) + " |")
    lines.append(note("the row's n synthetic rows and n real test rows", 1, "majority-class accuracy and the constant "
                      "predictor's F1 on the same test rows") + f", each row one run; {CAPTION}")
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    metrics = [("acc_gb", "TSTR accuracy (GB)"), ("f1_gb", "TSTR F1 (GB)"), ("dp_diff_gb", "DP difference (GB)"),
               ("eo_diff_gb", "EO difference (GB)"), ("tvd_2way", "2-way TVD")]
    # bars are numbered; the methods' full names go in a key under the plots (long names as rotated
    # tick labels did not fit)
    height = 4 + 0.22 * len(rows)  # the plots, then one key line per row
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), height))
    key = [f"{i + 1}: {r['method']}{'' if r.get('epsilon') is None else ', ε = %.2f' % r['epsilon']}" for i, r in enumerate(rows)]
    for ax, (k, title) in zip(axes, metrics):
        vals = [r.get(k) if r.get(k) is not None else np.nan for r in rows]
        sds = [r.get(k + "_sd") or 0.0 for r in rows]  # --seeds rows: the sd over seeds as error bars
        ax.bar(np.arange(len(rows)), vals, yerr=sds, capsize=3)
        ax.set_xticks(np.arange(len(rows)), [str(i + 1) for i in range(len(rows))])
        ax.set_title(title)
    fig.text(0.01, 0.01, "\n".join(key), fontsize=8, va="bottom", ha="left")
    fig.tight_layout(rect=(0, (height - 3.8) / height, 1, 1))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "comparison.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _config_epsilon(run: Path) -> float | None:
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    return (cfg or {}).get("epsilon")


def _label_rate(run: Path) -> float | None:
    """Share of the positive label in the run's synthetic table (the "every row >50K" failure)."""
    import pandas as pd

    path = run / "synthetic.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, keep_default_na=False)
    return float((frame["income"] == ">50K").mean()) if "income" in frame and len(frame) else None


def aggregate(run_dirs: list[Path]) -> list[dict]:
    """Mean and sd over seeds: one row per (method, configured epsilon); real-data rows pooled."""
    import numpy as np

    groups: dict[tuple, list[dict]] = {}
    for run in run_dirs:
        for row in collect([run]):
            eps = None if row["method"].startswith("real data") else _config_epsilon(run)
            row["label_pos_rate"] = None if row["method"].startswith("real data") else _label_rate(run)
            groups.setdefault((row["method"], eps), []).append(row)
    out = []
    for (method, eps), rows in groups.items():
        agg = {"method": f"{method} ({len(rows)} runs)", "epsilon": eps, "runs": len(rows)}
        for k, _ in COUNTS:  # the same per run (one config per group); a spread would show as "a/b"
            agg[k] = "/".join(sorted({_count(r.get(k)) for r in rows}))
        for k, _ in COLUMNS:
            vals = [r[k] for r in rows if r.get(k) is not None]
            if vals:
                agg[k], agg[k + "_sd"] = float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        out.append(agg)
    return sorted(out, key=lambda r: (r["epsilon"] is None, -(r["epsilon"] or 0), r["method"]))


def markdown_mean_sd(rows: list[dict]) -> str:
    head = "| method | ε | " + " | ".join(h for _, h in COUNTS + COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COUNTS) + len(COLUMNS) + 2)]
    for r in rows:
        cells = []
        for k, _ in COLUMNS:
            if r.get(k) is None:
                cells.append("–")
            else:
                scale = 100 if k == "valid_fraction" else 1
                cells.append(f"{scale * r[k]:.3f} ± {scale * r[k + '_sd']:.3f}")
        counts = [str(r.get(k) or "–") for k, _ in COUNTS]
        lines.append(f"| {r['method']} | {'∞' if r['epsilon'] is None else r['epsilon']} | "
                     + " | ".join(counts + cells) + " |")
    runs = max((r.get("runs", 1) for r in rows), default=1)
    lines.append(note("the row's n synthetic rows and n real test rows per run", runs, "majority-class accuracy and "
                      "the constant predictor's F1 on the same test rows") + f"; mean ± sd over each row's runs (seeds, "
                 f"stated in the method column); {CAPTION}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="directory for comparison.md / comparison.png")
    ap.add_argument("--seeds", action="store_true", help="mean ± sd over the runs of each (method, epsilon)")
    args = ap.parse_args()
    rows = aggregate(args.runs) if args.seeds else collect(args.runs)
    if not rows:
        raise SystemExit("no finished stages found in the given run directories")
    table = markdown_mean_sd(rows) if args.seeds else markdown(rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "comparison.md").write_text(table + "\n")
        print(f"plot: {plot(rows, args.out)}")


if __name__ == "__main__":
    main()
