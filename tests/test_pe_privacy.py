"""WASP / Aug-PE privacy: sensitivity of the vote histograms by brute force, sigma calibration against
an independent accountant, federated noise scaling, classes never chosen from private data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dpsynth_core.pe.dp import joint_topq_l2_sensitivity
from dpsynth_core.privacy.gaussian_histogram import (
    FederatedGaussianHistogram,
    GaussianHistogram,
    calibrate_histogram_noise,
)
from dpsynth_core.pe.histogram import NearestNeighborHistogram, TopQHistogram


def _random_case(rng: np.random.Generator, n_synth: int, n_priv: int, labels: list[str], dim: int = 4):
    synth = rng.normal(size=(n_synth, dim))
    synth_labels = [labels[i % len(labels)] for i in range(n_synth)]
    priv = rng.normal(size=(n_priv, dim))
    priv_labels = list(rng.choice(labels, size=n_priv))
    return synth, synth_labels, priv, priv_labels


def _max_neighbour_change(hist, priv, priv_labels, synth, synth_labels, extra, extra_labels) -> float:
    """Largest L2 change of the joint histogram over: removing each record of D, adding each
    candidate record of ``extra`` to D."""
    base = hist.compute(priv, priv_labels, synth, synth_labels).joint()
    worst = 0.0
    for i in range(len(priv)):  # remove record i
        keep = [j for j in range(len(priv)) if j != i]
        h = hist.compute(priv[keep], [priv_labels[j] for j in keep], synth, synth_labels).joint()
        worst = max(worst, float(np.linalg.norm(base - h)))
    for x, y in zip(extra, extra_labels):  # add record x
        h = hist.compute(np.vstack([priv, x[None]]), priv_labels + [y], synth, synth_labels).joint()
        worst = max(worst, float(np.linalg.norm(h - base)))
    return worst


@pytest.mark.parametrize("q", [1, 2, 3, 5, 8])
def test_topq_joint_sensitivity_brute_force(q):
    """Add/remove one record: the largest L2 change never exceeds sqrt(2 sum_{i<Q} 4^-i) and
    reaches it (every label has >= Q synthetic samples here)."""
    bound = math.sqrt(2.0 * sum(4.0**-i for i in range(q)))  # written out, independent of the library
    assert joint_topq_l2_sensitivity(q) == pytest.approx(bound, rel=1e-12)
    hist = TopQHistogram(q)
    assert hist.sensitivity == pytest.approx(bound, rel=1e-12)
    rng = np.random.default_rng(100 + q)
    labels = ["a", "b", "c"]
    worst_seen = 0.0
    for _ in range(4):
        synth, synth_labels, priv, priv_labels = _random_case(rng, n_synth=3 * max(q, 3) + 2, n_priv=7, labels=labels)
        extra = rng.normal(size=(5, synth.shape[1]))
        extra_labels = list(rng.choice(labels, size=5))
        worst = _max_neighbour_change(hist, priv, priv_labels, synth, synth_labels, extra, extra_labels)
        assert worst <= bound + 1e-12
        worst_seen = max(worst_seen, worst)
    assert worst_seen == pytest.approx(bound, rel=1e-9)  # attained


def test_topq_sensitivity_overlap_and_few_candidates():
    """Nearest and farthest sets overlapping (< 2Q candidates) leaves the norm at the bound; fewer
    than Q candidates of the voter's label gives strictly less; no candidate: no contribution."""
    q = 4
    hist = TopQHistogram(q)
    rng = np.random.default_rng(3)
    # label "a": 5 candidates (Q <= 5 < 2Q: the two sets overlap), label "b": 2 candidates, "c": none
    synth = rng.normal(size=(7, 3))
    synth_labels = ["a"] * 5 + ["b"] * 2
    priv = rng.normal(size=(6, 3))
    priv_labels = ["a", "a", "b", "b", "a", "b"]
    base = hist.compute(priv, priv_labels, synth, synth_labels).joint()
    for i, y in enumerate(priv_labels):
        keep = [j for j in range(len(priv)) if j != i]
        change = np.linalg.norm(base - hist.compute(priv[keep], [priv_labels[j] for j in keep], synth, synth_labels).joint())
        if y == "a":
            assert change == pytest.approx(hist.sensitivity, rel=1e-12)
        else:
            assert change == pytest.approx(math.sqrt(2 * (1 + 0.25)), rel=1e-12)  # only Q'=2 weights
            assert change < hist.sensitivity
    with_c = hist.compute(np.vstack([priv, rng.normal(size=(1, 3))]), priv_labels + ["c"], synth, synth_labels)
    assert np.array_equal(with_c.joint(), base)
    # each voter spends exactly sum of its weights in each half
    h = hist.compute(priv, priv_labels, synth, synth_labels)
    assert h.nearest.sum() == pytest.approx(3 * sum(2.0**-i for i in range(4)) + 3 * 1.5)
    assert h.farthest.sum() == pytest.approx(h.nearest.sum())


