"""Fairness (tables with sensitive attributes): the TSTR classifiers' demographic-parity and equalized-odds gaps
on the real test rows, trained on synthetic data beside the same classifiers trained on real data and, when the
report is given one (``--baseline``), on an AIM run's synthetic table (``aim_baseline``)."""

from __future__ import annotations

from dpsynth_core.report.aim_baseline import AimBaseline
from dpsynth_core.report.bands import fairness_grade
from dpsynth_core.report.inputs import RunFacts
from dpsynth_core.report.model import Figure, Section, Table, fmt, not_applicable, not_computed

TITLE = "Fairness"


def sensitive_attributes(tstr_model: dict) -> list[str]:
    return sorted(k.removeprefix("dp_diff_") for k in tstr_model if k.startswith("dp_diff_"))


def fairness_section(facts: RunFacts, aim: AimBaseline | None = None) -> Section:
    if not facts.is_table:
        return not_applicable("fairness", TITLE, "fairness gaps are computed for tables with sensitive attributes")
    ev = facts.evaluation or {}
    tstr = ev.get("tstr") or {}
    gb = tstr.get("gboost") or {}
    attrs = sensitive_attributes(gb)
    if not attrs:
        return not_computed("fairness", TITLE, "the schema names no sensitive attribute (or no target)")
    ref = facts.reference or {}
    n = f"classifier trained on {ev.get('n_synthetic')} synthetic rows, gaps on {(tstr.get('baseline') or {}).get('n_test', ev.get('n_real_test'))} real test rows"
    rows, figures = [], []
    for a in attrs:
        for model, short in (("gboost", "gb"), ("logreg", "lr")):
            res = tstr.get(model) or {}
            rows.append([a, model, fmt(res.get(f"dp_diff_{a}")), fmt(ref.get(f"dp_diff_{short}_{a}")),
                         fmt(res.get(f"eo_diff_{a}")), fmt(ref.get(f"eo_diff_{short}_{a}"))])
            if aim is not None:
                rows[-1][4:4] = [fmt(aim.gap(model, "dp_diff", a))]
                rows[-1].append(fmt(aim.gap(model, "eo_diff", a)))
        figures.append(Figure(f"demographic-parity gap, {a} (gboost)", gb.get(f"dp_diff_{a}"), n,
                              reference=ref.get(f"dp_diff_gb_{a}"), reference_label="trained on real rows"))
        if aim is not None:
            figures.append(Figure(f"demographic-parity gap, {a} (gboost), AIM baseline", aim.gap("gboost", "dp_diff", a),
                                  f"classifier trained on {aim.n_synthetic} AIM synthetic rows, gaps on the same "
                                  f"{(aim.tstr.get('baseline') or {}).get('n_test')} real test rows",
                                  reference=gb.get(f"dp_diff_{a}"), reference_label="this run's synthetic rows"))
    columns = ["attribute", "classifier", "DP gap (synthetic)", "DP gap (real)", "EO gap (synthetic)", "EO gap (real)"]
    if aim is not None:
        columns[4:4] = ["DP gap (AIM)"]
        columns.append("EO gap (AIM)")
    table = Table("Gaps of the TSTR classifiers on the real test rows (0 = equal across groups)", columns, rows)
    aim_notes = [] if aim is None else [
        f"AIM baseline: {aim.label()}, its synthetic table evaluated with the same classifiers on the same real test "
        "rows (same columns, target and test-row settings, checked)"
        + ("; its gradient-boosting classifier is no more accurate than predicting the majority class, so its small "
           "gaps say nothing about fairness" if aim.trivial else "")]
    worst = max(gb[f"dp_diff_{a}"] for a in attrs)
    base = tstr.get("baseline") or {}
    if gb.get("accuracy") is not None and base.get("majority_accuracy") is not None \
            and gb["accuracy"] <= base["majority_accuracy"]:
        # a classifier no better than predicting the majority class has gaps near 0 by construction
        return Section("fairness", TITLE, "not graded", "none until the classifier beats the trivial baseline (see "
                       "Utility)", figures, [table], notes=["not graded: the gradient-boosting classifier trained on "
                       "synthetic rows is no more accurate than predicting the majority class, so its small gaps say "
                       "nothing about fairness", *aim_notes])
    grade = fairness_grade(worst)
    action = ("turn on (or tighten) the fairness terms (fairness.lambda_dp, generation.fairness.max_dp_gap)"
              if grade in ("C", "D") else "none")
    return Section("fairness", TITLE, grade, action, figures, [table],
                   notes=[f"graded on the largest demographic-parity gap of the gradient-boosting classifier: {worst:.3f}",
                          *aim_notes])
