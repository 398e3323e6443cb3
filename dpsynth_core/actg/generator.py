"""ACTG conditional generator: attribute prompts, DP-SGD training under eps2, batched generation.

    template = load_prompt_template("conditional")
    prompt = format_prompt(schema, row, template, text_description="bioRxiv preprint abstract")
    examples = build_train_examples(texts, attribute_rows, schema, template, ...)   # private
    result = train_conditional_generator(examples, dp_config, output_dir=..., ledger=ledger)
    texts = generate_texts(model, tokenizer, prompts, GenerationSettings(n=3))   # list[list[str]]

Prompts are data files in ``prompts/`` (``conditional.txt`` for ACTG, ``unconditional.txt`` for
the vanilla ablation); the same template builds the training prompts and the generation prompts.
Only :func:`build_train_examples` and :func:`train_conditional_generator` touch private records,
and the latter charges the ledger through the DP-SGD engine; generation is post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from dpsynth_core.config.placement import Dtype
from dpsynth_core.actg.schema import AttributeSchema
from dpsynth_core.config import BATCH_CAP, NEW_TOKENS_CAP, StrictConfig
from dpsynth_core.errors import ConfigError, DataError

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


class GenerationSettings(StrictConfig):
    """Sampling settings for the generator (post-processing, no privacy cost)."""

    max_new_tokens: Annotated[int, NEW_TOKENS_CAP] = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    batch_size: Annotated[int, BATCH_CAP] = Field(16, ge=1)
    seed: int = 0
    # auto: vLLM where installed and it runs the model, else HF batched generate (one log line says so)
    engine: Literal["auto", "vllm", "hf"] = "auto"
    # where the generator runs (dpsynth_core.config.placement): auto is the GPU when the stage sees one
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Dtype = "auto"


def load_prompt_template(name_or_path: str | Path = "conditional") -> str:
    """A prompt template: a name in ``prompts/`` (``conditional``, ``unconditional``) or a path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROMPTS_DIR / f"{name_or_path}.txt"
    if not path.is_file():
        raise ConfigError(f"{path}: prompt template not found (built-in: conditional, unconditional)")
    text = path.read_text(encoding="utf-8")
    if "{description}" not in text:
        raise ConfigError(f"{path}: prompt template must contain the placeholder {{description}}")
    return text


def format_prompt(schema: AttributeSchema | None, row: dict[str, str] | None, template: str,
                  *, text_description: str) -> str:
    """Render ``template`` for one attribute row (``row=None`` for the unconditional template)."""
    attributes = ""
    if "{attributes}" in template:
        if schema is None or row is None:
            raise ConfigError("the prompt template has {attributes} but no attribute row was given")
        attributes = schema.format_attributes(row)
    return template.replace("{description}", text_description).replace("{attributes}", attributes)


def build_train_examples(texts: Sequence[str], attribute_rows: Sequence[dict[str, str]] | None,
                         schema: AttributeSchema | None, template: str, *, text_description: str,
                         max_target_chars: int = 4000) -> list:
    """(attribute prompt -> text) pairs for the DP-SGD engine; vanilla mode passes ``None`` rows.

    Works on private records: errors name the row, never its content.
    """
    from dpsynth_core.dpsgd import TrainExample

    if attribute_rows is not None and len(attribute_rows) != len(texts):
        raise DataError(f"training data: {len(texts)} texts but {len(attribute_rows)} attribute rows")
    examples = []
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"training data: row {i}: empty text")
        row = attribute_rows[i] if attribute_rows is not None else None
        prompt = format_prompt(schema, row, template, text_description=text_description)
        examples.append(TrainExample(prompt=prompt, target=" " + text.strip()[:max_target_chars]))
    return examples


def train_conditional_generator(examples: Sequence, config, *, output_dir: Path, ledger,
                                stage: str = "dp_generator", progress: bool = True):
    """DP-SGD LoRA fine-tuning of the generator under ``config.epsilon`` (eps2).

    The engine calibrates the noise, checks the ledger before touching the data and records the
    DpSgdEvent under ``stage``; this wrapper only forwards, so every charge goes through it.
    """
    from dpsynth_core.dpsgd import train_dp_lora

    if ledger is None:
        raise ConfigError("the DP generator must be trained with a privacy ledger")
    return train_dp_lora(examples, config, output_dir=Path(output_dir), ledger=ledger, stage=stage,
                         progress=progress)


def open_generator(base_model: str, adapter_dir: Path | None, settings: GenerationSettings):
    """The DP generator (base + adapter) as a :class:`~dpsynth_core.engines.TextEngine` on the
    backend ``settings.engine`` picks; pass it to :func:`generate_texts` and close it after."""
    from dpsynth_core.engines import EngineConfig, load_engine

    return load_engine(EngineConfig(model=base_model, adapter_dir=adapter_dir, backend=settings.engine,
                                    hf_batch_size=settings.batch_size, max_model_len=1024 + settings.max_new_tokens,
                                    device=settings.device, dtype=settings.dtype))


# Prompts per engine call when generating through an engine: big enough for vLLM's continuous
# batching, small enough that the progress bar moves and a call's seed covers a fixed slice.
ENGINE_CHUNK = 256


def _generate_with_engine(engine, prompts: Sequence[str], settings: GenerationSettings, n: int,
                          progress: bool, desc: str) -> list[list[str]]:
    from tqdm.auto import tqdm

    from dpsynth_core.engines import SamplingParams

    out: list[list[str]] = []
    starts = range(0, len(prompts), ENGINE_CHUNK)
    for c, start in enumerate(tqdm(starts, desc=desc, disable=not progress, unit="chunk")):
        params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                top_p=settings.top_p, n=n, seed=(settings.seed * 100_003 + c) % 2**62)
        out.extend(engine.run(prompts[start:start + ENGINE_CHUNK], params).grouped())
    return out


def generate_texts(model, tokenizer, prompts: Sequence[str], settings: GenerationSettings, *,
                   n: int = 1, progress: bool = True, desc: str = "generating") -> list[list[str]]:
    """``n`` sampled completions per prompt (``out[i][j]``).

    ``model`` is an engine from :func:`open_generator` (``tokenizer`` unused) or an HF model, which
    runs through the HF engine (batches of ``settings.batch_size``). Each chunk of prompts is seeded
    from ``settings.seed`` and its index, so results do not depend on how many chunks ran before a resume.
    """
    from dpsynth_core.engines import TextEngine

    if not isinstance(model, TextEngine):
        from dpsynth_core.engines.hf_engine import HFEngine

        model.eval()
        model = HFEngine.from_loaded(model, tokenizer, batch_size=settings.batch_size)
    return _generate_with_engine(model, prompts, settings, n, progress, desc)
