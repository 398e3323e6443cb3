"""What the Anchored RL stage (``anchored_rl``) and its trl engine (``anchored_rl_trl``) share: the
config, the gamma(t) schedule of the anchor term, the reward's type and the anchor SFT loss.

Below both, so the trl engine needs nothing from the module that calls it (the plain-torch reference in
``tests/rl_reference.py`` uses the same pieces).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator

from dpsynth_core.config.placement import Dtype
from dpsynth_core.config import BATCH_CAP, NEW_TOKENS_CAP, SEQ_LEN_CAP, STEPS_CAP, StrictConfig, cap

RewardFn = Callable[[list[str], list[dict]], list[float]]


# ---------------------------------------------------------------------------------------------
# gamma(t)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GammaSchedule:
    """Weight of the SFT anchor term at step t in [0, total_steps - 1]: gamma0 at the first step,
    gamma1 at the last. ``linear`` (default), ``cosine`` (slow-fast-slow), ``step`` (gamma0 until
    ``step_at`` of the run, then gamma1)."""

    gamma0: float = 2.0
    gamma1: float = 0.2
    total_steps: int = 1
    kind: Literal["linear", "cosine", "step"] = "linear"
    step_at: float = 0.5

    def __call__(self, t: int) -> float:
        frac = 0.0 if self.total_steps <= 1 else min(max(t / (self.total_steps - 1), 0.0), 1.0)
        if self.kind == "linear":
            return self.gamma0 + (self.gamma1 - self.gamma0) * frac
        if self.kind == "cosine":
            return self.gamma1 + (self.gamma0 - self.gamma1) * 0.5 * (1.0 + math.cos(math.pi * frac))
        return self.gamma0 if frac < self.step_at else self.gamma1


class AnchoredRLConfig(StrictConfig):
    """Anchored RL (RLOO) settings. Defaults are the reference gamma0=2.0 -> gamma1=0.2, linear."""

    steps: Annotated[int, STEPS_CAP] = Field(4, ge=1)
    prompts_per_step: Annotated[int, BATCH_CAP] = Field(4, ge=1)
    group_size: Annotated[int, cap(64, 'completions generated per prompt and step')] = Field(2, ge=2)  # completions per prompt; >= 2 for a leave-one-out baseline
    anchor_batch_size: Annotated[int, BATCH_CAP] = Field(4, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    # KL to the DP generator, as a per-sequence reward penalty (the reference's PPO: KL 0.2); 0 = none
    beta: float = Field(0.2, ge=0)
    gamma0: float = Field(2.0, ge=0)
    gamma1: float = Field(0.2, ge=0)
    schedule: Literal["linear", "cosine", "step"] = "linear"
    step_at: float = Field(0.5, gt=0, lt=1)
    max_new_tokens: Annotated[int, NEW_TOKENS_CAP] = Field(96, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_seq_len: Annotated[int, SEQ_LEN_CAP] = Field(384, ge=16)
    seed: int = 0
    # the one RL engine: trl.RLOOTrainer + the anchor term (anchored_rl_trl.py)
    engine: Literal["trl"] = "trl"
    # GPU clusters: trl's Trainer runs under the DeepSpeed ZeRO-3 config that the accelerate environment names
    # (ray_jobs.rl_deepspeed sets it on its workers; unmeasured here)
    use_accelerate: bool = False
    # where the policy trains (dpsynth_core.config.placement); LoRA weights stay fp32 under a bf16 base
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Dtype = "auto"

    @field_validator("engine", mode="before")
    @classmethod
    def _one_engine(cls, value):
        if value == "torch":
            raise ValueError("the plain-torch RL engine was removed: trl's RLOOTrainer is the one RL engine "
                             "(engine: trl, or leave the key out)")
        return value

    def placement(self):
        from dpsynth_core.config.placement import resolve_placement

        return resolve_placement(self.device, self.dtype, section="rl.")

    def gamma_schedule(self) -> GammaSchedule:
        return GammaSchedule(self.gamma0, self.gamma1, self.steps, self.schedule, self.step_at)


def sft_loss(policy, tokenizer, anchor_examples: Sequence, max_seq_len: int):
    """Mean target-token cross entropy of the policy on a batch of anchor TrainExamples."""
    from dpsynth_core.dpsgd.data import collate, per_example_loss, tokenize_examples

    rows = tokenize_examples(anchor_examples, tokenizer, max_seq_len)
    batch = {k: v.to(policy.device) for k, v in collate(rows, tokenizer.pad_token_id).items()}
    logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"]).logits
    return per_example_loss(logits, batch["labels"]).mean()
