"""Utility: a classifier trained on synthetic data and tested on real data (TSTR), each figure beside the trivial
baseline on the same metric and test rows, and beside the real-data reference where the run has one."""

from __future__ import annotations

from dpsynth_core.report.bands import utility_grade
from dpsynth_core.report.inputs import RunFacts
from dpsynth_core.report.model import Figure, Section, Table, fmt, not_applicable, not_computed

TITLE = "Utility"
NO_BETTER = "no better than the trivial baseline"
ACTIONS = {"D": "do not use this data for training classifiers yet: it does no better than predicting the majority "
                "class", "C": "more ε or more synthetic rows"}


def _flag(value, baseline) -> str:
    return NO_BETTER if value is not None and baseline is not None and value <= baseline else ""


def _section(figures: list[Figure], headline: Figure, tables=(), notes=()) -> Section:
    if headline.value is None or headline.baseline is None:
        return Section("utility", TITLE, "not graded", "rerun the evaluation: the baseline of this figure was not "
                       "recorded (a run from before baselines were written)", figures, list(tables), notes=list(notes))
    grade, lift = utility_grade(headline.value, headline.baseline, headline.reference)
    notes = [*notes, f"graded on {headline.label}: lift over the baseline {lift:.3f}"
             + (" (relative to the real-data reference)" if headline.reference is not None else " (no real-data reference)")]
    return Section("utility", TITLE, grade, ACTIONS.get(grade, "none"), figures, list(tables), notes=notes)


def _text(facts: RunFacts) -> Section:
    m = facts.metrics or {}
    if facts.method == "ACTG":
        from dpsynth_core.report.fidelity import main_system

        main = main_system(m)
        down = ((m.get("systems") or {}).get(main) or {}).get("downstream")
        if not down:
            return not_computed("utility", TITLE, "the run trained no downstream classifier (evaluation.classifier)")
        n = f"trained on {down.get('n_train')} synthetic, tested on {down.get('n_test')} real texts"
        acc = Figure(f"downstream accuracy ({main})", down.get("accuracy"), n, down.get("majority_baseline"),
                     "majority class", flag=_flag(down.get("accuracy"), down.get("majority_baseline")))
        f1 = Figure(f"downstream macro-F1 ({main})", down.get("macro_f1"), n, down.get("constant_macro_f1"),
                    "best constant predictor", flag=_flag(down.get("macro_f1"), down.get("constant_macro_f1")))
        return _section([acc, f1], f1, notes=["no real-data reference: ACTG trains no classifier on real texts"])
    ev = m.get("evaluation")
    if not ev:
        return not_computed("utility", TITLE, "the run had no held-out real texts (evaluate: false)")
    if not ev.get("n_test"):
        return not_computed("utility", TITLE, "the run's metrics predate sample sizes and baselines; rerun it")
    n = f"trained on {ev.get('n_train')} synthetic, tested on {ev['n_test']} real texts"
    acc = Figure("downstream accuracy", ev.get("accuracy"), n, ev.get("majority_baseline"), "majority class",
                 flag=_flag(ev.get("accuracy"), ev.get("majority_baseline")))
    return _section([acc], acc, notes=["no real-data reference: PE trains no classifier on real texts"])


def _table(facts: RunFacts) -> Section:
    ev = facts.evaluation or {}
    tstr = ev.get("tstr")
    if not tstr:
        return not_computed("utility", TITLE, "the schema has no target column: no TSTR classifier")
    base = tstr.get("baseline") or {}
    ref = facts.reference or {}
    n = f"trained on {ev.get('n_synthetic')} synthetic rows, tested on {base.get('n_test', ev.get('n_real_test'))} real rows"
    figures, rows = [], []
    for model, short in (("gboost", "gb"), ("logreg", "lr")):
        res = tstr.get(model) or {}
        for metric, key, b_key, b_label in (("accuracy", "accuracy", "majority_accuracy", "majority class"),
                                            ("F1", "f1", "constant_f1", "best constant predictor")):
            real = ref.get(f"{'acc' if key == 'accuracy' else 'f1'}_{short}")
            figures.append(Figure(f"TSTR {metric} ({model})", res.get(key), n, base.get(b_key), b_label, real,
                                  "trained on real rows", _flag(res.get(key), base.get(b_key))))
            rows.append([model, metric, fmt(res.get(key)), fmt(base.get(b_key)), fmt(real),
                         _flag(res.get(key), base.get(b_key)) or "better than the baseline"])
    table = Table("TSTR: train on synthetic, test on real", ["classifier", "metric", "synthetic", "trivial baseline",
                                                             "real-data reference", ""], rows)
    return _section(figures, figures[1], [table])  # graded on gradient boosting's F1


def utility_section(facts: RunFacts) -> Section:
    if facts.method == "train":
        return not_applicable("utility", TITLE, "a `dpsynth train` run releases an adapter, no synthetic data")
    return _text(facts) if facts.is_text else _table(facts)
