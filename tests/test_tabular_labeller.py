"""Labels from the DP (column, target) tables (tabular.labeller): the score, the ranking, the pipeline hook."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.labeller import naive_bayes_log_odds, rank_labels, relabel_from_dp_tables
from dpsynth_core.tabular.schema import TableSchema

SCHEMA = TableSchema.model_validate({"columns": [
    {"name": "age", "type": "numeric", "min": 0, "max": 100},
    {"name": "job", "type": "categorical", "categories": ["clerk", "exec"]},
    {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
    {"name": "income", "type": "categorical", "categories": ["<=50K", ">50K"]},
], "target": "income", "sensitive": ["sex"], "positive_label": ">50K", "name": "toy"})

# A DP release: older people and executives earn more; men earn more (the table fairness leaves out).
DP = {
    "age": {"kind": "numeric", "edges": [0, 25, 50, 75, 100], "counts": [300.0, 400.0, 250.0, 50.0]},
    "job": {"kind": "categorical", "values": ["clerk", "exec"], "counts": [700.0, 300.0]},
    "sex": {"kind": "categorical", "values": ["F", "M"], "counts": [330.0, 670.0]},
    "income": {"kind": "categorical", "values": ["<=50K", ">50K"], "counts": [750.0, 250.0]},
    "pairs": {  # counts row-major: the column's cells x (<=50K, >50K); one noisy cell clamped to 0
        "age|income": {"columns": ["age", "income"], "counts": [290.0, 10.0, 300.0, 100.0, 140.0, 110.0, 20.0, 30.0]},
        "job|income": {"columns": ["job", "income"], "counts": [620.0, 80.0, 130.0, 170.0]},
        "sex|income": {"columns": ["sex", "income"], "counts": [300.0, 0.0, 450.0, 220.0]},
    },
}


def _rows(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Generated rows whose labels carry no signal (what a few DP-SGD steps give)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"age": rng.uniform(18, 90, n).round(), "job": rng.choice(["clerk", "exec"], n),
                         "sex": rng.choice(["F", "M"], n), "income": rng.choice(["<=50K", ">50K"], n)})


def test_naive_bayes_score_orders_rows_by_the_tables():
    rows = pd.DataFrame({"age": [20, 60, 60, 60], "job": ["clerk", "clerk", "exec", "exec"], "sex": ["M", "M", "M", "F"],
                         "income": ["<=50K"] * 4})
    s = naive_bayes_log_odds(rows, DP, "income", ">50K")
    assert s[0] < s[1] < s[2]  # older, then older and an executive
    assert s[3] < s[2]  # with the sex table, a woman scores lower (that table's noisy 0 is floored, not -inf)
    assert np.isfinite(s).all()
    # each term is the table's log-likelihood ratio: the young clerk's score by hand
    by_hand = (np.log(251 / 751) + np.log((11 / 254) / (291 / 754))  # prior; age in [0, 25)
               + np.log((81 / 252) / (621 / 752)) + np.log((221 / 222) / (451 / 752)))  # clerk; man
    assert s[0] == pytest.approx(by_hand)
    # skipping the sensitive table: the two executives of age 60 differ only in sex, and tie
    t = naive_bayes_log_odds(rows, DP, "income", ">50K", skip=("sex",))
    assert t[2] == pytest.approx(t[3])


def test_prior_rows_shrink_a_sparse_noisy_cell_and_leave_a_full_one_its_say():
    """label_prior: pseudo-rows in the label's shares pull each table's log-likelihood ratio towards 0,
    most where the cell holds few rows: noisy counts of 6 against 2 no longer outweigh a cell of 250."""
    dp = {**DP, "pairs": {"age|income": {"columns": ["age", "income"],  # the last bin: 2 vs 6, pure noise at sd 17
                                         "counts": [290.0, 10.0, 300.0, 100.0, 140.0, 110.0, 2.0, 6.0]}}}
    rows = pd.DataFrame({"age": [10, 60, 90], "job": "clerk", "sex": "M", "income": "<=50K"})
    raw = naive_bayes_log_odds(rows, dp, "income", ">50K")
    shrunk = naive_bayes_log_odds(rows, dp, "income", ">50K", prior_rows=17.0)
    prior = np.log(251 / 751)
    term = lambda s: s - prior  # noqa: E731  (one table: the score is the prior plus its term)
    assert term(raw)[2] > term(raw)[1] > 0 > term(raw)[0]  # raw: the empty old bin says "rich" loudest
    assert term(shrunk)[1] > term(shrunk)[2] > 0  # shrunk: the full bin [50, 75) outranks it
    assert abs(term(shrunk)[2]) < 0.5 * abs(term(raw)[2])  # the sparse cell moved most ...
    assert abs(term(shrunk)[1]) > 0.8 * abs(term(raw)[1])  # ... the 250-row one little
    # by hand: pseudo-rows 17 x P(y) per cell, P(y) from the label's marginal (+1 as before)
    p_y = np.array([751.0, 251.0]) / 1002.0
    cells = np.array(dp["pairs"]["age|income"]["counts"]).reshape(-1, 2) + 1.0 + 17.0 * p_y
    given = cells / cells.sum(0)
    assert term(shrunk)[2] == pytest.approx(np.log(given[3, 1] / given[3, 0]))
    np.testing.assert_allclose(naive_bayes_log_odds(rows, dp, "income", ">50K", prior_rows=0.0), raw)


def test_rank_labels_take_the_rate_of_each_group_from_the_top():
    scores = np.array([5.0, 1.0, 4.0, 0.0, 3.0, 2.0, -1.0, 6.0])
    assert rank_labels(scores, 0.25).tolist() == [True, False, False, False, False, False, False, True]
    groups = np.array(["a", "a", "a", "a", "b", "b", "b", "b"])
    assert rank_labels(scores, 0.5, groups).tolist() == [True, False, True, False, True, False, False, True]
    picked = rank_labels(scores, {"a": 0.25, "b": 0.75}, groups)
    assert picked.tolist() == [True, False, False, False, True, True, False, True]
    assert not rank_labels(scores, 0.0).any() and rank_labels(scores, 1.0).all()


def test_weighted_rank_labels_cut_where_the_weighted_group_reaches_the_rate():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    assert rank_labels(scores, 0.25).sum() == 1  # round(1.25)
    heavy_tail = np.array([1.0, 1.0, 1.0, 1.0, 4.0])  # weight 8: the top two rows are a quarter of it
    assert rank_labels(scores, 0.25, weights=heavy_tail).tolist() == [True, True, False, False, False]
    heavy_top = np.array([4.0, 1.0, 1.0, 1.0, 1.0])  # the top row alone is half
    assert rank_labels(scores, 0.5, weights=heavy_top).tolist() == [True, False, False, False, False]
    assert rank_labels(scores, 0.3, weights=heavy_top).tolist() == [True, False, False, False, False]  # 4 nearer 2.4 than 0
    assert not rank_labels(scores, 0.1, weights=heavy_top).any()  # 0 nearer 0.8 than 4
    assert rank_labels(scores, 1.0, weights=heavy_top).all()


def test_label_cut_raked_takes_each_groups_rate_on_the_raked_pool(tmp_path, monkeypatch):
    """calibrate.label_cut: raked — the pool (uniform ages, job independent of sex) is far from the DP
    feature tables (few old people, who score high; men mostly executives): each sex's cut is taken where
    the pool raked to those tables reaches the DP rate (0.25), not where the pool's own rows do."""
    from dpsynth_core.tabular import calibrate, stages_dp, stages_model
    from dpsynth_core.tabular.config import DpFairConfig

    release = json.loads(json.dumps(DP))
    release["pairs"]["job|sex"] = {"columns": ["job", "sex"], "counts": [290.0, 410.0, 40.0, 260.0]}  # (clerk, exec) x (F, M)
    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(release))
    pool = _rows(900, seed=3)
    features = calibrate.margins_from_dp(release, SCHEMA)[:3] + calibrate.pair_margins_from_dp(release, SCHEMA, skip=("sex",))[2:]
    assert [m.name for m in features] == ["age", "job", "sex", "job|sex"]
    weights, _ = calibrate.rake(pool, features)
    relabelled = {}
    real_calibrate_rows = calibrate.calibrate_rows

    def keep_pool(frame, *args, **kw):  # the pool as relabelled, before raking and selection
        relabelled[cut] = frame["income"].eq(">50K").to_numpy()
        return real_calibrate_rows(frame, *args, **kw)

    monkeypatch.setattr(calibrate, "calibrate_rows", keep_pool)
    for cut in ("pool", "raked"):
        cfg = DpFairConfig.model_validate({
            "name": "t", "output_dir": str(tmp_path), "epsilon": 1.0, "budget": {"marginals": 0.2},
            "recipe": "none", "fairness": {"sensitive": "sex"}, "generation": {
                "num_rows": 200, "fairness": {"enabled": True, "sensitive": "sex"},
                "calibrate": {"enabled": True, "pairs_with_target": True, "pairs_with_sensitive": True,
                              "labels": "dp_tables", "label_cut": cut}}})
        stages_model._calibrate(cfg, tmp_path, SCHEMA, pool)
    men = pool["sex"].eq("M").to_numpy()
    assert relabelled["raked"][men].sum() > relabelled["pool"][men].sum() + 50  # 192 vs 107 of 447 men: down-weighted old rows
    for group in (men, ~men):
        assert abs(weights[group & relabelled["raked"]].sum() / weights[group].sum() - 0.25) < 0.02
        assert abs(relabelled["pool"][group].mean() - 0.25) < 0.01  # the pool's cut: the rate of its own rows


