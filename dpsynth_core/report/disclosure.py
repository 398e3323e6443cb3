"""Disclosure: what the synthetic data gives away about its training rows, measured by owner-side attacks
(distance to closest record, a membership-inference AUC, attribute inference, exact copies)."""

from __future__ import annotations

from dpsynth_core.report.bands import disclosure_grade
from dpsynth_core.report.inputs import RunFacts
from dpsynth_core.report.model import Figure, Section, Table, fmt, not_applicable, not_computed

TITLE = "Disclosure"


def disclosure_section(facts: RunFacts) -> Section:
    if facts.method == "train":
        return not_applicable("disclosure", TITLE, "a `dpsynth train` run releases an adapter, no synthetic data; "
                              "`dpsynth audit dpsgd` tests the training itself")
    priv = (facts.evaluation or {}).get("privacy")
    if not priv:
        return not_computed("disclosure", TITLE, "the run computed no disclosure attack (text runs: none yet; tables: "
                            "evaluate_privacy off)")
    n = f"{priv.get('n_members', 'n/a')} training rows vs as many held-out rows, {priv.get('n_synthetic', 'n/a')} synthetic rows"
    copies, holdout_copies = priv.get("dcr_synth_exact_match_rate"), priv.get("dcr_holdout_exact_match_rate")
    figures = [Figure("membership-inference AUC (0.5 = no signal)", priv.get("mia_auc"), n, 0.5, "no signal"),
               Figure("median distance to closest training row", priv.get("dcr_synth_median"), n,
                      reference=priv.get("dcr_holdout_median"), reference_label="held-out real rows"),
               Figure("exact copies of training rows (share)", copies, n, reference=holdout_copies,
                      reference_label="held-out real rows")]
    rows, advantages = [], []
    for key, res in priv.items():
        if key.startswith("attribute_inference_") and isinstance(res, dict):
            attr = key.removeprefix("attribute_inference_")
            advantages.append(res.get("advantage"))
            rows.append([attr, fmt(res.get("member_accuracy")), fmt(res.get("non_member_accuracy")),
                         fmt(res.get("advantage")), fmt(res.get("majority_rate"))])
    tables = [Table("Attribute inference: guess a person's attribute from the nearest synthetic row",
                    ["attribute", "accuracy on training rows", "on held-out rows", "advantage", "majority rate"],
                    rows)] if rows else []
    if priv.get("mia_auc") is None:
        return Section("disclosure", TITLE, "not computed", "none", figures, tables)
    more_copies = copies is not None and holdout_copies is not None and copies > holdout_copies
    worst = max((a for a in advantages if a is not None), default=None)
    grade = disclosure_grade(priv["mia_auc"], more_copies, worst)
    action = "lower ε; check the exact copies" if grade in ("C", "D") else "none"
    return Section("disclosure", TITLE, grade, action, figures, tables)
