"""WASP's PLM weights: each PLM's share of the generation budget follows the (noisy) votes its
samples received. Pure post-processing of DP histograms."""

from __future__ import annotations

from typing import Literal

import numpy as np

WeightRule = Literal["share_normalised", "raw_votes"]


def _per_plm_scores(votes: np.ndarray, ids: np.ndarray, num_plms: int, rule: WeightRule) -> np.ndarray:
    if rule == "raw_votes":  # pre-paper rule: a PLM's clipped votes summed, so volume is rewarded
        return np.bincount(ids, weights=np.maximum(votes, 0.0), minlength=num_plms)[:num_plms]
    if rule != "share_normalised":
        raise ValueError(f"PLM weights: unknown rule {rule!r}")
    # The paper: w_k = sum_{i in D_k} s_i / (|D_k| / |D|), i.e. |D| times PLM k's mean vote. The noisy
    # votes are summed unclipped (clipping each would add E[max(noise, 0)] per sample: volume again);
    # a negative total means no evidence for the PLM and counts as 0.
    sums = np.bincount(ids, weights=votes, minlength=num_plms)[:num_plms]
    sizes = np.bincount(ids, minlength=num_plms)[:num_plms].astype(np.float64)
    shares = sizes / max(len(ids), 1)
    scores = np.divide(sums, shares, out=np.zeros(num_plms), where=sizes > 0)
    return np.maximum(scores, 0.0)


def update_plm_weights(
    noisy_votes: np.ndarray, plm_ids: list[int], num_plms: int, previous: np.ndarray | None = None,
    momentum: float = 0.0, floor: float = 0.0, rule: WeightRule = "share_normalised",
) -> np.ndarray:
    """PLM weights from the noisy nearest votes ``s_i`` of the samples each PLM wrote (``rule``).

    ``momentum`` mixes in the previous weights and ``floor`` keeps every PLM at least that share
    before renormalising: both are extensions, not in the paper, and off by default.
    Always returns non-negative weights summing to 1 (uniform when no PLM has a positive score).
    """
    votes = np.asarray(noisy_votes, dtype=np.float64)
    ids = np.asarray(plm_ids, dtype=np.int64)
    scores = _per_plm_scores(votes, ids, num_plms, rule) if len(ids) else np.zeros(num_plms)
    w = scores / scores.sum() if scores.sum() > 0 else np.full(num_plms, 1.0 / num_plms)
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
