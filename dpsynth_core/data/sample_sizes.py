"""Honest figures: the sample size below which a figure is not printed, and the trivial baselines that every
utility figure is shown beside (docs/report.md, "Rules for every figure").

Here, below the methods, so that ACTG's and PE's evaluations, DPFairLLM's TSTR and the report share one rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

# Measured: MAUVE between two disjoint samples of n real bioRxiv abstracts (docs/results/mauve_min_sample.md).
MAUVE_MIN_TEXTS = 100
NOT_ENOUGH_TEXTS = "not enough texts"
# A group's rates on the real test rows enter a fairness gap only from this many rows up (issue 41's definition of
# the gaps: max - min over groups with >= 50 test rows); a smaller group is named, never silently dropped.
MIN_GROUP_ROWS = 50
NOT_ENOUGH_DATA = "not enough data"


def enough_for_mauve(n_real: int, n_synthetic: int) -> bool:
    return min(n_real, n_synthetic) >= MAUVE_MIN_TEXTS


def mauve_not_enough(n_real: int, n_synthetic: int) -> dict:
    """What ``metrics.json`` holds instead of a MAUVE computed on too few texts."""
    return {"mauve": None, "status": NOT_ENOUGH_TEXTS, "n_real": int(n_real), "n_synthetic": int(n_synthetic),
            "min_texts": MAUVE_MIN_TEXTS}


def majority_accuracy(labels: Sequence) -> float:
    """Accuracy of always predicting the most frequent label of ``labels`` (the test set)."""
    if not len(labels):
        return float("nan")
    return Counter(labels).most_common(1)[0][1] / len(labels)


def constant_macro_f1(labels: Sequence) -> float:
    """The best macro-F1 a constant predictor reaches on ``labels``: predicting class k scores F1 2p/(1+p) on k
    (p its share) and 0 on every other class, so the best constant is the majority class, divided by K."""
    if not len(labels):
        return float("nan")
    counts = Counter(labels)
    p = max(counts.values()) / len(labels)
    return (2 * p / (1 + p)) / len(counts)


def constant_f1_positive(y_true: Sequence[int]) -> float:
    """The best F1 of the positive label a constant predictor reaches: always positive (F1 2p/(1+p)); always
    negative scores 0."""
    if not len(y_true):
        return float("nan")
    p = sum(1 for y in y_true if y == 1) / len(y_true)
    return 2 * p / (1 + p)
