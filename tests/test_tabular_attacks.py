"""Owner-side attacks on a synthetic table: attribute inference beside DCR / membership inference."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dpsynth_core.tabular.evaluate import attribute_inference, evaluate_table, summary_row
from dpsynth_core.tabular.schema import load_schema

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"
COLUMNS = ["age", "education", "occupation", "race", "sex", "hours_per_week", "income"]


@pytest.fixture(scope="module")
def adult(adult_dir):
    from dpsynth_core.data import load_adult

    schema = load_schema(ADULT_SCHEMA).select(COLUMNS)
    train = load_adult("train")[COLUMNS].head(600).reset_index(drop=True)
    holdout = load_adult("test")[COLUMNS].head(600).reset_index(drop=True)
    return schema, train, holdout


def test_attribute_inference_recovers_members_of_a_copied_table(adult):
    """A "synthetic" table that copies its training rows gives away their race (member accuracy 1,
    a clear advantage over non-members); an independent real sample of the population does not."""
    schema, train, holdout = adult
    leaked = attribute_inference(train, train, holdout, schema, "race")
    assert leaked["member_accuracy"] > 0.98  # (a few rows share every other column with a different race)
    assert leaked["advantage"] > 0.1
    from dpsynth_core.data import load_adult

    population = load_adult("test")[COLUMNS].iloc[1000:1600].reset_index(drop=True)
    clean = attribute_inference(population, train, holdout, schema, "race")
    assert abs(clean["advantage"]) < 0.06 and clean["member_accuracy"] < 0.95


def test_report_has_attack_and_jsd_for_every_sensitive_attribute(adult):
    schema, train, holdout = adult
    train, holdout = train.head(200), holdout.head(200)
    report = evaluate_table(train.sample(100, random_state=0), train, holdout, schema)
    for a in ("sex", "race"):
        assert set(report["privacy"][f"attribute_inference_{a}"]) == {"member_accuracy", "non_member_accuracy", "advantage", "majority_rate"}
    row = summary_row(report, "sex")
    assert row["aia_advantage"] > 0  # the sample copies half the members
    assert 0 < row["jsd_1way"] <= row["jsd_2way"] <= 1
    assert {"dp_diff_gb_race", "eo_diff_lr_sex"} <= set(row)


def test_tstr_multi_class_target_macro_f1_and_one_vs_rest_gaps(adult):
    """A 4-class target (race as the label): accuracy, macro F1 and one-vs-rest gaps; the binary
    target keeps fairlearn's numbers."""
    schema, train, holdout = adult
    from dpsynth_core.tabular.evaluate import tstr

    multi = schema.model_copy(update={"target": "race", "positive_label": None, "sensitive": ["sex"]})
    res = tstr(train.head(300), holdout.head(300), multi)
    for m in ("logreg", "gboost"):
        assert 0 < res[m]["f1"] <= res[m]["accuracy"] + 1e-9 <= 1  # macro F1 of a skewed label sits below accuracy
        assert 0 <= res[m]["dp_diff_sex"] <= 1 and 0 <= res[m]["eo_diff_sex"] <= 1
    binary = tstr(train.head(300), holdout.head(300), schema)
    assert 0 <= binary["logreg"]["dp_diff_sex"] <= 1
