"""Typed settings and result objects of the DP-SGD LoRA engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from dpsynth_core.config.placement import Dtype
from dpsynth_core.config import BATCH_CAP, SEQ_LEN_CAP, STEPS_CAP, THREADS_CAP, StrictConfig, cap


@dataclass(frozen=True)
class TrainExample:
    """One training record: the loss is taken on ``target`` tokens only (``prompt`` is context).

    ``user_id`` switches the privacy unit from the record to the user (user-level DP).
    """

    prompt: str
    target: str
    user_id: str | None = None


class LoraSettings(StrictConfig):
    """peft LoRA hyper-parameters."""

    r: Annotated[int, cap(1024, 'LoRA rank')] = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)


class DpSgdConfig(StrictConfig):
    """One DP-SGD LoRA fine-tuning stage.

    ``expected_batch_size`` is the expected Poisson logical batch (records, or users under
    user-level DP); it is processed in chunks of ``physical_batch_size`` rows per worker.
    The noise multiplier is calibrated so that ``steps`` steps spend exactly ``epsilon`` at ``delta``.
    """

    model: str = "smollm2-135m-instruct"
    lora: LoraSettings = Field(default_factory=LoraSettings)
    epsilon: float
    delta: float | None = Field(None, gt=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    expected_batch_size: Annotated[int, cap(1_000_000, 'expected records per DP-SGD step')] = Field(32, ge=1)
    physical_batch_size: Annotated[int, BATCH_CAP] = Field(8, ge=1)
    steps: Annotated[int, STEPS_CAP] = Field(..., ge=1)
    learning_rate: float = Field(5e-4, gt=0)
    # hooks: one backward, per-sample LoRA gradients materialised (small with LoRA); ghost: two
    # backward passes through the whole model. benchmarks/dpsgd_overhead.py: hooks is the faster.
    clipping: Literal["ghost", "hooks"] = "hooks"
    accountant: Literal["pld", "rdp", "prv"] = "pld"
    max_seq_len: Annotated[int, SEQ_LEN_CAP] = Field(256, ge=8)
    seed: int = 0
    checkpoint_every: int = Field(0, ge=0)
    num_workers: Annotated[int, cap(1024, 'Ray Train workers')] = Field(1, ge=1)
    # --- beyond the shared contract (all optional) ---
    # User-level DP: at most this many examples of a sampled user per step, averaged into one
    # per-user loss. k > 1 needs clipping='hooks' (ghost norms are per row, not per user).
    max_examples_per_user: Annotated[int, cap(1024, 'examples of one user per step')] = Field(1, ge=1)
    # Seed of the Poisson sampler and the noise. None (default): a fresh secret seed per run,
    # which amplification by subsampling assumes. Fix it only for reproducible tests.
    sampling_seed: int | None = None
    weight_decay: float = Field(0.0, ge=0)
    merge_adapter: bool = False  # also write a merged full model next to the adapter
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Dtype = "auto"  # of the frozen base; LoRA weights stay fp32 (config/placement.py)
    gpu_strategy: Literal["ddp", "fsdp2"] = "ddp"  # fsdp2 = opacus ghost_fsdp for 7B-class models
    stop_after_steps: int | None = Field(None, ge=1)  # testing only: simulate a kill after k steps
    torch_threads: Annotated[int | None, THREADS_CAP] = Field(None, ge=1)
    # The last DP stage of a pipeline: lower the noise until the ledger's composed total reaches its
    # budget (composition of several mechanisms is often sub-additive, so "what is left" undershoots).
    fill_budget: bool = False
    # When the training set is itself a secret Bernoulli subsample of a file (ACTG's and DPFairLLM's
    # working sets), its drawn size is private: the sampling rate q = expected_batch_size / this
    # public expected size (and the default delta from it), so the ledger does not reveal the draw.
    public_num_units: int | None = Field(None, ge=1)

    @field_validator("epsilon")
    @classmethod
    def _positive_epsilon(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"epsilon must be > 0, got {v}")
        return v

    @field_validator("delta")
    @classmethod
    def _delta_range(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError(f"delta must be in (0, 1), got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DpSgdConfig:
        if self.max_examples_per_user > 1 and self.clipping == "ghost":
            raise ValueError(
                "max_examples_per_user > 1 needs clipping='hooks' (ghost clipping bounds each row, "
                "not each user)"
            )
        return self


@dataclass
class TrainResult:
    """What a DP-SGD stage produced. ``history`` rows: step, loss, epsilon (spent so far)."""

    adapter_dir: Path
    steps: int
    epsilon: float
    noise_multiplier: float
    history: list[dict] = field(default_factory=list)
    sampling_rate: float = 0.0
    delta: float = 0.0
    curve_png: Path | None = None
    merged_dir: Path | None = None
    completed: bool = True  # False only when stop_after_steps interrupted the run
