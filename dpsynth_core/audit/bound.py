"""The epsilon lower bound of a one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023).

m canaries are each included with probability 1/2; the auditor makes r guesses (abstaining on
the rest) and v of them are right. If the mechanism is (eps, delta)-DP, the chance of v or more
right guesses is at most  beta + alpha * 2 m delta, where (q = e^eps / (1 + e^eps), the accuracy
of eps-randomized response, and B ~ Binomial(r, q))

    beta  = P[B >= v]
    alpha = max_{1 <= i <= v}  P[v - i <= B < v] / i

(the paper's Theorem 5.2 and its Algorithm for approximate DP). The bound at confidence c is
the largest eps whose p-value is still below 1 - c: an (eps, delta) claim above it is refuted.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats


def _check_counts(m: int, r: int, v: int) -> None:
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[>= v correct of r guesses] under the null hypothesis that the mechanism is (epsilon, delta)-DP."""
    _check_counts(m, r, v)
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got {epsilon}, {delta}")
    if v == 0:
        return 1.0
    q = float(special.expit(epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0:
        return min(beta, 1.0)
    shifts = np.arange(1, v + 1)
    # P[v - i <= B < v] = P[B >= v - i] - P[B >= v]
    window = stats.binom.sf(v - shifts - 1, r, q) - beta
    alpha = float(np.max(window / shifts))
    return min(beta + alpha * 2 * m * delta, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """Largest epsilon refuted at ``confidence`` by v correct of r guesses on m canaries (0: none)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    significance = 1.0 - confidence
    _check_counts(m, r, v)

    def margin(eps: float) -> float:  # > 0 while (eps, delta)-DP is still refuted
        return significance - one_run_p_value(m, r, v, eps, delta)

    if margin(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while margin(hi) > 0:  # the p-value rises to P[B >= v] -> 1 as eps grows, so this ends
        lo, hi = hi, 2 * hi
        if hi > 1e3:
            return math.inf  # only possible with delta = 0 and every guess right at huge r
    return float(optimize.brentq(margin, lo, hi, xtol=1e-7))


def bound_by_guesses(ranked_membership: np.ndarray, m: int, delta: float, confidence: float = 0.95,
                     points: int = 40) -> list[dict]:
    """The bound when guessing the top r/2 "in" and the bottom r/2 "out", for a range of r.

    ``ranked_membership``: true membership (bool) of the canaries sorted by score, most
    member-like first. For the plot only: picking the best r after looking is not a valid bound.
    """
    ranked = np.asarray(ranked_membership, dtype=bool)
    half_max = len(ranked) // 2
    halves = sorted({max(1, int(round(x))) for x in np.linspace(1, half_max, min(points, half_max))})
    rows = []
    for k in halves:
        correct = int(ranked[:k].sum() + (~ranked[len(ranked) - k:]).sum())
        rows.append({"guesses": 2 * k, "correct": correct,
                     "epsilon_lower_bound": epsilon_lower_bound(m, 2 * k, correct, delta, confidence)})
    return rows


def largest_reachable_bound(m: int, r: int, delta: float, confidence: float = 0.95) -> float:
    """The bound when all r guesses are right: no run of this audit can refute a larger epsilon.
    An audit whose claimed epsilon is at or above it cannot fail, whatever the mechanism does."""
    return epsilon_lower_bound(m, r, r, delta, confidence)


def audit_status(lower_bound: float, claimed: float, reachable: float) -> str:
    """``failed``: the claim is refuted; ``inconclusive``: the audit could never have refuted it
    (the claimed epsilon is at or above the largest reachable bound); ``passed`` otherwise."""
    if lower_bound > claimed:
        return "failed"
    return "inconclusive" if reachable <= claimed else "passed"
