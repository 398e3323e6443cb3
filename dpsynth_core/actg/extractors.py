"""Attribute extractors: text -> one option per schema field, behind one interface.

    extractor = build_extractor(ExtractorConfig(kind="embedding"), schema)
    attrs = extractor.extract(texts)                 # [{field: option}, ...]
    scores = extractor.ifacc(texts, target_attrs)    # fraction of the K attributes recovered

Three text implementations (plus ``columns`` and ``supervised`` in :mod:`dpsynth_core.actg.supervised`):
* :class:`LMChoiceExtractor` - log-likelihood of each option given the text under an instruct
  model (SmolLM2 by default); the text prefix is encoded once and its KV cache reused for every
  field, and a field's options are scored in one batch; scores are length-normalised.
* :class:`EmbeddingExtractor` - zero-shot with MiniLM: cosine of the text to each option's
  description, argmax.
* :class:`OpenAIExtractor` - any OpenAI-compatible chat endpoint (vLLM, Ray Serve, hosted API);
  the key comes from an environment variable only; the JSON answer is snapped to the options.

Extractors run on private texts (the real corpus, for agreement benchmarks) and on synthetic ones
(Best-of-N, RL reward). They never log the texts they see.
"""

from __future__ import annotations

import copy
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from dpsynth_core.config.placement import Dtype
from dpsynth_core.actg.extractor_base import AttributeExtractor, snap_to_option
from dpsynth_core.actg.schema import AttributeSchema
from dpsynth_core.config import SEQ_LEN_CAP, StrictConfig, cap
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.endpoints import require_local_or_allowed


# ---------------------------------------------------------------------------------------------
# (b) Embedding zero-shot
# ---------------------------------------------------------------------------------------------
class EmbeddingExtractor(AttributeExtractor):
    """Zero-shot: each option is embedded as ``option_template`` (default ``"{description}:
    {option}"``); a text gets, per field, the option of highest cosine similarity."""

    def __init__(self, schema: AttributeSchema, embedder: str | object = "minilm",
                 option_template: str = "{description}: {option}", batch_size: int = 32) -> None:
        super().__init__(schema)
        if isinstance(embedder, str):
            from dpsynth_core.models import load_embedder

            embedder = load_embedder(embedder)
        self.embedder = embedder
        self.batch_size = batch_size
        self.option_template = option_template
        self._option_vecs: dict[str, np.ndarray] = {}
        for f in schema.fields:
            label = f.description or f.name.replace("_", " ")
            phrases = [option_template.format(description=label, option=o, name=f.name) for o in f.options]
            self._option_vecs[f.name] = embedder.encode(phrases, batch_size=batch_size)

    def extract(self, texts: list[str]) -> list[dict[str, str]]:
        if not texts:
            return []
        vecs = self.embedder.encode(list(texts), batch_size=self.batch_size)
        out: list[dict[str, str]] = [{} for _ in texts]
        for f in self.schema.fields:
            best = np.argmax(vecs @ self._option_vecs[f.name].T, axis=1)
            for row, j in zip(out, best):
                row[f.name] = f.options[int(j)]
        return out


# ---------------------------------------------------------------------------------------------
# (a) LM choice scoring
# ---------------------------------------------------------------------------------------------
_LM_SYSTEM = "You are an expert annotator. You read a text and pick the option that best describes it."
_LM_TEXT = "Text:\n{text}\n\n"
_NULL_TEXT = "N/A"
_LM_QUESTION = "Question: {description}?\nOptions: {options}.\nAnswer with exactly one option."


