"""The one data object that flows through a PE / WASP run, and selection on it.

A :class:`Population` holds synthetic samples only (texts, labels, which PLM wrote them, the
iteration that wrote them, and their noisy vote scores). Private records never enter it, so it
can be checkpointed and logged freely.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class Population:
    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    plm_ids: list[int] = field(default_factory=list)
    born: list[int] = field(default_factory=list)  # iteration that generated each sample
    nearest_votes: list[float] | None = None  # noisy (DP) scores of the latest vote, one per sample
    farthest_votes: list[float] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def extend(self, texts: list[str], labels: list[str], plm_ids: list[int], born: int) -> None:
        if not (len(texts) == len(labels) == len(plm_ids)):
            raise ValueError("population: texts, labels and plm_ids must have the same length")
        self.texts += list(texts)
        self.labels += list(labels)
        self.plm_ids += [int(p) for p in plm_ids]
        self.born += [int(born)] * len(texts)
        self.nearest_votes = None  # scores refer to the previous membership
        self.farthest_votes = None

    def subset(self, idx) -> Population:
        idx = [int(i) for i in idx]
        pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
        return Population(
            [self.texts[i] for i in idx], [self.labels[i] for i in idx], [self.plm_ids[i] for i in idx],
            [self.born[i] for i in idx], pick(self.nearest_votes), pick(self.farthest_votes),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Population:
        return cls(**d)


def top_per_class(labels: list[str], scores: np.ndarray, s: int, classes: list[str]) -> dict[str, list[int]]:
    """Indices of the ``s`` highest scores within each class (ties by index), best first."""
    labels_arr = np.asarray(labels, dtype=object)
    out: dict[str, list[int]] = {}
    for c in classes:
        idx = np.flatnonzero(labels_arr == c)
        order = idx[np.argsort(-np.asarray(scores)[idx], kind="stable")]
        out[c] = [int(i) for i in order[:s]]
    return out


def draw_examples(indices: list[int], fraction: float, rng: np.random.Generator) -> list[int]:
    """A random ``fraction`` of ``indices`` (at least one when any), without replacement, in random order."""
    if not indices:
        return []
    k = max(1, int(round(fraction * len(indices))))
    return [int(i) for i in rng.choice(np.asarray(indices), size=k, replace=False)]


def threshold_probabilities(scores: np.ndarray, threshold: float) -> np.ndarray:
    """Aug-PE selection weights: max(score - threshold, 0), normalised; uniform if all are 0."""
    w = np.maximum(np.asarray(scores, dtype=np.float64) - threshold, 0.0)
    total = w.sum()
    if total <= 0:
        return np.full(len(w), 1.0 / max(len(w), 1))
    return w / total


def resample_per_class(
    labels: list[str], scores: np.ndarray, threshold: float, per_class: dict[str, int], rng: np.random.Generator
) -> list[int]:
    """Draw ``per_class[c]`` indices of class ``c`` with replacement, proportionally to the
    thresholded noisy votes (Aug-PE's selection step)."""
    labels_arr = np.asarray(labels, dtype=object)
    chosen: list[int] = []
    for c, k in per_class.items():
        idx = np.flatnonzero(labels_arr == c)
        if len(idx) == 0 or k <= 0:
            continue
        p = threshold_probabilities(np.asarray(scores)[idx], threshold)
        chosen += [int(i) for i in rng.choice(idx, size=k, replace=True, p=p)]
    return chosen
