"""The one Gaussian-histogram mechanism of the project: noisy counts and noisy votes.

Every histogram released under the Gaussian mechanism goes through :func:`noisy_histogram`:
DPFairLLM / AIM's ``dp_domain``, fairness statistics and DP marginals (integer counts, L2
sensitivity 1 per histogram) and the PE / WASP votes (weighted, real-valued). The noise is drawn
from a generator seeded with OS entropy (``randomness.secure_rng``; tests may pass their own), and
the release is accounted by the caller as a :class:`~dpsynth_core.privacy.events.GaussianEvent`
(T histograms = T compositions; exact, via mu-GDP / PLD).

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

import numpy as np


def noisy_histogram(values, sigma: float, rng: np.random.Generator | None = None, *,
                    integer_counts: bool) -> np.ndarray:
    """``values`` + N(0, sigma^2) per cell (float64, same shape); rounded when ``integer_counts``."""
    from dpsynth_core.privacy.randomness import secure_rng

    if not sigma > 0:
        raise ValueError(f"Gaussian histogram: sigma must be > 0, got {sigma}")
    h = np.asarray(values, dtype=np.float64)
    noisy = h + (rng if rng is not None else secure_rng()).normal(0.0, float(sigma), size=h.shape)
    return np.rint(noisy) if integer_counts else noisy


def histogram_event(epsilon: float, delta: float, histograms: int):
    """(sigma, ledger event) for ``histograms`` releases of L2 sensitivity 1 that together are
    (epsilon, delta)-DP."""
    from dpsynth_core.privacy import GaussianEvent, calibrate_gaussian_noise

    sigma = float(calibrate_gaussian_noise(epsilon, delta, compositions=histograms))
    return sigma, GaussianEvent(noise_multiplier=sigma, compositions=histograms)
