"""Gaussian mechanism on PE / WASP vote histograms, its sensitivity, and sigma calibration.

Sensitivity of the joint (nearest, farthest) Top-Q histogram (WASP)
-------------------------------------------------------------------
Neighbouring private sets differ by adding or removing one record ``x`` (add/remove DP).
Each private record votes independently of all other private records: its vote depends only on
``x`` itself and on the *synthetic* samples (public at this point). So the joint histogram is a
sum of per-record contributions, ``H(D) = sum_{x in D} c(x)``, and for neighbours
``H(D + x) - H(D) = c(x)``. The L2 sensitivity is therefore ``max_x ||c(x)||_2``.

``c(x) = (n(x), f(x))`` concatenates two vectors indexed by the synthetic samples:
``n(x)`` puts weight ``2^-i`` on the ``i``-th nearest synthetic sample of x's label
(i = 0..Q-1) and ``f(x)`` puts weight ``2^-i`` on the ``i``-th farthest one. Within each vector
the Q samples are distinct, so the entries do not stack:

    ||n(x)||_2^2 = sum_{i<Q} (2^-i)^2 = sum_{i<Q} 4^-i        (same for f(x))
    ||c(x)||_2   = sqrt(||n(x)||^2 + ||f(x)||^2) = sqrt(2 * sum_{i<Q} 4^-i)
                 = sqrt(2 * (4/3) * (1 - 4^-Q))  -> sqrt(8/3) ~ 1.633 as Q grows.

(Nearest and farthest sets may overlap when a label has fewer than 2Q synthetic samples; they
live in different halves of the joint vector, so this does not change the norm.) The bound is
attained by any record whose label has at least Q synthetic samples; a label with fewer
candidates gives a smaller norm. Q = 8 gives 1.6329.

The reference implementation computes ``2^(Q-1)`` in Python, which is XOR (``2 ^ 7 == 5``), and
sums weights L1-style; neither is the L2 sensitivity of this mechanism.

The Aug-PE nearest-neighbour histogram (each record votes 1 for one synthetic sample) has L2
sensitivity 1.

Noise: T iterations each release one noisy joint histogram, i.e. T compositions of a Gaussian
mechanism with noise multiplier ``sigma / sensitivity``; the privacy core accounts this exactly
(GDP: mu = sqrt(T) / noise_multiplier).
"""

from __future__ import annotations

import math

import numpy as np

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.gaussian_histogram import noisy_histogram


def topq_weights(q: int) -> np.ndarray:
    """Vote weights 1, 1/2, ..., 2^-(Q-1) (float powers, never the XOR operator)."""
    if q < 1:
        raise ConfigError(f"top-Q histogram: q must be >= 1, got {q}")
    return np.power(2.0, -np.arange(q, dtype=np.float64))


def joint_topq_l2_sensitivity(q: int) -> float:
    """L2 sensitivity of the joint (nearest, farthest) Top-Q histogram: sqrt(2 * sum_{i<Q} 4^-i).

    See the module docstring for the derivation (add/remove one private record)."""
    w = topq_weights(q)
    return float(math.sqrt(2.0 * float(np.sum(w * w))))


def nearest_neighbor_l2_sensitivity() -> float:
    """L2 sensitivity of the Aug-PE histogram: one vote of weight 1 per private record."""
    return 1.0


def calibrate_noise_multiplier(epsilon: float, delta: float, iterations: int) -> float:
    """Noise multiplier (sigma / sensitivity) so that ``iterations`` releases are (eps, delta)-DP.

    Composition of Gaussian mechanisms, accounted exactly by :mod:`dpsynth_core.privacy`."""
    from dpsynth_core.privacy import calibrate_gaussian_noise

    if iterations < 1:
        raise ConfigError(f"private evolution: iterations must be >= 1, got {iterations}")
    return float(calibrate_gaussian_noise(epsilon, delta, compositions=iterations))


class GaussianMechanism:
    """Adds N(0, sigma^2) to every histogram bin, ``sigma = noise_multiplier * sensitivity``."""

    def __init__(self, noise_multiplier: float, sensitivity: float) -> None:
        if noise_multiplier <= 0 or sensitivity <= 0:
            raise ConfigError("Gaussian mechanism: noise_multiplier and sensitivity must be > 0")
        self.noise_multiplier = float(noise_multiplier)
        self.sensitivity = float(sensitivity)

    @property
    def sigma(self) -> float:
        return self.noise_multiplier * self.sensitivity

    def privatize(self, histogram: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One release: histogram + Gaussian noise (float64 array, same shape)."""
        return noisy_histogram(histogram, self.sigma, rng, integer_counts=False)  # weighted votes: not integers


class NoiselessMechanism:
    """epsilon = inf reference runs only (``not_private: true``; the ledger is marked): no noise."""

    noise_multiplier = 0.0
    sigma = 0.0

    def __init__(self, sensitivity: float) -> None:
        self.sensitivity = float(sensitivity)

    def privatize(self, histogram: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(histogram, dtype=np.float64).copy()


class FederatedGaussianMechanism(GaussianMechanism):
    """L parties each vote on their own records and add N(0, (sigma / sqrt(L))^2); the noisy
    partial histograms are summed by the aggregator, so the sum carries N(0, sigma^2) total noise
    -- the same guarantee as the central mechanism *provided* the aggregator only sees the sum
    (secure aggregation). A single party's message on its own is protected by sigma/sqrt(L) only."""

    def __init__(self, noise_multiplier: float, sensitivity: float, parties: int) -> None:
        super().__init__(noise_multiplier, sensitivity)
        if parties < 1:
            raise ConfigError(f"federated mechanism: parties must be >= 1, got {parties}")
        self.parties = int(parties)

    @property
    def party_sigma(self) -> float:
        return self.sigma / math.sqrt(self.parties)

    def party_release(self, partial: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """What one party sends: its own histogram plus its share of the noise."""
        return noisy_histogram(partial, self.party_sigma, rng, integer_counts=False)

    def aggregate(self, partials: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        """Sum of every party's noisy release (noise std of the sum: sigma)."""
        if len(partials) != self.parties:
            raise ConfigError(f"federated mechanism: expected {self.parties} partial histograms, got {len(partials)}")
        return np.sum([self.party_release(p, rng) for p in partials], axis=0)
