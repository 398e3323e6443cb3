"""tabular.dp_pooling: one (A, Y) table from every DP release of it."""

import numpy as np
import pytest

from dpsynth_core.tabular.dp_pooling import (
    Measurement,
    group_label_measurements,
    least_squares,
    pooled_group_label_counts,
)

GROUPS, LABELS = ["Female", "Male"], ["<=50K", ">50K"]
TRUE = np.array([267.0, 33.0, 490.0, 210.0])  # (Female, <=50K), (Female, >50K), (Male, <=50K), (Male, >50K)


def _release(x, fair_sigma, marg_sigma, rng, floor=0.0):
    noisy = lambda v, s: np.maximum(v + rng.normal(0, s, size=len(v)), floor)  # noqa: E731
    fair = noisy(x, fair_sigma)
    fair_counts = {a: {y: fair[2 * i + j] for j, y in enumerate(LABELS)} for i, a in enumerate(GROUPS)}
    table = x.reshape(2, 2)
    marginals = {
        "sex": {"kind": "categorical", "values": GROUPS, "counts": noisy(table.sum(1), marg_sigma).tolist()},
        "income": {"kind": "categorical", "values": LABELS, "counts": noisy(table.sum(0), marg_sigma).tolist()},
        "pairs": {"sex|income": {"columns": ["sex", "income"], "counts": noisy(x, marg_sigma).tolist()}},
    }
    return fair_counts, marginals


def _measurements(fair_counts, marginals, fair_sigma=42.5, marg_sigma=26.1):
    return group_label_measurements("sex", "income", GROUPS, LABELS, fair_counts=fair_counts, fair_sigma=fair_sigma,
                                    marginals=marginals, marginals_sigma=marg_sigma)


def test_noise_free_releases_give_the_table_back():
    fair, marginals = _release(TRUE, 0.0, 0.0, np.random.default_rng(0))
    ms = _measurements(fair, marginals)
    assert [m.source for m in ms] == ["dp_fair_stats", "dp_marginals 2-way", "dp_marginals 1-way sex",
                                      "dp_marginals 1-way income"]
    assert least_squares(ms) == pytest.approx(TRUE)


def test_two_direct_tables_are_weighted_by_their_inverse_variances():
    eye = np.eye(2)
    pooled = least_squares([Measurement("a", np.array([10.0, 0.0]), eye, 1.0),
                            Measurement("b", np.array([20.0, 5.0]), eye, 2.0)])
    assert pooled == pytest.approx([(10 * 4 + 20) / 5, (0 * 4 + 5) / 5])  # weights 1 / sigma^2: 4 and 1


def test_a_table_stored_label_first_is_read_in_group_first_order():
    fair, marginals = _release(TRUE, 0.0, 0.0, np.random.default_rng(0))
    flipped = dict(marginals, pairs={"income|sex": {"columns": ["income", "sex"],
                                                    "counts": TRUE.reshape(2, 2).T.ravel().tolist()}})
    two_way = [m for m in _measurements(None, flipped) if m.source == "dp_marginals 2-way"]
    assert two_way[0].values == pytest.approx(TRUE)


def test_pooled_group_rates_are_closer_to_the_truth_than_any_single_release():
    """At epsilon = 1's noise scales (fairness statistics sigma 42.5, marginals 26.1, Adult 1,000 rows):
    the female positive rate's error over 400 draws is smaller pooled than from either 2x2 table alone."""
    rng = np.random.default_rng(7)
    truth = TRUE[1] / (TRUE[0] + TRUE[1])
    err = {"fair": [], "marginals": [], "pooled": []}
    for _ in range(400):
        fair, marginals = _release(TRUE, 42.5, 26.1, rng, floor=0.5)
        rate = lambda c: c[1] / (c[0] + c[1])  # noqa: E731
        err["fair"].append(rate([fair["Female"][y] for y in LABELS]) - truth)
        err["marginals"].append(rate(np.maximum(marginals["pairs"]["sex|income"]["counts"][:2], 0.5)) - truth)
        pooled = pooled_group_label_counts(GROUPS, LABELS, _measurements(fair, marginals))
        err["pooled"].append(rate([pooled["Female"][y] for y in LABELS]) - truth)
    rmse = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in err.items()}
    assert rmse["pooled"] < 0.85 * min(rmse["fair"], rmse["marginals"]), rmse


def test_a_source_without_its_noise_scale_or_table_is_left_out():
    fair, marginals = _release(TRUE, 0.0, 0.0, np.random.default_rng(0))
    assert [m.source for m in _measurements(fair, marginals, marg_sigma=None)] == ["dp_fair_stats"]
    no_pair = {k: v for k, v in marginals.items() if k != "pairs"}
    assert [m.source for m in _measurements(fair, no_pair, fair_sigma=None)] == ["dp_marginals 1-way sex",
                                                                                "dp_marginals 1-way income"]
    binned = dict(marginals, sex={"kind": "categorical", "values": ["Male", "Female"], "counts": [1.0, 2.0]})
    assert "dp_marginals 1-way sex" not in [m.source for m in _measurements(fair, binned)]  # other cell order: not used


def test_bad_measurements_are_refused():
    eye = np.eye(2)
    with pytest.raises(ValueError, match="no measurement"):
        least_squares([])
    with pytest.raises(ValueError, match="does not fit"):
        least_squares([Measurement("a", np.zeros(3), eye, 1.0)])
    with pytest.raises(ValueError, match="positive and finite"):
        least_squares([Measurement("a", np.zeros(2), eye, 0.0)])
    with pytest.raises(ValueError, match="do not determine"):  # row sums alone: the cells are not identified
        least_squares([Measurement("a", np.zeros(1), np.ones((1, 2)), 1.0)])


def test_pooled_counts_are_floored():
    eye = np.eye(4)
    pooled = pooled_group_label_counts(GROUPS, LABELS, [Measurement("a", np.array([-30.0, 5.0, 10.0, 1.0]), eye, 1.0)])
    assert pooled["Female"]["<=50K"] == 0.5 and pooled["Male"][">50K"] == 1.0
