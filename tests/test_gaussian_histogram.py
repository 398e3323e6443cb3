"""The one Gaussian-histogram mechanism (privacy.gaussian_histogram), Opacus-style: its noise scale, its
ledger event and the sensitivity it assumes, each checked against something computed independently."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsynth_core.privacy import PrivacyLedger, PrivacyParameterError, gaussian_epsilon
from dpsynth_core.privacy.gaussian_histogram import (
    FederatedGaussianHistogram,
    GaussianHistogram,
    NoiselessHistogram,
    calibrate_histogram_noise,
    histogram_event,
    noisy_histogram,
)


@pytest.mark.parametrize(("eps", "delta", "t"), [(1.0, 1e-5, 1), (4.0, 1e-5, 5), (2.0, 1e-3, 12)])
def test_noise_scale_is_the_smallest_that_meets_the_budget(eps, delta, t):
    nm = calibrate_histogram_noise(eps, delta, t)
    assert gaussian_epsilon(nm, t, delta) <= eps
    assert gaussian_epsilon(nm * 0.99, t, delta) > eps  # 1 % less noise: over budget
    # T releases at noise multiplier s are one release at s / sqrt(T) (mu-GDP composes in quadrature)
    assert calibrate_histogram_noise(eps, delta, 1) * math.sqrt(t) == pytest.approx(nm, rel=1e-6)


def test_sigma_scales_with_the_sensitivity_and_the_draws_have_that_std():
    mech = GaussianHistogram(1.5, sensitivity=2.0)
    assert mech.sigma == 3.0
    noise = mech.privatize(np.zeros(40_000), np.random.default_rng(0))
    assert np.std(noise) == pytest.approx(3.0, rel=0.02)  # 40k draws: std error of the std ~0.35 %
    assert abs(np.mean(noise)) < 4 * 3.0 / math.sqrt(noise.size)


def test_count_histograms_have_l2_sensitivity_one():
    """Brute force over every record that could be added: a count histogram moves by exactly 1 in one
    cell, so the default sensitivity (1) is the L2 sensitivity of integer counts."""
    data = np.array([0, 2, 2, 3, 1, 0])
    before = np.bincount(data, minlength=4)
    norms = [np.linalg.norm(np.bincount(np.append(data, x), minlength=4) - before) for x in range(4)]
    assert max(norms) == 1.0 == GaussianHistogram(1.0).sensitivity


def test_ledger_event_carries_the_noise_multiplier_and_spends_exactly_the_budget(tmp_path):
    eps, delta, t = 2.0, 1e-5, 3
    mech = GaussianHistogram.calibrated(eps, delta, t, sensitivity=1.633)
    event = mech.event(t)
    assert (event.kind, event.noise_multiplier, event.compositions) == ("gaussian", mech.noise_multiplier, t)
    assert mech.sigma == pytest.approx(mech.noise_multiplier * 1.633)  # sensitivity scales sigma, not the event
    ledger = PrivacyLedger.create(tmp_path, "toy", 8.0, delta)
    ledger.record("votes", event)
    assert ledger.total_epsilon() == pytest.approx(eps, abs=2e-3)  # PLD of the ledger vs the exact calibration
    sigma, same = histogram_event(eps, delta, t)
    assert same == event and sigma == pytest.approx(mech.noise_multiplier)


def test_integer_counts_are_rounded_and_draws_come_from_os_entropy():
    counts = np.array([3.0, 0.0, 7.0])
    a, b = GaussianHistogram(2.0, integer_counts=True).privatize(counts), noisy_histogram(counts, 2.0, integer_counts=True)
    assert np.array_equal(a, np.rint(a)) and np.array_equal(b, np.rint(b))
    assert not np.array_equal(noisy_histogram(np.zeros(64), 1.0, integer_counts=False),
                              noisy_histogram(np.zeros(64), 1.0, integer_counts=False))
    assert np.array_equal(NoiselessHistogram(1.0).privatize(counts), counts)


def test_federated_parties_share_the_noise():
    fed = FederatedGaussianHistogram(2.0, 1.0, parties=4)
    assert fed.party_sigma == pytest.approx(1.0) and fed.event(2) == GaussianHistogram(2.0).event(2)
    total = fed.aggregate([np.zeros(20_000)] * 4, np.random.default_rng(1))
    assert np.std(total) == pytest.approx(fed.sigma, rel=0.03)
    with pytest.raises(PrivacyParameterError, match="expected 4"):
        fed.aggregate([np.zeros(3)] * 3)


@pytest.mark.parametrize("bad", [dict(noise_multiplier=0.0), dict(noise_multiplier=1.0, sensitivity=-1.0)])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(PrivacyParameterError):
        GaussianHistogram(**bad)
    with pytest.raises(PrivacyParameterError, match="histograms must be >= 1"):
        calibrate_histogram_noise(1.0, 1e-5, 0)
