"""The Hugging Face backend: batched ``generate`` through ``dpsynth_core.engines.hf_sampling.sample_texts``.

The fallback where vLLM is not installed or does not support the model (tiny test models), and
the reference the vLLM backend is checked against.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from dpsynth_core.engines.adapters import load_hf_model
from dpsynth_core.engines.base import GenerationBatch, TextEngine, cut_at_stop
from dpsynth_core.engines.config import EngineConfig, SamplingParams
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.randomness import secret_seed


class HFEngine(TextEngine):
    backend = "hf"

    def __init__(self, config: EngineConfig) -> None:
        import torch

        from dpsynth_core.engines.placement import engine_placement

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        self.placement = engine_placement(config)  # GPU bf16 where this process sees one, else CPU fp32
        self.model, self.tokenizer = load_hf_model(config.model, config.adapter_dir, self.placement)

    def run(self, prompts: Sequence[str], params: SamplingParams) -> GenerationBatch:
        import dpsynth_core.engines.hf_sampling as hf_sampling  # by full name: not through engines/__init__

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
            chunk_params = hf_sampling.SamplingParams(
                max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                seed=(base_seed + index) % 2**63, chat=params.chat,
            )
            chunk = hf_sampling.sample_texts(self.model, self.tokenizer, jobs[first:first + size], chunk_params)
            texts.extend(cut_at_stop(t, params.stop).strip() for t in chunk)
            finished_at.extend([time.perf_counter() - start] * len(chunk))
        latencies = [max(finished_at[i * params.n:(i + 1) * params.n]) for i in range(len(prompts))]
        # sample_texts returns text only: count tokens by re-encoding (exact up to whitespace merges).
        new_tokens = [len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        return GenerationBatch(texts=texts, new_tokens=new_tokens, latencies_s=latencies, n=params.n)

    def close(self) -> None:
        self.model = None
