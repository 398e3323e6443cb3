"""Anchored RL on trl: ``trl.RLOOTrainer`` with gamma(t) * SFT(anchor batch) added to its loss.

trl owns sampling, the IFAcc reward call, RLOO's leave-one-out advantages, the clipped policy
loss, logging and (on clusters) accelerate / DeepSpeed. We override one method,
:meth:`AnchoredRLOOTrainer.compute_loss`: it returns trl's RLOO loss plus gamma(t) times the
target-token cross entropy of the policy on a batch of Best-of-N anchors, so both terms go
through the SAME backward pass and optimizer step (the Trainer calls ``compute_loss`` then
``backward`` then ``optimizer.step``). gamma(t) follows :class:`GammaSchedule` on the trainer's
global step.

Why RLOO (and not GRPO or PPO): see :mod:`dpsynth_core.actg.anchored_rl`. In short, PPO needs a
value model, and GRPO divides by the group's reward std, which is 0 or tiny for the 2-4 samples
per prompt we can afford on CPU; RLOO's leave-one-out baseline needs neither. ``beta`` (default
0.2) is trl's KL-in-reward coefficient; the policy is a PEFT model with the DP adapter loaded, so
trl copies that adapter as the frozen "ref" adapter and the KL is to the DP generator (not to the
pretrained base).

Privacy: the stage's contract (:mod:`dpsynth_core.actg.anchored_rl`) -- inputs are an :class:`RLArtifacts` of DP
outputs and public files only (post-processing, zero cost).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth_core.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from dpsynth_core.actg.anchored_rl_base import AnchoredRLConfig, GammaSchedule, RewardFn


def _trl_rloo():
    """``(RLOOConfig, RLOOTrainer)``, imported with vLLM hidden from trl's availability check: trl imports vLLM
    when it is installed (~3 s here, in every RL stage's process) for a generation path this stage never runs
    (``use_vllm`` stays False). The check is put back at once; a later ``use_vllm`` in this process would fail
    loudly (trl: vLLM not available), never fall back silently."""
    import trl.import_utils as trl_imports

    available = trl_imports.is_vllm_available
    trl_imports.is_vllm_available = lambda min_version=None: False
    try:
        from trl import RLOOConfig, RLOOTrainer
    finally:
        trl_imports.is_vllm_available = available
    return RLOOConfig, RLOOTrainer


def _anchored_trainer_class():
    """Built lazily so that importing the library does not import trl."""
    import torch

    _, RLOOTrainer = _trl_rloo()  # noqa: N806 (trl's class)

    from dpsynth_core.actg.anchored_rl_base import sft_loss

    class AnchoredRLOOTrainer(RLOOTrainer):
        """RLOO whose loss is L_RL + gamma(t) * L_SFT(anchors), in one optimizer step."""

        def __init__(self, *args, anchor_examples, gamma: GammaSchedule, anchor_batch_size: int,
                     max_seq_len: int, anchor_seed: int = 0, **kwargs):
            super().__init__(*args, **kwargs)
            self.anchor_examples = list(anchor_examples)
            self.gamma = gamma
            self.anchor_batch_size = anchor_batch_size
            self.max_seq_len = max_seq_len
            self._anchor_rng = torch.Generator().manual_seed(anchor_seed)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            rl_loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            gamma = self.gamma(self.state.global_step)
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["anchor/gamma"].append(gamma)
            self._metrics[mode]["anchor/rl_loss"].append(float(rl_loss.detach()))
            if gamma <= 0:
                self._metrics[mode]["anchor/sft_loss"].append(0.0)
                return rl_loss
            idx = torch.randint(len(self.anchor_examples), (self.anchor_batch_size,),
                                generator=self._anchor_rng).tolist()
            anchor = sft_loss(model, self.processing_class, [self.anchor_examples[i] for i in idx],
                              self.max_seq_len)
            self._metrics[mode]["anchor/sft_loss"].append(float(anchor.detach()))
            return rl_loss + gamma * anchor

    return AnchoredRLOOTrainer


def train_with_trl(policy, tokenizer, *, prompts: list[str], targets: list[dict], anchor_examples: list,
                   reward_fn: RewardFn, config: AnchoredRLConfig, output_dir: Path,
                   progress: bool, placement=None) -> list[dict]:
    """Run Anchored RLOO on trl; returns the per-step history (step, gamma, reward, losses)."""
    import torch
    from datasets import Dataset

    RLOOConfig, _ = _trl_rloo()  # noqa: N806 (trl's class)

    def ifacc_reward(prompts, completions, attributes, **_):
        return [float(r) for r in reward_fn([c.strip() for c in completions],
                                            [json.loads(a) for a in attributes])]

    ifacc_reward.__name__ = "ifacc"
    on_gpu = placement.on_gpu if placement is not None else torch.cuda.is_available()
    dataset = Dataset.from_list([{"prompt": p, "attributes": json.dumps(t, sort_keys=True)}
                                 for p, t in zip(prompts, targets)])
    scratch = Path(output_dir) / ".trl"
    deepspeed = None
    if config.use_accelerate:  # GPU clusters: ZeRO-3 from the launcher's environment (unmeasured here)
        deepspeed = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        if not deepspeed:
            raise ConfigError("field 'rl.use_accelerate': no DeepSpeed config in the environment "
                              "(ACCELERATE_DEEPSPEED_CONFIG_FILE); run the stage through ray_jobs.rl_deepspeed")
    args = RLOOConfig(
        deepspeed=deepspeed,
        output_dir=str(scratch), max_steps=config.steps, seed=config.seed,
        per_device_train_batch_size=config.prompts_per_step * config.group_size,
        num_generations=config.group_size, gradient_accumulation_steps=1, steps_per_generation=1,
        max_completion_length=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
        learning_rate=config.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=config.max_grad_norm, beta=config.beta, normalize_advantages=False,
        # the stage's placement (config/placement.py), not whatever torch sees: a config can keep RL on the CPU
        use_cpu=not on_gpu, bf16=on_gpu and placement.dtype == "bf16",
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=not progress,
        remove_unused_columns=False, dataloader_num_workers=0,
    )
    trainer = _anchored_trainer_class()(
        model=policy, reward_funcs=ifacc_reward, args=args, train_dataset=dataset,
        processing_class=tokenizer, anchor_examples=anchor_examples, gamma=config.gamma_schedule(),
        anchor_batch_size=config.anchor_batch_size, max_seq_len=config.max_seq_len, anchor_seed=config.seed,
    )
    from dpsynth_core.quiet import quiet_trainer

    quiet_trainer(trainer)  # the history below keeps trl's metrics; no raw dict per step on the console
    trainer.train()
    history = []
    for log in trainer.state.log_history:
        if "anchor/gamma" not in log:
            continue
        history.append({"step": int(log["step"]), "gamma": float(log["anchor/gamma"]),
                        "reward": float(log.get("reward", float("nan"))),
                        "reward_std": float(log.get("reward_std", float("nan"))),
                        "rl_loss": float(log["anchor/rl_loss"]), "sft_loss": float(log["anchor/sft_loss"]),
                        "loss": float(log.get("loss", float("nan"))), "kl": float(log.get("kl", float("nan"))),
                        "grad_norm": float(log.get("grad_norm", float("nan"))),
                        "completion_tokens": float(log.get("completions/mean_length", float("nan"))),
                        "seconds": float(log.get("step_time", float("nan")))})
    shutil.rmtree(scratch, ignore_errors=True)
    return history