def test_topq_reference_bug_is_not_reproduced():
    """The reference wrote 2^(Q-1) (XOR in Python: 2^7 == 5); ours uses float powers."""
    hist = TopQHistogram(8)
    assert hist.weights[-1] == pytest.approx(2.0**-7)
    assert hist.sensitivity == pytest.approx(1.6329, abs=1e-4)
    assert hist.sensitivity < sum(2.0**-i for i in range(8)) * 2  # not an L1-style sum


def test_augpe_histogram_sensitivity_is_one():
    hist = NearestNeighborHistogram()
    assert hist.sensitivity == 1.0
    rng = np.random.default_rng(11)
    worst_seen = 0.0
    for _ in range(4):
        synth, synth_labels, priv, priv_labels = _random_case(rng, n_synth=9, n_priv=8, labels=["a", "b"])
        extra = rng.normal(size=(4, synth.shape[1]))
        worst = _max_neighbour_change(hist, priv, priv_labels, synth, synth_labels, extra, list(rng.choice(["a", "b"], size=4)))
        assert worst <= 1.0 + 1e-12
        worst_seen = max(worst_seen, worst)
    assert worst_seen == pytest.approx(1.0)


def _analytic_gaussian_delta(eps: float, mu: float) -> float:
    """Balle & Wang (2018) / Dong-Roth-Su mu-GDP profile, written out with scipy.stats."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize(("eps", "delta", "t"), [
    (4.0, 1.0 / (100 * math.log(100)), 2),  # the demo: M = 100, default delta
    (4.0, 1e-5, 5),
    (1.0, 1e-5, 10),
    (8.0, 1e-3, 1),
])
def test_sigma_calibration_matches_independent_accountants(eps, delta, t):
    nm = calibrate_histogram_noise(eps, delta, t)
    # 1. the analytic Gaussian profile of T-fold composition (mu = sqrt(T) / noise multiplier)
    mu = math.sqrt(t) / nm
    assert _analytic_gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-6)
    assert _analytic_gaussian_delta(eps, math.sqrt(t) / (nm * 0.98)) > delta  # 2% less noise: over budget
    # 2. Google's dp_accounting PLD accountant (pessimistic discretisation): same epsilon
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(nm), t)
    eps_pld = acc.get_epsilon(delta)
    assert eps - 1e-6 <= eps_pld <= eps + 5e-3
    # 3. RDP is looser (an upper bound): never below the exact value
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(nm), t)
    assert rdp.get_epsilon(delta) >= eps - 1e-6


def test_federated_noise_scaling():
    """Each of L parties adds N(0, (sigma/sqrt L)^2); the aggregate carries N(0, sigma^2); the sum of
    the parties' raw histograms is the central histogram."""
    nm, sens, parties = 1.7, joint_topq_l2_sensitivity(3), 4
    fed = FederatedGaussianHistogram(nm, sens, parties)
    central = GaussianHistogram(nm, sens)
    assert fed.sigma == pytest.approx(central.sigma)
    assert fed.party_sigma == pytest.approx(central.sigma / 2.0)
    rng = np.random.default_rng(0)
    zeros = [np.zeros(20_000) for _ in range(parties)]
    single = fed.party_release(zeros[0], rng)
    total = fed.aggregate(zeros, rng)
    assert np.std(single) == pytest.approx(fed.party_sigma, rel=0.03)
    assert np.std(total) == pytest.approx(fed.sigma, rel=0.03)
    assert abs(np.mean(total)) < 4 * fed.sigma / math.sqrt(len(total))
    with pytest.raises(Exception, match="expected 4 partial"):
        fed.aggregate(zeros[:3], rng)
    # decomposition: parties' raw vote histograms sum to the central one
    hist = TopQHistogram(3)
    synth, synth_labels, priv, priv_labels = _random_case(np.random.default_rng(5), 12, 10, ["a", "b"])
    whole = hist.compute(priv, priv_labels, synth, synth_labels).joint()
    part = np.arange(len(priv)) % parties
    pieces = [hist.compute(priv[part == j], [y for y, p in zip(priv_labels, part) if p == j], synth, synth_labels).joint()
              for j in range(parties)]
    assert np.allclose(np.sum(pieces, axis=0), whole)


