"""Stage 1 rows come from the public schema alone; the decoding-time label tilt moves each group
towards the target rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth_core.tabular.fair_decoding import LabelTilt
from dpsynth_core.tabular.public_stage import public_rows, stage_key
from dpsynth_core.tabular.schema import load_schema

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"
COLUMNS = ["age", "education", "sex", "hours_per_week", "income"]


def test_public_rows_follow_the_schema_and_balance_the_label():
    schema = load_schema(ADULT_SCHEMA).select(COLUMNS)
    rows = public_rows(schema, 400, seed=0)
    schema.validate_frame(rows, "public rows")  # every value inside the public domain
    assert 0.4 < (rows.income == ">50K").mean() < 0.6  # uniform label prior, not the base model's
    assert rows.education.nunique() == len(schema.column("education").categories)
    assert rows.equals(public_rows(schema, 400, seed=0)) and not rows.equals(public_rows(schema, 400, seed=1))
    key = stage_key("tiny-llama", schema, {"steps": 2}, {"prefix": "none"})
    assert key == stage_key("tiny-llama", schema, {"steps": 2}, {"prefix": "none"})
    assert key != stage_key("tiny-llama", schema, {"steps": 3}, {"prefix": "none"})


@pytest.fixture(scope="module")
def tilt():
    from dpsynth_core.models import load_tokenizer
    from dpsynth_core.tabular.constrained import RowConstraint
    from dpsynth_core.tabular.serialize import RowSerializer

    schema = load_schema(ADULT_SCHEMA).select(COLUMNS)
    constraint = RowConstraint(RowSerializer(schema), load_tokenizer("tiny-llama"))
    return LabelTilt(constraint, schema, "sex", step=0.5), constraint


def test_tilt_reads_the_group_and_moves_each_group_towards_the_overall_rate(tilt):
    t, c = tilt
    for group in ("Female", "Male"):
        ids = list(c.forced(0, "age")) + [5, 6] + list(c.forced(1, "sex")) + list(c.cat_ids["sex"][group])
        assert t.group_of(ids) == group
    assert t.group_of(list(c.forced(0, "age"))) is None
    for _ in range(40):  # men at 0.8, women at 0.2: the overall rate is 0.5
        t.observe("Male", True), t.observe("Male", True), t.observe("Male", True), t.observe("Male", True), t.observe("Male", False)
        t.observe("Female", True), t.observe("Female", False), t.observe("Female", False), t.observe("Female", False), t.observe("Female", False)
    t.update()
    assert t.delta["Male"] < -0.5 and t.delta["Female"] > 0.5  # odds of >50K lowered for men, raised for women
    assert t.delta["Male"] == pytest.approx(-t.delta["Female"], rel=0.05)
