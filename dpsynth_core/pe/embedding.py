"""Embeddings used for voting (and for evaluation): MiniLM by default."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Embedding(ABC):
    """Texts to L2-normalised float32 rows."""

    name: str

    @abstractmethod
    def encode(self, texts: list[str]) -> np.ndarray: ...


class SentenceEmbedding(Embedding):
    """Wraps :func:`dpsynth_core.models.load_embedder` (process-wide cached)."""

    def __init__(self, name: str = "minilm", batch_size: int = 64) -> None:
        from dpsynth_core.models import load_embedder

        self.name = name
        self.batch_size = batch_size
        self._embedder = load_embedder(name)

    @property
    def dim(self) -> int:
        return int(self._embedder.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self._embedder.encode(list(texts), batch_size=self.batch_size, show_progress=False)
