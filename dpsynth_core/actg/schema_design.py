"""Schema design: ask an LLM for an attribute schema from PUBLIC descriptions only.

    schema = design_schema(llm, data_description="bioRxiv abstracts ...",
                           workload_description="classify the subject category ...")

The prompt is built from two descriptions written by the data owner (what kind of data, what it
will be used for) and nothing else: no private record, no statistic of one. This is what makes the
schema free in the privacy ledger. The LLM's answer (YAML or JSON) is parsed and validated; when it
does not validate, the LLM is asked again with the validation error (an error about its own answer,
never about data), up to ``max_attempts``.

Any backend with ``generate(prompt: str) -> str`` works (or a plain callable): a local causal LM
(:class:`LocalLMBackend`), an OpenAI-compatible endpoint (:class:`OpenAIBackend`).
"""

from __future__ import annotations

import os
import re
from typing import Callable, Protocol

import yaml

from dpsynth_core.actg.schema import AttributeSchema, schema_from_dict
from dpsynth_core.errors import ConfigError

SCHEMA_PROMPT = """You design attribute schemas for attribute-conditioned synthetic text generation.

Data: {data_description}

Downstream use of the synthetic data: {workload_description}

Propose {num_fields} categorical attributes that together describe one record of this data and
matter for the downstream use. Each attribute needs a snake_case name, a short description and
between 2 and {max_options} mutually exclusive options (short phrases; include "Other" where the
list may not be exhaustive).

Answer with YAML only, in exactly this shape:
name: <schema name>
description: <one line>
fields:
  - name: <snake_case_name>
    description: <what the attribute says>
    options: [<option 1>, <option 2>, ...]
"""

RETRY_SUFFIX = """
Your previous answer could not be used: {error}
Answer again with YAML only, in the shape above."""


class TextLLM(Protocol):
    def generate(self, prompt: str) -> str: ...


def build_schema_prompt(data_description: str, workload_description: str, *, num_fields: int = 8,
                        max_options: int = 12) -> str:
    """The schema-design prompt: the template filled with the two public descriptions only."""
    if not data_description.strip() or not workload_description.strip():
        raise ConfigError("schema design needs a non-empty data description and workload description")
    if num_fields < 1 or max_options < 2:
        raise ConfigError("schema design needs num_fields >= 1 and max_options >= 2")
    return SCHEMA_PROMPT.format(data_description=data_description.strip(),
                                workload_description=workload_description.strip(),
                                num_fields=num_fields, max_options=max_options)


def parse_schema_answer(answer: str) -> AttributeSchema:
    """Parse an LLM answer (YAML or JSON, maybe inside a code fence) into a validated schema."""
    fenced = re.findall(r"```(?:ya?ml|json)?\s*\n(.*?)```", answer, flags=re.S)
    text = fenced[0] if fenced else answer
    start = text.find("name:") if "fields" in text else -1
    if not fenced and text.lstrip()[:1] != "{" and start > 0:
        text = text[start:]  # drop chatter before the YAML
    try:
        raw = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ConfigError(f"LLM schema answer: not valid YAML/JSON ({type(exc).__name__})") from None
    if isinstance(raw, dict) and "fields" not in raw and len(raw) == 1:
        raw = next(iter(raw.values()))  # {"schema": {...}}
    return schema_from_dict(raw, source="LLM schema answer")


def design_schema(llm: TextLLM | Callable[[str], str], data_description: str, workload_description: str,
                  *, num_fields: int = 8, max_options: int = 12, max_attempts: int = 3) -> AttributeSchema:
    """Ask ``llm`` for a schema; retry with the validation error; ConfigError after
    ``max_attempts`` failed answers."""
    generate = llm.generate if hasattr(llm, "generate") else llm
    base = build_schema_prompt(data_description, workload_description,
                               num_fields=num_fields, max_options=max_options)
    prompt, last_error = base, ""
    for _ in range(max_attempts):
        answer = generate(prompt)
        try:
            return parse_schema_answer(answer or "")
        except ConfigError as exc:
            last_error = str(exc)
            prompt = base + RETRY_SUFFIX.format(error=last_error)
    raise ConfigError(f"schema design: no valid schema after {max_attempts} attempts; last error: {last_error}")


class LocalLMBackend:
    """``generate(prompt)`` with a local causal LM from the registry (chat template, greedy), through the
    generation engine. ``engine: hf`` by default: a few greedy answers do not repay a vLLM engine start."""

    def __init__(self, name: str = "smollm2-135m-instruct", max_new_tokens: int = 768, device: str = "auto",
                 engine: str = "hf") -> None:
        from dpsynth_core.engines import EngineConfig, SamplingParams, load_engine

        self.engine = load_engine(EngineConfig(model=name, backend=engine, device=device, hf_batch_size=1,
                                               max_model_len=4096))  # vLLM: the long schema prompt + answer
        chat = bool(getattr(self.engine.tokenizer, "chat_template", None))
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, chat=chat)

    def generate(self, prompt: str) -> str:
        return self.engine.generate([prompt], self.params)[0]


class OpenAIBackend:
    """``generate(prompt)`` against any OpenAI-compatible endpoint; key from ``api_key_env`` only."""

    def __init__(self, model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 temperature: float = 0.2, max_tokens: int = 2048) -> None:
        from openai import OpenAI

        key = os.environ.get(api_key_env) or ("EMPTY" if base_url else None)
        if not key:
            raise ConfigError(f"OpenAIBackend: environment variable {api_key_env} is not set")
        self.client = OpenAI(base_url=base_url, api_key=key)
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens

    def generate(self, prompt: str) -> str:
        resp = self.client.chat.completions.create(
            model=self.model, temperature=self.temperature, max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": prompt}])
        return resp.choices[0].message.content or ""
