"""Audit canaries: random token strings, each put into the training set with probability 1/2.

The inclusion draws come from OS entropy (``secure_rng``): the audit's statistics assume the
auditor's guesses are made without knowing them, and a canary set drawn from a config seed could
be rebuilt by anyone holding the config.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from dpsynth_core.dpsgd.config import TrainExample
from dpsynth_core.errors import ConfigError

CANARY_PROMPT = ""  # no context: the loss is on the random tokens alone


@dataclass(frozen=True)
class CanarySet:
    """``examples[i]`` is canary i; ``included[i]`` says whether it was put into training."""

    examples: list[TrainExample]
    included: np.ndarray

    @property
    def members(self) -> list[TrainExample]:
        return [e for e, keep in zip(self.examples, self.included) if keep]


def random_token_texts(tokenizer, count: int, length: int, rng: np.random.Generator,
                       exclude: Iterable[str] = ()) -> list[str]:
    """``count`` distinct texts of ``length`` uniformly random non-special tokens, none in ``exclude``."""
    vocab = np.setdiff1d(np.arange(len(tokenizer)), np.array(tokenizer.all_special_ids, dtype=int))
    taken = set(exclude)
    texts: list[str] = []
    for _ in range(50 * count):  # collisions are astronomically rare; the cap only stops a bad tokenizer
        if len(texts) == count:
            break
        text = tokenizer.decode(rng.choice(vocab, size=length).tolist(), skip_special_tokens=True).strip()
        if text and text not in taken:
            taken.add(text)
            texts.append(text)
    if len(texts) < count:
        raise ConfigError(f"could not draw {count} distinct canaries from the tokenizer's vocabulary")
    return texts


def draw_canaries(tokenizer, count: int, length: int, data: Iterable[TrainExample],
                  rng: np.random.Generator) -> CanarySet:
    """``count`` canaries disjoint from ``data``, each included independently with probability 1/2."""
    existing = {e.target for e in data}
    texts = random_token_texts(tokenizer, count, length, rng, exclude=existing)
    included = rng.random(count) < 0.5
    return CanarySet([TrainExample(CANARY_PROMPT, t) for t in texts], included)
