"""The one Gaussian-histogram mechanism of the project: noisy counts and noisy votes.

Every histogram released under the Gaussian mechanism goes through this module: DPFairLLM / AIM's
``dp_domain``, fairness statistics and DP marginals (integer counts, L2 sensitivity 1 per histogram)
and the PE / WASP votes (weighted, real-valued, the sensitivity of the vote rule: ``pe.dp``). Three
pieces, each tested on its own (tests/test_gaussian_histogram.py):

* the noise scale: :func:`calibrate_histogram_noise` -- the noise multiplier (sigma / L2 sensitivity)
  such that T histograms together are (epsilon, delta)-DP, exact (analytic Gaussian / mu-GDP);
* the ledger event: :meth:`GaussianHistogram.event` -- a
  :class:`~dpsynth_core.privacy.events.GaussianEvent` of that noise multiplier and T compositions;
* the release: :func:`noisy_histogram` -- values + N(0, sigma^2) per cell, sigma = noise multiplier x
  sensitivity, from a generator seeded with OS entropy (``randomness.secure_rng``; tests may pass their own).

Integer counts are released rounded to integers (post-processing): the low-order bits of a
floating-point Gaussian sample depend on the exact count it was added to (Mironov 2012's attack on
floating-point Laplace noise reads them), and a rounded count carries none of them. Why not
OpenDP's discrete Gaussian, which removes the issue at the source: its vector form is accounted in
zCDP (Canonne, Kamath & Steinke 2020 prove rho = Delta^2 / (2 sigma^2) only with an extra slack term
for vectors), so keeping the same (epsilon, delta) would need 7-8 % more noise per cell (epsilon 1-4 at
delta 1e-5) than the exact Gaussian accounting used here, and it does not apply to WASP's real-valued votes. See
docs/privacy.md.
"""

from __future__ import annotations

import math

import numpy as np

from dpsynth_core.privacy._validate import PrivacyParameterError
from dpsynth_core.privacy.events import GaussianEvent
from dpsynth_core.privacy.gaussian import calibrate_gaussian_noise
from dpsynth_core.privacy.randomness import secure_rng


def noisy_histogram(values, sigma: float, rng: np.random.Generator | None = None, *,
                    integer_counts: bool) -> np.ndarray:
    """``values`` + N(0, sigma^2) per cell (float64, same shape); rounded when ``integer_counts``."""
    if not sigma > 0:
        raise ValueError(f"Gaussian histogram: sigma must be > 0, got {sigma}")
    h = np.asarray(values, dtype=np.float64)
    noisy = h + (rng if rng is not None else secure_rng()).normal(0.0, float(sigma), size=h.shape)
    return np.rint(noisy) if integer_counts else noisy


def calibrate_histogram_noise(epsilon: float, delta: float, histograms: int) -> float:
    """Smallest noise multiplier (sigma / L2 sensitivity) such that ``histograms`` Gaussian releases
    are together (epsilon, delta)-DP (exact T-fold composition)."""
    if histograms < 1:
        raise PrivacyParameterError(f"Gaussian histogram: histograms must be >= 1, got {histograms}")
    return float(calibrate_gaussian_noise(epsilon, delta, compositions=histograms))


class GaussianHistogram:
    """Adds N(0, sigma^2) to every cell, ``sigma = noise_multiplier * sensitivity`` (L2 sensitivity of
    one record's contribution to the histogram)."""

    def __init__(self, noise_multiplier: float, sensitivity: float = 1.0, *, integer_counts: bool = False) -> None:
        if not (noise_multiplier > 0 and sensitivity > 0):
            raise PrivacyParameterError("Gaussian histogram: noise_multiplier and sensitivity must be > 0")
        self.noise_multiplier = float(noise_multiplier)
        self.sensitivity = float(sensitivity)
        self.integer_counts = integer_counts

    @classmethod
    def calibrated(cls, epsilon: float, delta: float, histograms: int, sensitivity: float = 1.0, *,
                   integer_counts: bool = False) -> GaussianHistogram:
        """The mechanism whose ``histograms`` releases are together (epsilon, delta)-DP."""
        return cls(calibrate_histogram_noise(epsilon, delta, histograms), sensitivity,
                   integer_counts=integer_counts)

    @property
    def sigma(self) -> float:
        return self.noise_multiplier * self.sensitivity

    def event(self, histograms: int) -> GaussianEvent:
        """What the ledger records for ``histograms`` releases of this mechanism."""
        return GaussianEvent(noise_multiplier=self.noise_multiplier, compositions=histograms)

    def privatize(self, histogram, rng: np.random.Generator | None = None) -> np.ndarray:
        """One release: histogram + Gaussian noise (float64 array, same shape)."""
        return noisy_histogram(histogram, self.sigma, rng, integer_counts=self.integer_counts)


class NoiselessHistogram:
    """epsilon = inf reference runs only (``not_private: true``; the ledger is marked): no noise."""

    noise_multiplier = 0.0
    sigma = 0.0

    def __init__(self, sensitivity: float = 1.0) -> None:
        self.sensitivity = float(sensitivity)

    def privatize(self, histogram, rng: np.random.Generator | None = None) -> np.ndarray:
        return np.asarray(histogram, dtype=np.float64).copy()


class FederatedGaussianHistogram(GaussianHistogram):
    """L parties each count their own records and add N(0, (sigma / sqrt(L))^2); the aggregator sums
    the noisy partial histograms, so the sum carries N(0, sigma^2) -- the central guarantee *provided*
    the aggregator only sees the sum (secure aggregation). One party's message alone is protected by
    sigma / sqrt(L) only."""

    def __init__(self, noise_multiplier: float, sensitivity: float, parties: int) -> None:
        super().__init__(noise_multiplier, sensitivity)
        if parties < 1:
            raise PrivacyParameterError(f"federated Gaussian histogram: parties must be >= 1, got {parties}")
        self.parties = int(parties)

    @property
    def party_sigma(self) -> float:
        return self.sigma / math.sqrt(self.parties)

    def party_release(self, partial, rng: np.random.Generator | None = None) -> np.ndarray:
        """What one party sends: its own histogram plus its share of the noise."""
        return noisy_histogram(partial, self.party_sigma, rng, integer_counts=False)

    def aggregate(self, partials: list, rng: np.random.Generator | None = None) -> np.ndarray:
        """Sum of every party's noisy release (noise std of the sum: sigma)."""
        if len(partials) != self.parties:
            raise PrivacyParameterError(
                f"federated Gaussian histogram: expected {self.parties} partial histograms, got {len(partials)}")
        return np.sum([self.party_release(p, rng) for p in partials], axis=0)


def histogram_event(epsilon: float, delta: float, histograms: int) -> tuple[float, GaussianEvent]:
    """(sigma, ledger event) for ``histograms`` releases of L2 sensitivity 1 that together are
    (epsilon, delta)-DP."""
    mechanism = GaussianHistogram.calibrated(epsilon, delta, histograms)
    return mechanism.sigma, mechanism.event(histograms)
