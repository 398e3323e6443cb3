"""Calibration of a generated pool to DP marginals (tabular.calibrate): raking, fairness cells, PPS."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.tabular.calibrate import (
    Margin, calibrate_rows, fairness_margins, margins_from_dp, rake, systematic_pps,
)
from dpsynth_core.tabular.schema import TableSchema


def _schema() -> TableSchema:
    return TableSchema.model_validate({"columns": [
        {"name": "age", "type": "numeric", "min": 0, "max": 100},
        {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
        {"name": "income", "type": "categorical", "categories": ["<=50K", ">50K"]},
    ], "target": "income", "sensitive": ["sex"], "positive_label": ">50K", "name": "toy"})


def _skewed_pool(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    """A generator's pool: 90 % men, 10 % high incomes, young; income rises with age."""
    rng = np.random.default_rng(seed)
    age = rng.uniform(0, 60, n)
    sex = np.where(rng.uniform(size=n) < 0.9, "M", "F")
    rich = rng.uniform(size=n) < 0.03 + 0.2 * (age / 60)
    return pd.DataFrame({"age": age, "sex": sex, "income": np.where(rich, ">50K", "<=50K")})


DP = {  # a DP release as dp_marginals.json writes it (noisy counts, one clamped to 0)
    "age": {"kind": "numeric", "edges": [0, 25, 50, 75, 100], "counts": [300.0, 400.0, 250.0, 0.0]},
    "sex": {"kind": "categorical", "values": ["F", "M"], "counts": [330.0, 670.0]},
    "income": {"kind": "categorical", "values": ["<=50K", ">50K"], "counts": [760.0, 240.0]},
}


def test_raking_matches_every_margin_and_keeps_the_dependence():
    pool = _skewed_pool()
    margins = margins_from_dp(DP, _schema())
    before = {m.name: m.tvd(pool) for m in margins}
    w, dropped = rake(pool, margins)
    assert before["sex"] > 0.2 and before["income"] > 0.05
    for m in margins:
        assert m.tvd(pool, w) < 1e-3, m.name
    assert dropped == {"age": 0.0, "sex": 0.0, "income": 0.0}
    assert w.mean() == pytest.approx(1.0)
    # the pool's age -> income dependence survives: high incomes stay older on average
    rich = (pool["income"] == ">50K").to_numpy()
    ages = pool["age"].to_numpy()
    assert np.average(ages[rich], weights=w[rich]) > np.average(ages[~rich], weights=w[~rich]) + 5


def test_a_margin_cell_no_row_reaches_is_dropped_and_reported():
    pool = _skewed_pool()  # ages < 60 only: the DP bin [75, 100) is 0 anyway, [50, 75) is half empty
    pool = pool[pool["age"] < 50].reset_index(drop=True)  # now [50, 75) has no row
    w, dropped = rake(pool, margins_from_dp(DP, _schema()))
    assert dropped["age"] == pytest.approx(250 / 950)
    age = margins_from_dp(DP, _schema())[0]
    assert age.shares(pool, w)[:2] == pytest.approx([300 / 700, 400 / 700], abs=1e-3)


def test_weights_are_capped():
    pool = _skewed_pool(n=400)
    pool.loc[:, "sex"] = "M"
    pool.loc[0, "sex"] = "F"  # one woman would have to stand for 33 % of the table
    w, _ = rake(pool, margins_from_dp(DP, _schema()), max_weight=10.0)
    assert w.mean() == pytest.approx(1.0) and w.max() <= 10.0 * (1 + 1e-6)
    assert margins_from_dp(DP, _schema())[1].tvd(pool, w) > 0.2  # the cap wins over the margin


def test_fairness_margin_equalises_the_label_rate_across_groups():
    pool = _skewed_pool()
    pool.loc[pool["sex"] == "F", "income"] = np.where(np.arange((pool["sex"] == "F").sum()) % 20 == 0, ">50K", "<=50K")
    margins = margins_from_dp(DP, _schema()) + fairness_margins(DP, ["sex"], "income")
    w, _ = rake(pool, margins)
    rate = {g: np.average(pool["income"].to_numpy()[pool["sex"] == g] == ">50K", weights=w[pool["sex"] == g]) for g in ("F", "M")}
    assert abs(rate["F"] - rate["M"]) < 0.01
    assert rate["F"] == pytest.approx(0.24, abs=0.01)
    # explicit target rates per group are honoured
    given = fairness_margins(DP, ["sex"], "income", {"sex": {"F": 0.3, "M": 0.2}}, ">50K")[0]
    assert given.target.reshape(2, 2)[0, 1] == pytest.approx(0.33 * 0.3)


