"""The one generation interface every generating stage can call, whatever runs underneath."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from dpsynth_core.engines.config import SamplingParams


@dataclass(frozen=True)
class GenerationBatch:
    """Completions of one call, prompt-major: prompt 0's ``n`` samples, then prompt 1's, ...

    ``latencies_s[i]`` is when prompt i's last sample finished, counted from the start of the call
    (every prompt is submitted at once); ``new_tokens`` counts generated tokens per completion.
    """

    texts: list[str]
    new_tokens: list[int]
    latencies_s: list[float]
    n: int

    def grouped(self) -> list[list[str]]:
        return [self.texts[i:i + self.n] for i in range(0, len(self.texts), self.n)]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest stop string."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class TextEngine(abc.ABC):
    """A loaded model (optionally with a LoRA adapter) that turns prompts into completions."""

    backend: str
    tokenizer: object  # the model's HF tokenizer (both backends tokenize with it)

    @abc.abstractmethod
    def run(self, prompts: Sequence[str], params: SamplingParams) -> GenerationBatch:
        """Generate ``params.n`` completions per prompt, with token counts and latencies."""

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[str]:
        """``params.n`` completions per prompt, prompt-major, stripped, cut before any stop string."""
        return self.run(prompts, params).texts

    def close(self) -> None:
        """Release the model (and any engine processes). Safe to call twice."""

    def __enter__(self) -> TextEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
