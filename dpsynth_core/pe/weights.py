"""WASP's PLM weights: each PLM's share of the generation budget follows the (noisy) votes its
samples received. Pure post-processing of DP histograms."""

from __future__ import annotations

import numpy as np


def update_plm_weights(
    noisy_votes: np.ndarray, plm_ids: list[int], num_plms: int, previous: np.ndarray | None = None,
    momentum: float = 0.0, floor: float = 0.0,
) -> np.ndarray:
    """w_k proportional to the (clipped at 0) noisy nearest votes of PLM k's samples.

    ``momentum`` mixes in the previous weights (0 = votes only); ``floor`` keeps every PLM at
    least that share before renormalising, so a PLM is never starved by noise alone.
    Always returns non-negative weights summing to 1 (uniform when no PLM got a positive vote).
    """
    votes = np.maximum(np.asarray(noisy_votes, dtype=np.float64), 0.0)
    ids = np.asarray(plm_ids, dtype=np.int64)
    per_plm = np.bincount(ids, weights=votes, minlength=num_plms)[:num_plms] if len(ids) else np.zeros(num_plms)
    w = per_plm / per_plm.sum() if per_plm.sum() > 0 else np.full(num_plms, 1.0 / num_plms)
    if previous is not None and momentum > 0:
        w = momentum * np.asarray(previous, dtype=np.float64) + (1 - momentum) * w
    if floor > 0:
        w = np.maximum(w, floor)
    return w / w.sum()


def allocate_budget(weights: np.ndarray, total: int) -> list[int]:
    """Split ``total`` samples across PLMs by ``weights`` (largest remainder; sums to ``total``)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    raw = w * total
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return [int(c) for c in counts]