def test_relabelled_rows_carry_the_released_dependence_at_the_dp_rate():
    rows = _rows()
    out = relabel_from_dp_tables(rows, DP, "income", ">50K")
    rich = out["income"] == ">50K"
    assert rich.mean() == pytest.approx(0.25, abs=0.005)  # the DP marginal's share, not the rows' ~50 %
    assert out.loc[rich, "age"].mean() > out.loc[~rich, "age"].mean() + 5
    assert (out.loc[rich, "job"] == "exec").mean() > 0.6 > (out.loc[~rich, "job"] == "exec").mean()
    assert out.drop(columns="income").equals(rows.drop(columns="income"))  # only the label changes
    assert rows["income"].eq(">50K").mean() > 0.4  # the input is left alone


def test_fair_relabelling_ranks_within_each_group_and_ignores_the_sensitive_table():
    rows = _rows()
    unfair = relabel_from_dp_tables(rows, DP, "income", ">50K")
    rate = lambda f, g: float((f.loc[f.sex == g, "income"] == ">50K").mean())  # noqa: E731
    assert rate(unfair, "M") - rate(unfair, "F") > 0.2  # the sex table pushes men up
    fair = relabel_from_dp_tables(rows, DP, "income", ">50K", skip=("sex",), group_by=("sex",))
    assert abs(rate(fair, "M") - rate(fair, "F")) < 0.01 and rate(fair, "F") == pytest.approx(0.25, abs=0.01)
    targeted = relabel_from_dp_tables(rows, DP, "income", ">50K", skip=("sex",), group_by=("sex",),
                                      rates={"F": 0.2, "M": 0.3})
    assert rate(targeted, "F") == pytest.approx(0.2, abs=0.01) and rate(targeted, "M") == pytest.approx(0.3, abs=0.01)


