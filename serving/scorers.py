"""Scorers for Best-of-N: ``scorer(prompt, completion, metadata) -> float`` (higher is better).

Any import path ``"module:function"`` works; ``"module:Class"`` is instantiated once per replica
(for scorers that load a model, e.g. an attribute extractor computing IFAcc).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from dpsynth_core.errors import ConfigError

Scorer = Callable[[str, str, dict], float]


def load_scorer(path: str) -> Scorer:
    """Import ``module:attr``; instantiate it if it is a class. ConfigError if it cannot be used."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"scorer '{path}': expected an import path 'module:function'")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"scorer '{path}' could not be imported: {type(exc).__name__}: {exc}") from None
    if inspect.isclass(target):
        target = target()
    if not callable(target):
        raise ConfigError(f"scorer '{path}' is not callable")
    return target


def keyword_coverage(prompt: str, completion: str, metadata: dict) -> float:
    """Fraction of ``metadata["keywords"]`` found in the completion (case-insensitive); 0 if none given.

    A stand-in for instruction-following accuracy when the instruction is "mention these attributes".
    """
    keywords = [str(k).lower() for k in (metadata or {}).get("keywords", []) if str(k)]
    if not keywords:
        return 0.0
    text = completion.lower()
    return sum(k in text for k in keywords) / len(keywords)


def length_score(prompt: str, completion: str, metadata: dict) -> float:
    """Closeness of the completion's word count to ``metadata["target_words"]`` (default 50): in (0, 1]."""
    target = float((metadata or {}).get("target_words", 50))
    words = len(completion.split())
    return 1.0 / (1.0 + abs(words - target) / max(target, 1.0))