def test_classes_are_required_not_read_from_private_counts(tmp_path):
    """Without data.classes the config is refused: picking the most frequent labels would depend
    on the private records."""
    from pydantic import ValidationError

    from dpsynth_core.pe.config import PEConfig

    with pytest.raises(ValidationError, match="data.classes is required"):
        PEConfig(method="wasp", data={"source": "biorxiv"})
    with pytest.raises(ValidationError, match="data.classes is required"):
        PEConfig(method="wasp", data={"source": "biorxiv", "classes": ["neuroscience"]})
    with pytest.raises(ValidationError, match="unique"):
        PEConfig(method="wasp", data={"source": "biorxiv", "classes": ["a", "a"]})
    with pytest.raises(ValidationError):  # the old count-based option is gone
        PEConfig(method="wasp", data={"source": "biorxiv", "num_classes": 5})
    cfg = PEConfig(method="augpe", data={"source": "biorxiv", "classes": ["neuroscience", "microbiology"]})
    assert cfg.data.classes == ["neuroscience", "microbiology"]


def test_errors_about_the_private_file_name_no_class_and_no_count(tmp_path):
    """A class absent from the private file, or one with too few rows for the held-out split, is an
    error naming the file and column: not the class (its absence is a fact about the private file)
    and not a count."""
    import pandas as pd

    from dpsynth_core.errors import DataError
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.data_split import split_data

    path = tmp_path / "private.csv"
    pd.DataFrame({"text": [f"record {i}" for i in range(9)], "label": ["cats"] * 7 + ["dogs"] * 2}).to_csv(path, index=False)
    for classes, num_test in ((["cats", "owls"], 2), (["cats", "dogs"], 4)):  # owls: none; dogs: 2 held out of 2
        cfg = PEConfig(method="wasp", data={"source": "file", "path": str(path), "text_col": "text", "label_col": "label",
                                            "classes": classes, "num_test": num_test, "num_private": 4})
        with pytest.raises(DataError, match=r"private.csv: column 'label': a (name in data.classes has no row|"
                                            r"class of data.classes has too few rows)") as err:
            split_data(cfg)
        assert not any(word in str(err.value) for word in ("owls", "dogs", "cats", " 2 ", " 7 ", " 0 "))


def test_delta_must_be_below_one_over_the_private_set_size(tmp_path):
    """An explicit delta >= 1/num_private is refused naming the field; the default is the paper's 1e-5
    (old code: 1/(M ln M) = 2.2e-3 at M = 100); the small-M rule is an option and uses the public
    num_private, never the size of the secretly drawn set."""
    from dpsynth_core.errors import ConfigError
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.pipeline import open_ledger
    data = {"source": "biorxiv", "classes": ["neuroscience", "microbiology"], "num_private": 12}
    with pytest.raises(ConfigError, match=r"field 'privacy.delta'.*not below 1/n"):
        open_ledger(PEConfig(method="wasp", data=data, delta=0.1), tmp_path / "a")
    (tmp_path / "b").mkdir()
    assert open_ledger(PEConfig(method="wasp", data=data), tmp_path / "b").delta == 1e-5
    (tmp_path / "c").mkdir()
    rule = PEConfig(method="wasp", data=data, delta="1/(M ln M)")
    assert open_ledger(rule, tmp_path / "c").delta == pytest.approx(1 / (12 * math.log(12)))
