"""Request/response objects of the Python handle API, and the limit checks shared with HTTP.

Error messages name the field and the limit, never the prompt text (prompts may be private).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dpsynth_core.errors import DpsynthError
from serving.config import LimitsConfig


class RequestLimitError(DpsynthError, ValueError):
    """A request is well-formed but over a configured cap (HTTP 400)."""


class UnknownModelError(DpsynthError, KeyError):
    """A request names a model the service does not serve (HTTP 404)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class GenerationRequest(_Request):
    """``await handle.generate.remote(GenerationRequest(...))`` -> ``list[list[str]]`` (n per prompt)."""

    prompts: list[str] = Field(min_length=1)
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0)  # per-row seeds derive from it: reproducible under batching
    stop: list[str] = Field(default_factory=list, max_length=8)
    chat: bool = False  # prompts are already chat-rendered: do not add special tokens again


class BestOfNRequest(_Request):
    """N candidates per prompt, scored by ``scorer(prompt, completion, metadata) -> float``."""

    prompts: list[str] = Field(min_length=1)
    n: int = Field(4, ge=1)
    metadata: list[dict] | None = None  # one dict per prompt, passed to the scorer
    model: str | None = None  # generator to use; default: the first configured model
    scorer: str | None = None  # override, must be in best_of_n.allowed_scorers
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0)


class BestOfNResult(BaseModel):
    """The best candidate of one prompt, with every candidate and its score (in generation order)."""

    best: str
    best_index: int
    best_score: float
    candidates: list[str]
    scores: list[float]


@dataclass
class SequenceJob:
    """One row of a generation batch: a prompt and its own sampling parameters."""

    prompt: str
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str] = field(default_factory=list)
    add_special_tokens: bool = True
    # Set when the request is cancelled (timeout, client gone): the decode loop drops the row.
    cancelled: threading.Event | None = None


@dataclass
class SequenceOutput:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (eos or stop string) | "length"


@dataclass
class GenerationResult:
    """``completions[i][j]``: the j-th sample for prompt i."""

    completions: list[list[SequenceOutput]]

    def texts(self) -> list[list[str]]:
        return [[s.text for s in row] for row in self.completions]


def check_limits(limits: LimitsConfig, *, prompts: list[str], max_new_tokens: int, n: int) -> None:
    """Raise :class:`RequestLimitError` naming the field if a request is over a cap."""
    if len(prompts) > limits.max_prompts:
        raise RequestLimitError(f"'prompts': {len(prompts)} prompts exceed the limit of {limits.max_prompts}")
    if max_new_tokens > limits.max_tokens:
        raise RequestLimitError(f"'max_tokens': {max_new_tokens} exceeds the limit of {limits.max_tokens}")
    if n > limits.max_n:
        raise RequestLimitError(f"'n': {n} exceeds the limit of {limits.max_n}")
    if len(prompts) * n > limits.max_sequences:
        raise RequestLimitError(
            f"'n' x prompts = {len(prompts) * n} sequences exceed the limit of {limits.max_sequences}"
        )
    for i, prompt in enumerate(prompts):
        if not prompt.strip():  # nothing to condition on (and an empty row broke the batch: HTTP 500)
            raise RequestLimitError(f"'prompt[{i}]': must not be empty or whitespace-only")
        if len(prompt) > limits.max_prompt_chars:
            raise RequestLimitError(
                f"'prompt[{i}]': {len(prompt)} characters exceed the limit of {limits.max_prompt_chars}"
            )


def check_work(limits: LimitsConfig, *, prompts: int, max_new_tokens: int, n: int) -> None:
    """Raise :class:`RequestLimitError` if a request asks for more new tokens than one request may."""
    per_prompt = n * max_new_tokens
    if per_prompt > limits.max_tokens_per_prompt:
        raise RequestLimitError(
            f"'n' x 'max_tokens' = {n} x {max_new_tokens} = {per_prompt} new tokens per prompt exceed the limit of "
            f"{limits.max_tokens_per_prompt} (limits.max_tokens_per_prompt): lower n or max_tokens"
        )
    total = prompts * per_prompt
    if total > limits.max_tokens_per_request:
        raise RequestLimitError(
            f"prompts x 'n' x 'max_tokens' = {prompts} x {n} x {max_new_tokens} = {total} new tokens exceed the "
            f"limit of {limits.max_tokens_per_request} (limits.max_tokens_per_request): split the request"
        )


def row_seed(seed: int | None, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed per (prompt, sample): independent streams, reproducible when ``seed`` is set."""
    if seed is None:
        return random.getrandbits(63)
    state = np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def expand_jobs(request: GenerationRequest, cancelled: threading.Event | None = None) -> list[SequenceJob]:
    """Prompt-major rows: prompt 0 samples 0..n-1, then prompt 1, ..."""
    return [
        SequenceJob(
            prompt=prompt,
            max_new_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=row_seed(request.seed, i, j),
            stop=list(request.stop),
            add_special_tokens=not request.chat,
            cancelled=cancelled,
        )
        for i, prompt in enumerate(request.prompts)
        for j in range(request.n)
    ]


def truncate_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first stop string; return (text, whether it was cut)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