def test_a_multiclass_target_is_refused():
    three = {**DP, "income": {"kind": "categorical", "values": ["low", "mid", "high"], "counts": [1.0, 1.0, 1.0]}}
    with pytest.raises(ConfigError, match="binary target"):
        relabel_from_dp_tables(_rows(), three, "income", "high")


def test_labels_from_dp_tables_need_the_pair_release():
    from pydantic import ValidationError

    from dpsynth_core.tabular.config import CalibrationSettings

    with pytest.raises(ValidationError, match="pairs_with_target"):
        CalibrationSettings(enabled=True, labels="dp_tables")
    assert CalibrationSettings(enabled=True, labels="dp_tables", pairs_with_target=True).labels == "dp_tables"


def test_the_pipeline_relabels_the_pool_before_raking_and_selection(tmp_path, monkeypatch):
    """stages_model._calibrate with labels: dp_tables — the released rows' labels follow the DP tables at
    parity, the generator's labels (pure noise here) are gone; with 'generator' they are kept."""
    from dpsynth_core.tabular import stages_dp, stages_model
    from dpsynth_core.tabular.config import DpFairConfig

    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(DP))
    pool = _rows(900, seed=1)
    base = {"name": "t", "output_dir": str(tmp_path), "epsilon": 1.0, "budget": {"marginals": 0.2},
            "recipe": "none", "fairness": {"sensitive": "sex"}}
    gen = {"num_rows": 200, "fairness": {"enabled": True, "sensitive": "sex"},
           "calibrate": {"enabled": True, "pairs_with_target": True, "labels": "dp_tables"}}
    cfg = DpFairConfig.model_validate({**base, "generation": gen})
    released = stages_model._calibrate(cfg, tmp_path, SCHEMA, pool).frame
    assert len(released) == 200
    rich = released["income"] == ">50K"
    assert released.loc[rich, "age"].mean() > released.loc[~rich, "age"].mean() + 10
    rates = released.groupby("sex")["income"].apply(lambda s: (s == ">50K").mean())
    assert abs(rates["M"] - rates["F"]) < 0.08
    kept = DpFairConfig.model_validate({**base, "generation": {**gen, "calibrate": {**gen["calibrate"], "labels": "generator"}}})
    plain = stages_model._calibrate(kept, tmp_path, SCHEMA, pool).frame
    rich = plain["income"] == ">50K"
    assert abs(plain.loc[rich, "age"].mean() - plain.loc[~rich, "age"].mean()) < 8  # the pool's labels: no signal


