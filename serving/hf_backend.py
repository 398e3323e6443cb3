"""Hugging Face backend of a Serve replica: a wrapper around the library's HF engine.

Serve's dynamic batching mixes rows of different requests, each with its own temperature, top-p, token
budget and seed; the engine's row decoder (``dpsynth_core.engines.hf_rows``) keeps them apart. This
module only turns Serve's rows into the engine's and back: tokenizing with the request limits, stop
strings and finish reasons.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpsynth_core.engines import EngineConfig, SamplingParams
from dpsynth_core.engines.hf_engine import HFEngine
from dpsynth_core.engines.hf_rows import DecodeRow
from dpsynth_core.errors import ConfigError
from serving.schemas import RequestLimitError, SequenceJob, SequenceOutput, truncate_at_stop


def engine_config(model: str, adapter: str | None, *, dtype: str = "auto", merge_adapter: bool = True,
                  device: str = "auto", torch_threads: int | None = None) -> EngineConfig:
    """The HF engine of a replica: the registry model, a peft LoRA adapter merged into it (or not)."""
    adapter_dir = None
    if adapter is not None:
        adapter_dir = Path(adapter).expanduser()
        if not (adapter_dir / "adapter_config.json").is_file():
            raise ConfigError(f"{adapter_dir}: not a LoRA adapter directory (no adapter_config.json)")
    return EngineConfig(model=model, adapter_dir=adapter_dir, backend="hf", device=device, dtype=dtype,
                        torch_threads=torch_threads, lora_mode="merged" if merge_adapter else "lora")


class HFBackend:
    """Loads the engine once per replica; ``generate(jobs)`` runs one padded batch to completion."""

    def __init__(
        self,
        model: str,
        adapter: str | None = None,
        *,
        dtype: str = "auto",
        torch_threads: int = 2,
        merge_adapter: bool = True,
        max_prompt_tokens: int = 2048,
        device: str = "auto",
    ) -> None:
        self.engine = HFEngine(engine_config(model, adapter, dtype=dtype, merge_adapter=merge_adapter, device=device,
                                             torch_threads=torch_threads))
        self.model, self.tokenizer = self.engine.model, self.engine.tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    def render_chat(self, messages: list[dict]) -> str:
        """The tokenizer's chat template, ending with the assistant turn prompt."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestLimitError("this model has no chat template; use /v1/completions")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, jobs: list[SequenceJob]) -> list[list[int]]:
        # Rows tokenized one by one: chat rows must not get special tokens added twice.
        rows = [
            self.tokenizer(job.prompt, add_special_tokens=job.add_special_tokens)["input_ids"] for job in jobs
        ]
        for job, ids in zip(jobs, rows):
            if len(ids) > self.max_prompt_tokens:
                raise RequestLimitError(f"'prompt': {len(ids)} tokens exceed the limit of {self.max_prompt_tokens}")
            if self.context_length and len(ids) + job.max_new_tokens > self.context_length:
                raise RequestLimitError(
                    f"'max_tokens': prompt ({len(ids)} tokens) + max_tokens ({job.max_new_tokens}) exceed the "
                    f"model context of {self.context_length}"
                )
        return rows

    @torch.inference_mode()
    def generate(self, jobs: list[SequenceJob]) -> list[SequenceOutput]:
        """Decode all rows together until each hit eos or its own ``max_new_tokens``."""
        rows = [
            DecodeRow(ids, SamplingParams(max_new_tokens=job.max_new_tokens, temperature=job.temperature,
                                          top_p=job.top_p, seed=job.seed), job.cancelled)
            for job, ids in zip(jobs, self._encode(jobs))
        ]
        outputs = []
        for job, row, decoded in zip(jobs, rows, self.engine.decode_rows(rows)):
            text = self.tokenizer.decode(decoded.token_ids, skip_special_tokens=True)
            reason = decoded.finish_reason
            if job.stop:
                text, cut = truncate_at_stop(text, job.stop)
                reason = "stop" if cut else reason
            outputs.append(SequenceOutput(text, len(row.input_ids), len(decoded.token_ids), reason))
        return outputs