class LMChoiceExtractor(AttributeExtractor):
    """Scores every option by its mean token log-probability as the assistant's answer to a
    question about the text (options listed in the question), and picks the best.

    The chat prompt is split as ``[system + text] [question for field k] [option]``: the first
    part is run once per text and its KV cache reused for every field; a field's options are
    scored together in one batch on top of the cached prefix.
    """

    def __init__(self, schema: AttributeSchema, model: str | tuple = "smollm2-135m-instruct",
                 max_text_tokens: int = 256, length_normalise: bool = True,
                 calibrate: bool = True, use_cache: bool = True, progress: bool = False, placement=None) -> None:
        super().__init__(schema)
        import torch

        if isinstance(model, str):
            from dpsynth_core.models import load_causal_lm

            model = load_causal_lm(model, placement=placement)
        self.model, self.tokenizer = model
        self.device = self.model.device
        self.model.eval()
        self.max_text_tokens = max_text_tokens
        self.length_normalise = length_normalise
        self.use_cache = use_cache
        self.progress = progress
        self._torch = torch
        self._build_templates()
        # Contextual calibration: subtract each option's score under a content-free text, so a
        # small model's prior for short / frequent option strings does not decide the answer.
        self._null_scores = self.option_scores(_NULL_TEXT) if calibrate else None

    def _build_templates(self) -> None:
        """Token ids of the fixed prompt pieces, from the tokenizer's chat template when it has one."""
        tok = self.tokenizer
        marker_text, marker_q = "\x00TEXT\x00", "\x00QUESTION\x00"
        user = _LM_TEXT.format(text=marker_text) + marker_q
        if getattr(tok, "chat_template", None):
            full = tok.apply_chat_template(
                [{"role": "system", "content": _LM_SYSTEM}, {"role": "user", "content": user}],
                tokenize=False, add_generation_prompt=True,
            )
        else:
            full = f"{_LM_SYSTEM}\n\n{user}\nAnswer: "
        before_text, rest = full.split(marker_text)
        between, after_q = rest.split(marker_q)
        enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self._ids_before = enc(before_text)
        self._ids_between = enc(between)
        self._ids_after = enc(after_q)
        self._field_ids: dict[str, list[int]] = {}
        self._option_ids: dict[str, list[list[int]]] = {}
        for f in self.schema.fields:
            q = _LM_QUESTION.format(description=f.description or f.name.replace("_", " "),
                                    options="; ".join(f.options))
            self._field_ids[f.name] = self._ids_between + enc(q) + self._ids_after
            self._option_ids[f.name] = [enc(o) or [tok.eos_token_id] for o in f.options]

    def _text_ids(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[: self.max_text_tokens]

    def option_scores(self, text: str) -> dict[str, np.ndarray]:
        """Per field, the (length-normalised) log-likelihood of each option given ``text``."""
        torch = self._torch
        prefix = self._ids_before + self._text_ids(text)
        scores: dict[str, np.ndarray] = {}
        with torch.inference_mode():
            cache = None
            if self.use_cache:
                out = self.model(input_ids=torch.tensor([prefix], device=self.device), use_cache=True)
                cache = out.past_key_values
            for f in self.schema.fields:
                scores[f.name] = self._score_field(prefix, cache, f.name)
        return scores

    def _score_field(self, prefix: list[int], cache, name: str) -> np.ndarray:
        torch = self._torch
        options = self._option_ids[name]
        question = self._field_ids[name]
        n, width = len(options), max(len(o) for o in options)
        pad = self.tokenizer.pad_token_id
        opt = torch.full((n, width), pad, dtype=torch.long, device=self.device)
        mask = torch.zeros((n, width), dtype=torch.bool, device=self.device)
        for i, ids in enumerate(options):
            opt[i, : len(ids)] = torch.tensor(ids)
            mask[i, : len(ids)] = True
        if cache is not None:
            # Run the question once on top of the text's cache, then all options in one batch.
            field_cache = copy.deepcopy(cache)
            out = self.model(input_ids=torch.tensor([question], device=self.device), past_key_values=field_cache,
                             use_cache=True)
            first_logits = out.logits[:, -1:, :].expand(n, 1, -1)
            field_cache = out.past_key_values
            field_cache.batch_repeat_interleave(n)
            # Right padding is harmless: a pad only ever sits after the tokens we score.
            logits = self.model(input_ids=opt, past_key_values=field_cache, use_cache=False).logits
            logits = torch.cat([first_logits, logits[:, :-1, :]], dim=1)
        else:
            ctx = torch.tensor(prefix + question, device=self.device).unsqueeze(0).expand(n, -1)
            full = torch.cat([ctx, opt], dim=1)
            logits = self.model(input_ids=full).logits[:, ctx.shape[1] - 1 : -1, :]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, opt.unsqueeze(-1)).squeeze(-1)
        logp = (logp * mask).sum(dim=1)
        if self.length_normalise:
            logp = logp / mask.sum(dim=1)
        return logp.cpu().numpy()

    def extract(self, texts: list[str]) -> list[dict[str, str]]:
        from tqdm.auto import tqdm

        out = []
        for text in tqdm(texts, desc="LM-choice extraction", disable=not self.progress, unit="text"):
            scores = self.option_scores(text)
            if self._null_scores is not None:
                scores = {k: v - self._null_scores[k] for k, v in scores.items()}
            out.append({f.name: f.options[int(np.argmax(scores[f.name]))] for f in self.schema.fields})
        return out


