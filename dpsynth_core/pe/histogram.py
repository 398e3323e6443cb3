"""Vote histograms: private records vote for synthetic samples in embedding space.

Each histogram has one bin per synthetic sample. A private record's vote depends only on that
record and on the synthetic samples, which is what bounds the sensitivity (see :mod:`.dp`).
Votes are restricted to synthetic samples carrying the voter's label (class-conditional PE).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsynth_core.errors import DataError
from dpsynth_core.pe.dp import joint_topq_l2_sensitivity, nearest_neighbor_l2_sensitivity, topq_weights


@dataclass
class VoteHistograms:
    """Raw (not yet private) vote counts, one bin per synthetic sample."""

    nearest: np.ndarray
    farthest: np.ndarray | None = None

    def joint(self) -> np.ndarray:
        """The vector the Gaussian mechanism is applied to: (nearest, farthest) concatenated."""
        return self.nearest if self.farthest is None else np.concatenate([self.nearest, self.farthest])

    @staticmethod
    def split(joint: np.ndarray, n: int, has_farthest: bool) -> VoteHistograms:
        return VoteHistograms(joint[:n], joint[n:] if has_farthest else None)


def _squared_distances(private_emb: np.ndarray, synth_emb: np.ndarray) -> np.ndarray:
    p = np.asarray(private_emb, dtype=np.float64)
    s = np.asarray(synth_emb, dtype=np.float64)
    d = (p * p).sum(1)[:, None] + (s * s).sum(1)[None, :] - 2.0 * p @ s.T
    return np.maximum(d, 0.0)


def _check(private_emb, private_labels, synth_emb, synth_labels) -> None:
    if len(private_emb) != len(private_labels):
        raise DataError(f"histogram: {len(private_emb)} private embeddings but {len(private_labels)} labels")
    if len(synth_emb) != len(synth_labels):
        raise DataError(f"histogram: {len(synth_emb)} synthetic embeddings but {len(synth_labels)} labels")


class Histogram(ABC):
    """One vote rule. ``sensitivity`` is the L2 sensitivity of :meth:`compute`'s joint vector
    under adding or removing one private record."""

    has_farthest: bool = False

    @property
    @abstractmethod
    def sensitivity(self) -> float: ...

    @abstractmethod
    def compute(
        self,
        private_emb: np.ndarray,
        private_labels: Sequence[str],
        synth_emb: np.ndarray,
        synth_labels: Sequence[str],
    ) -> VoteHistograms:
        """Votes of all private records over the synthetic samples."""


class TopQHistogram(Histogram):
    """WASP: each private record gives weights 1, 1/2, ..., 2^-(Q-1) to its Q nearest synthetic
    samples of its own label (nearest histogram) and the same weights to its Q farthest ones
    (farthest histogram). Joint L2 sensitivity sqrt(2 * sum_{i<Q} 4^-i)."""

    has_farthest = True

    def __init__(self, q: int = 8) -> None:
        self.q = int(q)
        self.weights = topq_weights(self.q)

    @property
    def sensitivity(self) -> float:
        return joint_topq_l2_sensitivity(self.q)

    def compute(self, private_emb, private_labels, synth_emb, synth_labels) -> VoteHistograms:
        _check(private_emb, private_labels, synth_emb, synth_labels)
        n = len(synth_labels)
        nearest = np.zeros(n)
        farthest = np.zeros(n)
        if n == 0 or len(private_labels) == 0:
            return VoteHistograms(nearest, farthest)
        dist = _squared_distances(private_emb, synth_emb)
        synth_labels = np.asarray(synth_labels, dtype=object)
        private_labels = np.asarray(private_labels, dtype=object)
        for label in np.unique(private_labels):
            voters = np.flatnonzero(private_labels == label)
            candidates = np.flatnonzero(synth_labels == label)
            if len(candidates) == 0:
                continue  # nothing of this label to vote for: the record contributes nothing
            k = min(self.q, len(candidates))
            w = self.weights[:k]
            order = np.argsort(dist[np.ix_(voters, candidates)], axis=1, kind="stable")
            np.add.at(nearest, candidates[order[:, :k]], np.broadcast_to(w, (len(voters), k)))
            np.add.at(farthest, candidates[order[:, ::-1][:, :k]], np.broadcast_to(w, (len(voters), k)))
        return VoteHistograms(nearest, farthest)


class NearestNeighborHistogram(Histogram):
    """Aug-PE / PE: each private record gives one vote to its nearest synthetic sample of its own
    label. L2 sensitivity 1."""

    @property
    def sensitivity(self) -> float:
        return nearest_neighbor_l2_sensitivity()

    def compute(self, private_emb, private_labels, synth_emb, synth_labels) -> VoteHistograms:
        _check(private_emb, private_labels, synth_emb, synth_labels)
        n = len(synth_labels)
        counts = np.zeros(n)
        if n == 0 or len(private_labels) == 0:
            return VoteHistograms(counts)
        dist = _squared_distances(private_emb, synth_emb)
        synth_labels = np.asarray(synth_labels, dtype=object)
        private_labels = np.asarray(private_labels, dtype=object)
        for label in np.unique(private_labels):
            voters = np.flatnonzero(private_labels == label)
            candidates = np.flatnonzero(synth_labels == label)
            if len(candidates) == 0:
                continue
            best = candidates[np.argmin(dist[np.ix_(voters, candidates)], axis=1)]
            np.add.at(counts, best, 1.0)
        return VoteHistograms(counts)
