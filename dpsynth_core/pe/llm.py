"""LLM backends for private evolution: prompts in, completions out. They only ever see prompts
built from synthetic samples and public label names, never private records.

``submit`` returns a handle with ``.result()`` so a runner can start every PLM before waiting on
any; in-process backends compute eagerly, Ray/Serve backends (``ray_jobs/pe_backends.py``)
return immediately, which is what makes the PLM calls run in parallel.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

from dpsynth_core.engines.config import SamplingParams
from dpsynth_core.errors import ConfigError


class Completed:
    """An already-finished result (for synchronous backends)."""

    def __init__(self, value: list[str]) -> None:
        self._value = value

    def result(self) -> list[str]:
        return self._value


class LLM(ABC):
    """One PLM. ``name`` identifies it in logs and weights."""

    name: str

    @abstractmethod
    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        """One completion per prompt (``params.n`` is 1), prompt text excluded."""

    def submit(self, prompts: list[str], params: SamplingParams):
        """Start generation and return an object with ``.result() -> list[str]``."""
        return Completed(self.generate(prompts, params))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (actors, connections)."""


def format_prompt(tokenizer, prompt: str) -> str:
    """Chat template when the tokenizer has one (instruct models), the raw prompt otherwise (base
    models such as Gemma-3-270M continue the text)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def clean_completion(text: str) -> str:
    """Strip whitespace and cut the run-on a base model appends after the sample."""
    text = text.strip()
    for stop in ("\n\n\n", "<|im_end|>", "<end_of_turn>", "\nExample", "\nTopic:", "\nCategory:"):
        cut = text.find(stop)
        if cut > 0:
            text = text[:cut]
    return text.strip()


class LocalLLM(LLM):
    """A PLM from the project registry in this process, through the generation engine:
    ``engine: auto`` runs vLLM where it is installed and supports the model, else HF ``generate``."""

    def __init__(self, model: str, *, batch_size: int = 16, num_threads: int | None = None, name: str | None = None,
                 engine: str = "auto", device: str = "auto", dtype: str = "auto") -> None:
        from dpsynth_core.engines import EngineConfig, load_engine

        self.model_name = model
        self.name = name or model
        # WASP / Aug-PE prompts carry several samples: room for long prompts under vLLM.
        self.engine = load_engine(EngineConfig(model=model, backend=engine, hf_batch_size=batch_size,
                                               torch_threads=num_threads, max_model_len=4096,
                                               device=device, dtype=dtype))
        # Instruct models get their chat template, base models (Gemma-3-270M) continue the raw prompt.
        self.chat = bool(getattr(self.engine.tokenizer, "chat_template", None))

    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        sampling = params.model_copy(update={"chat": self.chat})
        return [clean_completion(t) for t in self.engine.generate(prompts, sampling)]

    def close(self) -> None:
        self.engine.close()


HFLocalLLM = LocalLLM  # the name the Ray drivers import; it runs on whichever engine ``engine`` picks


class OpenAICompatibleLLM(LLM):
    """Any OpenAI-compatible chat endpoint (vLLM, the project's Serve app, a hosted API).

    The key is read from the environment variable ``api_key_env`` only, never from a config file.
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", name: str | None = None,
                 max_concurrency: int = 8, max_retries: int = 3, timeout_s: float = 120.0) -> None:
        from openai import OpenAI

        key = os.environ.get(api_key_env)
        if key is None:
            raise ConfigError(f"OpenAI-compatible backend '{model}': environment variable {api_key_env} is not set")
        # Retries are ours (bounded, per request, see concurrent_requests), not the client's.
        self.client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s)
        self.model = model
        self.name = name or model
        self.max_concurrency, self.max_retries = max_concurrency, max_retries

    def _one(self, i: int, prompt: str, params: SamplingParams) -> str:
        resp = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}],
            max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            **({} if params.seed is None else {"seed": params.seed + i}),  # no seed: the server's own draw
        )
        return clean_completion(resp.choices[0].message.content or "")

    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        """Up to ``max_concurrency`` requests in flight; transient errors retried ``max_retries`` times."""
        from dpsynth_core.pe.concurrent_requests import map_bounded

        return map_bounded(lambda i, p: self._one(i, p, params), prompts, max_concurrency=self.max_concurrency,
                           max_retries=self.max_retries)
