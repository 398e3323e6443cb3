"""Fairness gaps as issue 41 defines them (tabular.group_gaps): max - min over groups with >= 50 real test rows; a
smaller group is named "not enough data", never silently dropped. Pure numpy, hand-counted rows."""

from __future__ import annotations

import pytest

from dpsynth_core.errors import DataError
from dpsynth_core.tabular.group_gaps import group_gaps


def _group(name: str, positives: int, negatives: int, hit_pos: int, hit_neg: int):
    """Rows of one group: ``hit_pos`` of its positives and ``hit_neg`` of its negatives predicted positive."""
    truth = [1] * positives + [0] * negatives
    pred = [1] * hit_pos + [0] * (positives - hit_pos) + [1] * hit_neg + [0] * (negatives - hit_neg)
    return truth, pred, [name] * (positives + negatives)


def _rows(*groups):
    truth, pred, names = [], [], []
    for t, p, n in groups:
        truth, pred, names = truth + t, pred + p, names + n
    return truth, pred, names


# A: 60 rows, rate 26/60, TPR 20/30, FPR 6/30; B: 80 rows, rate 0.5, TPR 0.9, FPR 0.1; C: 10 rows, all predicted 1
ROWS = _rows(_group("A", 30, 30, 20, 6), _group("B", 40, 40, 36, 4), _group("C", 5, 5, 5, 5))


def test_gaps_count_only_groups_with_50_rows_and_name_the_others():
    gaps = group_gaps(*ROWS)
    assert gaps.rows == {"A": 60, "B": 80} and gaps.not_enough_data == {"C": 10} and gaps.min_rows == 50
    assert gaps.dp == pytest.approx(0.5 - 26 / 60)
    assert gaps.eo == pytest.approx(max(0.9 - 20 / 30, 6 / 30 - 0.1))
    assert gaps.as_dict()["status"] == "ok"
    # counted, C's rates (1.0 everywhere) would decide both gaps
    every = group_gaps(*ROWS, min_rows=1)
    assert every.dp == pytest.approx(1 - 26 / 60) and every.eo == pytest.approx(0.9) and every.not_enough_data == {}


def test_fewer_than_two_groups_with_enough_rows_is_not_enough_data():
    gaps = group_gaps(*ROWS, min_rows=70)
    assert gaps.dp is None and gaps.eo is None
    assert gaps.rows == {"B": 80} and gaps.not_enough_data == {"A": 60, "C": 10}
    assert gaps.as_dict()["status"] == "not enough data"
    with pytest.raises(DataError, match="binary target"):
        group_gaps([0, 2], [0, 1], ["A", "B"])
    with pytest.raises(DataError, match="differ in length"):
        group_gaps([0, 1], [0, 1, 1], ["A", "B"])


def test_the_new_tables_summary_names_the_groups_left_out_and_prints_no_gap_without_data(tmp_path):
    """experiments/dpfair_new_tables.py's table: a gap without two groups of 50 reads "not enough data", and the
    groups below 50 are listed per split (its module imports numpy, pandas and yaml only)."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
    from dpfair_new_tables import summary

    left_out = {"dp": None, "eo": None, "rows": {"catholic": 900}, "not_enough_data": {"other": 37}}
    counted = {"dp": 0.2, "eo": 0.3, "rows": {"catholic": 900, "other": 60}, "not_enough_data": {}}
    results = tmp_path / "fertil2" / "results"
    results.mkdir(parents=True)
    for method, k, gaps in (("dpfair", 0, left_out), ("dpfair", 1, counted), ("aim", 0, left_out)):
        (results / f"{method}_eps4_run{k}.json").write_text(json.dumps(
            {"method": method, "epsilon": 4.0, "run": k, "acc_lr": 0.7, "gaps": {"logreg": gaps}}))
    text = summary(tmp_path)
    dpfair = next(line for line in text.splitlines() if line.startswith("| 4 | DPFairLLM | 2 |"))
    assert "0.200 ± 0.000 (n = 1)" in dpfair  # one of its two runs has a gap
    aim = next(line for line in text.splitlines() if line.startswith("| 4 | AIM | 1 |"))
    assert aim.count("not enough data") == 2
    assert "split 0: other (37 rows)" in text and "split 1" not in text
