"""The Hugging Face backend: batched ``generate`` through ``dpsynth_core.engines.hf_sampling.sample_texts``.

The fallback where vLLM is not installed or does not support the model (tiny test models), the
reference the vLLM backend is checked against, and the backend of the generations that need the model
itself: a logits processor (constrained rows, fairness tilts) or a model that is still training.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from dpsynth_core.engines.adapters import load_hf_model
from dpsynth_core.engines.base import GenerationBatch, TextEngine, cut_at_stop
from dpsynth_core.engines.config import EngineConfig, SamplingParams
from dpsynth_core.engines.hf_rows import DecodedRow, DecodeRow, decode_rows
from dpsynth_core.engines.hf_sampling import sample_texts
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.randomness import secret_seed


class HFEngine(TextEngine):
    backend = "hf"

    def __init__(self, config: EngineConfig) -> None:
        from dpsynth_core.config.placement import apply_torch_threads

        from dpsynth_core.engines.placement import engine_placement

        apply_torch_threads(config.torch_threads)
        self.config = config
        self.placement = engine_placement(config)  # GPU bf16 where this process sees one, else CPU fp32
        self.model, self.tokenizer = load_hf_model(config.model, config.adapter_dir, self.placement)
        if config.adapter_dir is not None and config.lora_mode == "merged" and hasattr(self.model, "merge_and_unload"):
            self.model = self.model.merge_and_unload()  # same outputs, no LoRA matmuls per token
            self.model.eval()

    @classmethod
    def from_loaded(cls, model, tokenizer, *, batch_size: int = 32) -> HFEngine:
        """An engine over a model already in memory (a caller's HF model, a model in training); it
        stays where it is and the caller keeps owning it."""
        engine = cls.__new__(cls)
        engine.config = EngineConfig(backend="hf", hf_batch_size=batch_size)
        engine.placement = None
        engine.model, engine.tokenizer = model, tokenizer
        return engine

    def run(self, prompts: Sequence[str], params: SamplingParams) -> GenerationBatch:
        if params.regex is not None:
            raise ConfigError("regex-constrained sampling needs the vllm engine (HF constrains rows with "
                              "dpsynth_core.tabular.constrained.ConstrainedRowProcessor)")

        # Prompt-major repetition: sample j of prompt i sits at i * n + j.
        jobs = [p for p in prompts for _ in range(params.n)]
        base_seed = params.seed if params.seed is not None else secret_seed(63)
        texts: list[str] = []
        finished_at: list[float] = []
        start = time.perf_counter()
        size = self.config.hf_batch_size
        for index, first in enumerate(range(0, len(jobs), size)):
            chunk = sample_texts(self.model, self.tokenizer, jobs[first:first + size], params,
                                 seed=(base_seed + index) % 2**63)
            texts.extend(cut_at_stop(t, params.stop).strip() for t in chunk)
            finished_at.extend([time.perf_counter() - start] * len(chunk))
        latencies = [max(finished_at[i * params.n:(i + 1) * params.n]) for i in range(len(prompts))]
        # sample_texts returns text only: count tokens by re-encoding (exact up to whitespace merges).
        new_tokens = [len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        return GenerationBatch(texts=texts, new_tokens=new_tokens, latencies_s=latencies, n=params.n)

    def generate_processed(self, prompts: Sequence[str], params: SamplingParams, logits_processor) -> list[str]:
        """One completion per prompt from ONE ``generate`` call under ``logits_processor`` (a stateful
        processor, e.g. a constrained row's, sees row i of its batch as prompt i)."""
        if params.n != 1 or params.regex is not None:
            raise ConfigError("a logits-processed generation takes n = 1 and no regex")
        seed = params.seed if params.seed is not None else secret_seed(63)
        texts = sample_texts(self.model, self.tokenizer, prompts, params, seed=seed, logits_processor=logits_processor)
        return [cut_at_stop(t, params.stop).strip() for t in texts]

    def decode_rows(self, rows: Sequence[DecodeRow]) -> list[DecodedRow]:
        """One batch of rows that each carry their own sampling parameters and seed (a server's dynamic
        batch): token ids and finish reason per row (:func:`~dpsynth_core.engines.hf_rows.decode_rows`)."""
        return decode_rows(self.model, self.tokenizer, rows)

    def close(self) -> None:
        self.model = None
