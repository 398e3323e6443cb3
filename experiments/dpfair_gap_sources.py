"""Where the fairness gaps of experiments/dpfair_new_tables.py come from (issue 41, item 2: "say why").

For each finished run (owner-side: released rows, the run's private rows and the real test rows; no privacy cost)
and for the real-data rows of the same split, over the sensitive attribute's groups with >= 50 real test rows:

- ``rows_gap``: max - min of the target's positive rate per group in the rows the classifier is trained on
  (the released rows, or the private rows for "real data");
- ``lr_gap``: the DP gap (max - min of P(y_hat = 1 | group) on the real test rows) of the evaluate stage's
  logistic regression, trained on those rows (checked against the run's own figure);
- ``lr_gap_unaware``: the same classifier trained without the sensitive column: what proxies alone carry back;
- ``predicted_positive``: the share of real test rows that logistic regression predicts positive (a classifier
  that predicts nearly everyone positive has small gaps whatever its rows hold);
- ``group_auc``: how well the other columns of those rows predict the sensitive group on the real test rows
  (a logistic regression; macro one-vs-rest AUC for more than two groups): the proxies' strength.

    python experiments/dpfair_gap_sources.py --root /path/to/runs/new_tables   # prints a Markdown table
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

SENSITIVE = {"fertil2": "religion", "alcohol": "white"}  # experiments/dpfair_new_tables.py's TABLES


def _lr_predictions(train: pd.DataFrame, test: pd.DataFrame, schema, drop: tuple[str, ...] = ()) -> np.ndarray:
    """The evaluate stage's logistic regression (TSTR), trained on ``train`` without the columns ``drop``."""
    from dpsynth_core.tabular.evaluate import tstr_predictions

    return tstr_predictions(train, test, schema.select([n for n in schema.names if n not in drop]))[1]["logreg"]


def _group_auc(train: pd.DataFrame, test: pd.DataFrame, schema, sensitive: str, groups: list[str]) -> float | None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from dpsynth_core.tabular.evaluate import encode_matrix

    g_train, g_test = train[sensitive].astype(str), test[sensitive].astype(str)
    keep = g_test.isin(groups).to_numpy()
    if g_train.nunique() < 2:
        return None
    x_train = encode_matrix(train, schema, (schema.target, sensitive))
    x_test = encode_matrix(test, schema, (schema.target, sensitive))[keep]
    model = LogisticRegression(max_iter=2000).fit(x_train, g_train)
    proba = model.predict_proba(x_test)
    classes = list(model.classes_)
    truth = g_test[keep].to_numpy()
    if len(groups) == 2:
        return float(roc_auc_score(truth == classes[1], proba[:, 1]))
    scores = [roc_auc_score(truth == g, proba[:, classes.index(g)]) for g in groups if g in classes]
    return float(np.mean(scores))


def sources(train: pd.DataFrame, test: pd.DataFrame, schema, sensitive: str) -> dict:
    from dpsynth_core.tabular.group_gaps import group_gaps  # the gaps: groups with >= 50 real test rows

    pos = schema.positive()
    truth = (test[schema.target] == pos).astype(int).to_numpy()
    predicted = _lr_predictions(train, test, schema)
    aware = group_gaps(truth, predicted, test[sensitive])
    groups = list(aware.rows)
    rates = [float((train.loc[train[sensitive].astype(str) == g, schema.target] == pos).mean()) for g in groups
             if (train[sensitive].astype(str) == g).any()]
    unaware = group_gaps(truth, _lr_predictions(train, test, schema, drop=(sensitive,)), test[sensitive])
    return {"rows_gap": float(max(rates) - min(rates)) if len(rates) >= 2 else None,
            "lr_gap": aware.dp,
            "predicted_positive": float(predicted.mean()),
            "lr_gap_unaware": unaware.dp,
            "group_auc": _group_auc(train, test, schema, sensitive, groups)}


def score_run(result: dict, root: Path) -> list[dict]:
    from dpsynth_core.data import load_records
    from dpsynth_core.tabular.run_schema import resolved_schema

    name, k, epsilon, method = result["table"], result["run"], result["epsilon"], result["method"]
    run = Path(result["run_dir"])
    run = run if run.is_absolute() else root.parent.parent / run
    split = root / name / f"split_{k}"
    schema = resolved_schema(run)
    test = schema.validate_frame(load_records(split / "test.csv"), "real test")
    synth = schema.validate_frame(pd.read_csv(run / "synthetic.csv", keep_default_na=False), "synthetic")
    sensitive = SENSITIVE[name]
    rows = [{"table": name, "epsilon": epsilon, "method": "DPFairLLM" if method == "dpfair" else "AIM", "run": k,
             **sources(synth, test, schema, sensitive)}]
    if abs(rows[0]["lr_gap"] - result["gaps"]["logreg"]["dp"]) > 1e-9:
        raise SystemExit(f"{run}: the refitted LR's DP gap {rows[0]['lr_gap']:.4f} is not the run's "
                         f"{result['gaps']['logreg']['dp']:.4f}")
    if method == "dpfair":  # the real-data row of the same split, once per split and epsilon
        private = schema.validate_frame(load_records(split / "private.csv"), "private")
        rows.append({"table": name, "epsilon": epsilon, "method": "real data", "run": k,
                     **sources(private, test, schema, sensitive)})
    return rows


def _cell(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.3f}" if values else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs/new_tables", help="experiments/dpfair_new_tables.py's --out")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    rows = [r for path in sorted(root.glob("*/results/*.json")) for r in score_run(json.loads(path.read_text()), root)]
    frame = pd.DataFrame(rows)
    columns = ["rows_gap", "lr_gap", "lr_gap_unaware", "predicted_positive", "group_auc"]
    print("| table | ε | method | n | " + " | ".join(columns) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in columns) + " |")
    order = {"DPFairLLM": 0, "AIM": 1, "real data": 2}
    for (table, epsilon, method), cell in sorted(frame.groupby(["table", "epsilon", "method"]),
                                                 key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])):
        print(f"| {table} | {epsilon:g} | {method} | {len(cell)} | "
              + " | ".join(_cell(cell[c].tolist()) for c in columns) + " |")


if __name__ == "__main__":
    main()