def test_label_prior_is_counted_in_the_marginals_noise_sd_the_ledger_recorded(tmp_path, monkeypatch):
    """calibrate.label_prior: k pseudo-rows per cell in units of the dp_marginals release's noise sd, read
    from the run's ledger; a ledger without that release is a clear error, not a silent 0."""
    from dpsynth_core.privacy import GaussianEvent, PrivacyLedger
    from dpsynth_core.tabular import labeller, stages_dp, stages_model
    from dpsynth_core.tabular.config import DpFairConfig

    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(DP))
    base = {"name": "t", "output_dir": str(tmp_path), "epsilon": 1.0, "budget": {"marginals": 0.2},
            "recipe": "none", "fairness": {"sensitive": "sex"},
            "generation": {"num_rows": 100, "fairness": {"enabled": True, "sensitive": "sex"},
                           "calibrate": {"enabled": True, "pairs_with_target": True, "labels": "dp_tables",
                                         "label_prior": 2.0}}}
    cfg = DpFairConfig.model_validate(base)
    seen = []
    real = labeller.naive_bayes_log_odds
    monkeypatch.setattr(labeller, "naive_bayes_log_odds", lambda *a, **k: seen.append(a[-1]) or real(*a, **k))
    ledger = PrivacyLedger.create(tmp_path, "toy", 1.0, 1e-5)
    with pytest.raises(ConfigError, match="no noise scale for stage 'dp_marginals'"):
        stages_model._calibrate(cfg, tmp_path, SCHEMA, _rows(300))
    ledger.record("dp_marginals", GaussianEvent(noise_multiplier=20.0, compositions=4), details={"sigma": 20.0})
    stages_model._calibrate(cfg, tmp_path, SCHEMA, _rows(300))
    assert seen == [40.0]


def test_pairs_with_sensitive_keep_the_proxy_tie_with_labels_at_parity(tmp_path):
    """calibrate.pairs_with_sensitive: the pool (job independent of sex, as a few DP-SGD steps write it) is
    raked to the DP (job, sex) table, so the released men are mostly executives as in the data, while the
    labels ranked within each sex stay at parity; without that table the tie is not there."""
    from dpsynth_core.tabular import stages_dp, stages_model
    from dpsynth_core.tabular.config import DpFairConfig

    release = json.loads(json.dumps(DP))
    release["pairs"]["job|sex"] = {"columns": ["job", "sex"], "counts": [290.0, 410.0, 40.0, 260.0]}  # (clerk, exec) x (F, M)
    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(release))
    pool = _rows(900, seed=2)
    cal = {"enabled": True, "pairs_with_target": True, "pairs_with_sensitive": True, "labels": "dp_tables"}
    base = {"name": "t", "output_dir": str(tmp_path), "epsilon": 1.0, "budget": {"marginals": 0.2},
            "recipe": "none", "fairness": {"sensitive": "sex"},
            "generation": {"num_rows": 200, "fairness": {"enabled": True, "sensitive": "sex"}, "calibrate": cal}}

    def exec_share_gap(frame):
        share = frame.groupby("sex")["job"].apply(lambda s: (s == "exec").mean())
        return share["M"] - share["F"]

    data_gap = 260 / 670 - 40 / 330  # 0.27
    released = stages_model._calibrate(DpFairConfig.model_validate(base), tmp_path, SCHEMA, pool).frame
    rates = released.groupby("sex")["income"].apply(lambda s: (s == ">50K").mean())
    assert abs(rates["M"] - rates["F"]) < 0.08
    release["pairs"].pop("job|sex")
    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(release))
    plain = stages_model._calibrate(DpFairConfig.model_validate(base), tmp_path, SCHEMA, pool).frame
    # measured: 0.21 with the table, 0.11 without (the (job, income) tables and parity alone tie them a little)
    assert abs(exec_share_gap(released) - data_gap) < 0.1
    assert abs(exec_share_gap(released) - data_gap) < abs(exec_share_gap(plain) - data_gap) - 0.05


def test_label_temperature_keeps_the_rates_and_loosens_the_tie_to_the_features():
    rows = _rows(2000, seed=3)
    gap = lambda f: f.loc[f.income == ">50K", "age"].mean() - f.loc[f.income != ">50K", "age"].mean()  # noqa: E731
    gaps = []
    for t in (0.0, 1.0, 100.0):
        out = relabel_from_dp_tables(rows, DP, "income", ">50K", skip=("sex",), group_by=("sex",), temperature=t, seed=1)
        assert (out.income == ">50K").mean() == pytest.approx(0.25, abs=0.005)  # same rate at every temperature
        gaps.append(gap(out))
    assert gaps[0] > gaps[1] > gaps[2] and abs(gaps[2]) < 3  # very hot: labels almost independent of age
    again = relabel_from_dp_tables(rows, DP, "income", ">50K", temperature=1.0, seed=1)
    assert again.equals(relabel_from_dp_tables(rows, DP, "income", ">50K", temperature=1.0, seed=1))