# ---------------------------------------------------------------------------------------------
# (c) OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------------
_OPENAI_PROMPT = """Annotate the text below with one option per attribute.

Attributes (pick exactly one option for each):
{attributes}

Text:
{text}

Answer with a single JSON object mapping each attribute name to the chosen option, nothing else."""


def _extract_json_object(answer: str) -> dict | None:
    """The first JSON object in an LLM answer (code fences and chatter around it are ignored)."""
    answer = re.sub(r"```(?:json)?", "", answer)
    start = answer.find("{")
    while start != -1:
        depth = 0
        for i in range(start, len(answer)):
            if answer[i] == "{":
                depth += 1
            elif answer[i] == "}":
                depth -= 1
                if depth == 0:
                    try:
                        obj = json.loads(answer[start : i + 1])
                        return obj if isinstance(obj, dict) else None
                    except json.JSONDecodeError:
                        break
        start = answer.find("{", start + 1)
    return None


class OpenAIExtractor(AttributeExtractor):
    """Chat-completions client for any OpenAI-compatible server. The API key is read from the
    environment variable ``api_key_env`` only (never from a config file); local servers that need
    no key get a placeholder. Unparseable or partial answers are snapped field by field to the
    schema's options (missing fields fall back to "Other" / the first option, counted in
    ``self.stats``)."""

    def __init__(self, schema: AttributeSchema, model: str, base_url: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.0,
                 max_tokens: int = 512, max_workers: int = 4, timeout_s: float = 60.0,
                 max_retries: int = 2, max_text_chars: int = 6000,
                 allow_external_processing: bool = False) -> None:
        super().__init__(schema)
        from openai import OpenAI

        # The extractor reads private texts: a non-loopback endpoint must be opted into.
        require_local_or_allowed(base_url, allow_external_processing, "extractor (openai)")

        key = os.environ.get(api_key_env)
        if not key:
            if base_url is None:
                raise ConfigError(f"OpenAIExtractor: environment variable {api_key_env} is not set")
            key = "EMPTY"  # local vLLM / Ray Serve endpoints accept any key
        self.client = OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries)
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_workers = max_workers
        self.max_text_chars = max_text_chars
        self.stats = {"requests": 0, "unparsed": 0, "missing_fields": 0}
        self._attributes = "\n".join(
            f'- "{f.name}" ({f.description or f.name}): ' + " | ".join(f.options) for f in schema.fields
        )

    def build_prompt(self, text: str) -> str:
        return _OPENAI_PROMPT.format(attributes=self._attributes, text=text[: self.max_text_chars])

    def parse_answer(self, answer: str) -> dict[str, str]:
        """JSON answer -> a valid attribute row (snapped to the options)."""
        obj = _extract_json_object(answer or "")
        if obj is None:
            self.stats["unparsed"] += 1
            obj = {}
        row = {}
        for f in self.schema.fields:
            if f.name not in obj:
                self.stats["missing_fields"] += 1
            row[f.name] = snap_to_option(obj.get(f.name), f)
        return row

    def _one(self, text: str) -> str:
        resp = self.client.chat.completions.create(
            model=self.model, temperature=self.temperature, max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": self.build_prompt(text)}],
        )
        return resp.choices[0].message.content or ""

    def extract(self, texts: list[str]) -> list[dict[str, str]]:
        if not texts:
            return []
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            answers = list(pool.map(self._one, texts))
        self.stats["requests"] += len(texts)
        return [self.parse_answer(a) for a in answers]


