"""Where DPFairLLM's TSTR F1 is lost: in the label, or in the generated features? (owner-side diagnostic)

    python experiments/dpfair_label_probe.py runs/dpfair/<run> [<run> ...] [--draws 5]

For each run directory with DP (column, target) tables (``generation.calibrate.pairs_with_target``):

1. ``nb ceiling``: a naive-Bayes classifier built only from the run's DP releases (the noisy target
   marginal and the (column, target) tables of ``dp_marginals.json``; ``tabular.labeller``), applied to
   the real test rows: how much label signal the released statistics carry.
2. the same naive Bayes as a *labeller* for (a) as many real rows of the source file as the run
   released, and (b) the run's released rows (the generator's features): labels sampled from its
   posterior (``sample``, mean ± sd over ``--draws``), thresholded at 1/2 (``sharp``), or the top
   P(Y = pos) share by score (``rank``: what ``generation.calibrate.labels: dp_tables`` does); TSTR
   logistic regression on the real test rows.

Measured (issue 18): ``sample`` and ``sharp`` on generated rows fall far below (a), ``rank`` does not:
the naive Bayes' posterior is badly calibrated on generated rows (too few positives), while their
features carry the signal. Reads real rows:
run it on the owner's side only; it prints aggregate metrics, never a row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def probe(run: Path, draws: int, rng: np.random.Generator) -> list[dict]:
    from sklearn.metrics import accuracy_score, f1_score

    from dpsynth_core.tabular import evaluate, private_data
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.labeller import naive_bayes_log_odds, rank_labels
    from dpsynth_core.tabular.schema import TableSchema

    cfg = load_dpfair_config(run / "config.yaml")
    schema = TableSchema.model_validate_json((run / "schema_resolved.json").read_text())
    marginals = json.loads((run / "dp_marginals.json").read_text())
    if not marginals.get("pairs"):
        raise SystemExit(f"{run}: no DP (column, target) tables (generation.calibrate.pairs_with_target is off)")
    target, positive = schema.target, schema.positive()
    test = private_data.load_test(cfg)
    released = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
    real = private_data.read_source(cfg)[list(released.columns)].sample(len(released), random_state=int(rng.integers(2**31)))
    y_test = (test[target] == positive).to_numpy()
    ceiling = naive_bayes_log_odds(test, marginals, target, positive) > 0
    rows = [{"run": run.name, "features": "-", "labels": "nb ceiling (test rows)", "f1": f1_score(y_test, ceiling),
             "f1_sd": 0.0, "acc": accuracy_score(y_test, ceiling), "pos_rate": float(ceiling.mean())}]
    for name, feats in (("real rows", real), ("generated rows", released)):
        log_odds = naive_bayes_log_odds(feats, marginals, target, positive)
        share = np.maximum(np.asarray(marginals[target]["counts"], float), 0)
        p_pos = float(share[[str(v) for v in marginals[target]["values"]].index(positive)] / share.sum())  # DP P(Y = pos)
        for mode in ("sample", "sharp", "rank"):
            f1s, accs, rates = [], [], []
            for _ in range(draws if mode == "sample" else 1):
                positive_rows = {"sample": lambda: rng.uniform(size=len(feats)) < 1 / (1 + np.exp(-log_odds)),
                                 "sharp": lambda: log_odds > 0, "rank": lambda: rank_labels(log_odds, p_pos)}[mode]()
                relabelled = feats.reset_index(drop=True).assign(**{target: np.where(positive_rows, positive, "other")})
                lr = evaluate.tstr(relabelled, test, schema)["logreg"]
                f1s.append(lr["f1"]), accs.append(lr["accuracy"]), rates.append(positive_rows.mean())
            rows.append({"run": run.name, "features": name, "labels": f"nb {mode}", "f1": float(np.mean(f1s)),
                         "f1_sd": float(np.std(f1s, ddof=1)) if len(f1s) > 1 else 0.0, "acc": float(np.mean(accs)),
                         "pos_rate": float(np.mean(rates))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="label draws and real-row sample (post-processing)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| run | features | labels | TSTR F1 LR | acc LR | P(Y=pos) |\n|---|---|---|---|---|---|")
    for run in args.runs:
        for r in probe(run, args.draws, rng):
            print(f"| {r['run']} | {r['features']} | {r['labels']} | {r['f1']:.3f} ± {r['f1_sd']:.3f} | {r['acc']:.3f} | {r['pos_rate']:.2f} |")


if __name__ == "__main__":
    main()
