"""Typed settings of a generation engine and of one generation call.

Generation samples from a (DP-trained or public) model: post-processing, so a sampling seed here is
allowed and makes runs reproducible. ``seed: null`` draws one from OS entropy instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig
from dpsynth_core.models import DEFAULT_CAUSAL_LM

Backend = Literal["auto", "vllm", "hf"]


class EngineConfig(StrictConfig):
    """Which model, which adapter, which backend; the knobs each backend needs."""

    model: str = DEFAULT_CAUSAL_LM  # registry name, local HF directory or hub id
    adapter_dir: Path | None = None  # a peft LoRA adapter (DP-SGD output) or a merged model directory
    backend: Backend = "auto"  # auto: vllm when importable and it supports the model, else hf
    # auto: the GPU when this process sees one (a Ray task that asked for one), else the CPU; cuda
    # without a GPU is a ConfigError before the model loads. vLLM runs where its build runs.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # "auto": bfloat16 under vLLM (its CPU kernels want it) and for HF on a GPU, float32 for HF on CPU.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # vLLM only
    max_model_len: int = Field(512, ge=16)  # prompt + completion tokens per sequence
    kv_cache_gib: float = Field(4.0, gt=0)  # VLLM_CPU_KVCACHE_SPACE: KV-cache memory reserved on CPU
    max_num_seqs: int = Field(128, ge=1)  # sequences batched per engine step
    # "lora": serve the adapter through vLLM's LoRA kernels; "merged": merge it into the base weights once and
    # serve that; "auto": merged on CPU, where vLLM's LoRA path generated slower (docs/results/config_figures.md,
    # benchmarks/generation_engines.py --lora-modes), lora on a GPU (no merged copy per adapter).
    # HF: "merged" merges the adapter into the weights in memory (Serve's HF replicas); else it stays a LoRA.
    lora_mode: Literal["auto", "lora", "merged"] = "auto"
    # HF only
    hf_batch_size: int = Field(32, ge=1)  # prompts per `generate` call
    torch_threads: int | None = Field(None, ge=1)

    def lora_mode_on(self, device: str) -> Literal["lora", "merged"]:
        """How vLLM on ``device`` ("cpu" or "cuda") loads a LoRA adapter under this config."""
        if self.lora_mode != "auto":
            return self.lora_mode
        return "merged" if device == "cpu" else "lora"


class SamplingParams(StrictConfig):
    """One generation call. ``temperature: 0`` is greedy decoding."""

    model_config = {**StrictConfig.model_config, "frozen": True}

    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)  # samples per prompt
    stop: tuple[str, ...] = ()  # cut each completion before the first of these strings
    seed: int | None = Field(None, ge=0)  # post-processing seed; None: fresh OS entropy per call
    chat: bool = False  # wrap each prompt in the tokenizer's chat template (instruct models)
    # vLLM only: every completion matches this regex (structured outputs); HF constrains rows with
    # a logits processor instead (dpsynth_core.tabular.constrained)
    regex: str | None = None

    @model_validator(mode="after")
    def _no_empty_stop(self) -> SamplingParams:
        if any(s == "" for s in self.stop):
            raise ValueError("field 'stop': empty stop strings would cut every completion to nothing")
        return self