# ---------------------------------------------------------------------------------------------
# Config + factory
# ---------------------------------------------------------------------------------------------
class ExtractorConfig(StrictConfig):
    """Which extractor to build. ``model``: a causal-LM name for ``lm``, an embedder name for
    ``embedding``, the served model id for ``openai``."""

    # columns: the records' own attribute columns (private attributes only; it scores no text);
    # supervised: a classifier trained on public labeled rows (actg.supervised), loaded from model_dir
    # auto: supervised when the config declares a public labeled file (data.public_path), else embedding
    kind: Literal["auto", "lm", "embedding", "openai", "columns", "supervised"] = "auto"
    model: str | None = None
    model_dir: str | None = None  # supervised: the saved reward model (written by the reward_model stage)
    # lm
    max_text_tokens: Annotated[int, SEQ_LEN_CAP] = Field(256, ge=1)
    # lm: where the scoring model runs (dpsynth_core.config.placement); auto is the GPU when the stage sees one
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Dtype = "auto"
    # embedding
    option_template: str = "{description}: {option}"
    # openai
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    max_workers: Annotated[int, cap(256, 'concurrent requests to the endpoint')] = Field(4, ge=1)
    # Private texts go to base_url; only a loopback server unless the data owner opts in here.
    allow_external_processing: bool = False

    @model_validator(mode="after")
    def _private_texts_stay_local(self) -> ExtractorConfig:
        if self.kind == "openai":
            require_local_or_allowed(self.base_url, self.allow_external_processing, "extractor")
        return self


def build_extractor(config: ExtractorConfig | dict | str, schema: AttributeSchema,
                    *, model_obj: tuple | None = None) -> AttributeExtractor:
    """Build an extractor from a config (or just its kind). ``model_obj`` passes an already
    loaded ``(model, tokenizer)`` to the LM extractor."""
    if isinstance(config, str):
        config = ExtractorConfig(kind=config)
    elif isinstance(config, dict):
        config = ExtractorConfig.model_validate(config)
    if config.kind == "auto":
        raise ConfigError("extractor kind 'auto' is resolved by the ACTG config (data.public_path); "
                          "name a kind to build an extractor on its own")
    if config.kind == "columns":
        raise ConfigError("extractor kind 'columns' reads the records' own attribute columns and cannot score "
                          "a text: set a text extractor for the reward (section 'reward')")
    if config.kind == "supervised":
        from dpsynth_core.actg.supervised import SupervisedExtractor

        if not config.model_dir:
            raise ConfigError("extractor kind 'supervised' needs 'model_dir' (a saved reward model)")
        return SupervisedExtractor.load(config.model_dir, schema)
    if config.kind == "embedding":
        return EmbeddingExtractor(schema, embedder=config.model or "minilm", option_template=config.option_template)
    if config.kind == "lm":
        from dpsynth_core.config.placement import resolve_placement

        return LMChoiceExtractor(schema, model=model_obj or config.model or "smollm2-135m-instruct",
                                 max_text_tokens=config.max_text_tokens,
                                 placement=resolve_placement(config.device, config.dtype, section="extractor."))
    if not config.model:
        raise ConfigError("extractor kind 'openai' needs 'model' (the served model id)")
    return OpenAIExtractor(schema, model=config.model, base_url=config.base_url,
                           api_key_env=config.api_key_env, max_workers=config.max_workers,
                           allow_external_processing=config.allow_external_processing)