def test_systematic_pps_draws_n_distinct_rows_with_the_right_inclusion_probabilities():
    rng = np.random.default_rng(1)
    w = np.array([8.0, 4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    n = 4
    hits = np.zeros(len(w))
    for _ in range(4000):
        idx = systematic_pps(w, n, rng)
        assert len(idx) == n and len(set(idx)) == n
        hits[idx] += 1
    # row 0 is certain (its share would exceed 1); the rest share the remaining 3 draws by weight
    expected = np.r_[1.0, 3 * w[1:] / w[1:].sum()]
    assert hits / 4000 == pytest.approx(expected, abs=0.03)
    assert list(systematic_pps(w, 20, rng)) == list(range(len(w)))


def test_calibrated_rows_are_closer_to_the_dp_marginals_than_the_raw_pool():
    pool = _skewed_pool(n=900)
    margins = margins_from_dp(DP, _schema())
    res = calibrate_rows(pool, margins, 300, seed=0)
    assert len(res.frame) == 300 and not res.frame.duplicated().any()
    s = res.summary()
    assert s["tvd_to_dp_pool"] > 0.12 and s["tvd_to_dp_released"] < 0.06 and s["tvd_to_dp_weighted"] < 1e-3
    # post-processing seed: the same seed releases the same rows
    again = calibrate_rows(pool, margins, 300, seed=0)
    pd.testing.assert_frame_equal(res.frame, again.frame)


def test_margin_cells_bin_numbers_and_mark_unknown_values():
    m = Margin(name="x", columns=("age", "sex"), target=np.full(8, 1 / 8),
               edges={"age": np.array([0.0, 25, 50, 75, 100])}, values={"sex": ["F", "M"]})
    frame = pd.DataFrame({"age": [0, 24.9, 25, 100, 130, "bad"], "sex": ["F", "M", "M", "F", "F", "M"]})
    assert list(m.cells(frame)) == [0, 1, 3, 6, 6, -1]
    assert list(m.cells(pd.DataFrame({"age": [10], "sex": ["X"]}))) == [-1]


def test_pair_margins_put_the_label_dependence_into_a_pool_that_lacks_it():
    """A generator whose labels ignore the features: raking to a DP (age, income) table makes high
    incomes older, as the release says, while the 1-way margins still hold."""
    from dpsynth_core.tabular.calibrate import pair_margins_from_dp

    rng = np.random.default_rng(2)
    n = 4000
    pool = pd.DataFrame({"age": rng.uniform(0, 100, n), "sex": rng.choice(["F", "M"], n),
                         "income": np.where(rng.uniform(size=n) < 0.24, ">50K", "<=50K")})
    dp = {**DP, "age": {**DP["age"], "counts": [250.0, 250.0, 250.0, 250.0]},
          "pairs": {"age|income": {"columns": ["age", "income"],  # (age bin) x (<=50K, >50K)
                                   "counts": [240.0, 10.0, 200.0, 50.0, 170.0, 80.0, 150.0, 100.0]}}}
    margins = margins_from_dp(dp, _schema()) + pair_margins_from_dp(dp, _schema())
    w, _ = rake(pool, margins)
    old = (pool["age"] >= 75).to_numpy()
    rich = (pool["income"] == ">50K").to_numpy()
    assert abs(rich[old].mean() - rich[~old].mean()) < 0.05  # the pool: no dependence
    assert np.average(rich[old], weights=w[old]) == pytest.approx(0.4, abs=0.02)
    assert np.average(rich[~old], weights=w[~old]) == pytest.approx(140 / 750, abs=0.02)
    assert all(m.tvd(pool, w) < 1e-3 for m in margins)
    assert pair_margins_from_dp(DP, _schema()) == []  # no pairs released, none used


def test_balanced_selection_releases_rows_whose_margins_track_the_targets():
    """select: balanced — the n released rows' own margins sit near the DP marginals, where PPS carries
    sampling noise; n distinct rows, repeatable from the post-processing seed."""
    pool = _skewed_pool(n=900)
    margins = margins_from_dp(DP, _schema())
    pps = [calibrate_rows(pool, margins, 100, seed=s).summary()["tvd_to_dp_released"] for s in range(3)]
    res = calibrate_rows(pool, margins, 100, seed=0, select="balanced")
    assert len(res.frame) == 100 and not res.frame.duplicated().any()
    assert res.summary()["tvd_to_dp_released"] < 0.02 < min(pps)
    pd.testing.assert_frame_equal(res.frame, calibrate_rows(pool, margins, 100, seed=0, select="balanced").frame)
    with pytest.raises(ValueError, match="select"):
        calibrate_rows(pool, margins, 100, seed=0, select="best")


def test_shortfall_is_the_share_of_the_release_the_pool_cannot_supply():
    pool = _skewed_pool(n=1000, seed=3)
    women = int((pool["sex"] == "F").sum())  # ~100: the DP marginal asks 33 % of the released rows
    sex = margins_from_dp(DP, _schema())[1]
    assert sex.shortfall(pool, 200) == 0.0  # 66 women asked, ~100 in the pool
    assert sex.shortfall(pool, 600) == pytest.approx((0.33 * 600 - women) / 600)
    result = calibrate_rows(pool, margins_from_dp(DP, _schema()), 600, seed=0, select="balanced")
    assert result.worst_shortfall() == ("sex", pytest.approx((0.33 * 600 - women) / 600))
    summary = result.summary()
    assert summary["pool_shortfall_margin"] == "sex" and summary["pool_shortfall_max"] > 0.1
    # and what the released rows show: every woman of the pool is taken, the margin is still missed
    assert (result.frame["sex"] == "F").sum() == women
    assert sex.tvd(result.frame) == pytest.approx(summary["pool_shortfall_max"], abs=0.02)


def test_a_run_warns_when_its_pool_cannot_supply_a_margin(caplog):
    from dpsynth_core.tabular.stages_model import warn_on_shortfall

    pool = _skewed_pool(n=1000, seed=3)
    pool = pd.concat([pool[pool["sex"] == "M"], pool[pool["sex"] == "F"].head(30)], ignore_index=True)
    margins = margins_from_dp(DP, _schema())  # asks 33 % women
    with caplog.at_level("WARNING", logger="dpsynth_core.tabular.pipeline"):
        warn_on_shortfall(calibrate_rows(pool, margins, 60, seed=0))  # 20 women asked, 30 in the pool
        assert not caplog.records
        warn_on_shortfall(calibrate_rows(pool, margins, 800, seed=0))  # 264 asked: 29 % of the release missing
    (record,) = caplog.records
    message = record.getMessage()
    assert f"the {len(pool)} generated rows lack 29%" in message and "DP table 'sex'" in message
    assert "800 released rows" in message and "pool_factor" in message
