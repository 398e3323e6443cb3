"""The sensitivity of the PE / WASP vote histograms (the Gaussian mechanism itself, its calibration and its
ledger event are ``privacy.gaussian_histogram``, shared with the tabular methods).

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
