"""How far a DPFairLLM run's DP estimates of P(Y = pos | A = a) are from the private rows' (owner-side).

    python experiments/dpfair_rate_estimates.py runs/dpfair/<run>_s3 runs/dpfair/<run>_s4 ...

For each run: the rates of the fairness statistics' table alone (``fair_targets.json``) and of the table
pooled over every DP release of it (``tabular.dp_pooling``, what ``generation.fairness.rate_mix`` uses),
against the rates of the run's private working set; then the RMSE over runs and groups. A run written
before the fairness statistics kept their counts has nothing to pool (both columns equal).

Reads the private working set: run it on the owner's side; it prints rates of groups, never a row.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def estimates(run: Path) -> list[dict]:
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.fairness import load_targets
    from dpsynth_core.tabular.run_schema import resolved_schema
    from dpsynth_core.tabular.stages_model import _pooled_targets

    cfg = load_dpfair_config(run / "config.yaml")
    schema = resolved_schema(run)
    private = private_data.load_private(cfg, run, schema)
    pos, target = schema.positive(), schema.target
    rows = []
    for fair in load_targets((run / "fair_targets.json").read_text()):
        pooled = _pooled_targets(cfg, run, schema, fair)
        for group, rates in (fair.group_rates or {}).items():
            members = private[private[fair.sensitive].astype(str) == group]
            rows.append({"run": run.name, "attribute": fair.sensitive, "group": group,
                         "private": float((members[target] == pos).mean()) if len(members) else float("nan"),
                         "fair_stats": rates[pos], "pooled": pooled.group_rates[group][pos]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    rows = [row for run in args.runs for row in estimates(run)]
    print("| run | group | private | fairness table | pooled |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['attribute']}={r['group']} | {r['private']:.3f} | {r['fair_stats']:.3f} | {r['pooled']:.3f} |")
    for key in ("fair_stats", "pooled"):
        err = np.array([r[key] - r["private"] for r in rows])
        print(f"{key}: RMSE {np.sqrt(np.nanmean(err ** 2)):.4f}, mean |error| {np.nanmean(np.abs(err)):.4f} over {len(rows)} rates")


if __name__ == "__main__":
    main()
