"""Anchored RL: L = L_RL + gamma(t) * L_SFT(anchor set), one optimizer step for both terms.

Algorithm: **RLOO** (REINFORCE Leave-One-Out, Ahmadian et al. 2024). Two engines, one config:
``engine: trl`` (default) runs ``trl.RLOOTrainer`` with the anchor term added to its loss
(:mod:`dpsynth_core.actg.anchored_rl_trl`); ``engine: torch`` runs the same update below in plain
torch (kept for its explicit accelerate/ZeRO-3 path and as a cross-check of the trl engine).

* KL: ``beta`` (default 0.2, the reference's PPO coefficient) times the per-sequence KL of the
  policy to the DP generator is subtracted from the reward, beside gamma(t) * L_SFT; the reference
  is a frozen copy of the DP adapter (trl's "ref" adapter; the torch engine loads the same copy).
  ``gamma0 = gamma1 = 0`` with ``beta > 0`` is the paper's "standard RL, no anchor" ablation.
* PPO: the installed trl (1.16) no longer ships a PPO trainer (neither in ``trl`` nor in
  ``trl.experimental``), so the paper's PPO is replaced by RLOO with the same KL-in-reward form.
* Why RLOO (not PPO): PPO needs a value model (a second network, its own loss and memory) and
  several epochs per batch; on a 2-core CPU that doubles the cost for no gain on such short
  horizons. RLOO and GRPO both use the other samples of the same prompt as the baseline. Among
  the two we take RLOO: its leave-one-out baseline is unbiased and it does not divide by the
  group's reward std, which is 0 (or tiny) for the groups of 2-4 samples we can afford here and
  would blow up GRPO's normalised advantage.
* The anchor term enters the SAME backward pass and optimizer step as the policy-gradient term,
  with a per-step gamma (the trl engine overrides ``compute_loss`` for that). The plain-torch
  update below is the standard on-policy RLOO update (one gradient
  step per batch, so the PPO ratio is 1 and clipping is moot): sample ``group_size``
  completions per prompt with the current policy, reward r_i = IFAcc(completion_i, attributes),
  advantage A_i = r_i - mean_{j != i} r_j, and

      L_RL  = - mean_i  A_i * (1/|y_i|) sum_t log pi(y_i,t | x_i, y_i,<t)
      L_SFT = mean over an anchor batch of the target-token cross entropy
      L     = L_RL + gamma(t) * L_SFT ,   gamma: gamma0 -> gamma1 (linear | cosine | step)

  The completion token ids are the sampled ones (not re-tokenised text), so log-probs are exact.

Privacy: the RL stage sees NO private record. Its only inputs are the fields of
:class:`RLArtifacts` -- the schema, the AIM (DP) synthetic attribute table, the Best-of-N anchor
set (generated from the DP generator) and the DP generator itself -- so it is post-processing
and costs nothing (the pipeline records a PostProcessingEvent). This is enforced structurally:
:func:`run_anchored_rl` accepts only an :class:`RLArtifacts` of paths, refuses any path that lies
inside the private data directory, and the pipeline runs it in a fresh Ray worker whose
``DPSYNTH_DATA_DIR`` points at an empty directory (tests/test_anchored_rl.py audits every file
the stage opens).

GPU clusters (7B-class policies): no DP-SGD is needed here, so the stage scales with DeepSpeed
ZeRO-3 through accelerate. ``ray_jobs/actg_rl_zero3.json`` is the DeepSpeed config; set
``use_accelerate: true`` in the RL config and launch the driver with
``accelerate launch --use_deepspeed --deepspeed_config_file ray_jobs/actg_rl_zero3.json
--num_processes 8 -m ray_jobs.actg --config CONFIG`` (or wrap :func:`run_anchored_rl` in a Ray
``TorchTrainer`` with the same config). UNMEASURED: this machine has no GPU; the accelerate path
is written against accelerate's public API (prepare / backward / unwrap_model) but never ran here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpsynth_core.config import BATCH_CAP, NEW_TOKENS_CAP, SEQ_LEN_CAP, STEPS_CAP, StrictConfig, cap
from dpsynth_core.errors import DataError

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
    # "trl": trl.RLOOTrainer + the anchor term (anchored_rl_trl.py); "torch": the same update in
    # plain torch below (no Trainer machinery; its accelerate path is the ZeRO-3 route).
    engine: Literal["trl", "torch"] = "trl"
    use_accelerate: bool = False  # engine "torch" on GPU clusters: DeepSpeed ZeRO-3 via accelerate (unmeasured here)
    # where the policy trains (dpsynth_core.config.placement); LoRA weights stay fp32 under a bf16 base
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "bf16", "fp32"] = "auto"

    def placement(self):
        from dpsynth_core.config.placement import resolve_placement

        return resolve_placement(self.device, self.dtype, section="rl.")

    def gamma_schedule(self) -> GammaSchedule:
        return GammaSchedule(self.gamma0, self.gamma1, self.steps, self.schedule, self.step_at)


class RLArtifacts(BaseModel):
    """Everything the RL stage may see -- and nothing else. All of it is DP output or public."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    schema_path: Path            # public schema
    attributes_path: Path        # AIM synthetic attribute table (features.csv), DP
    anchors_path: Path           # Best-of-N anchor set (anchors.jsonl), generated by the DP generator
    base_model: str              # public pretrained model name
    adapter_dir: Path            # DP-SGD LoRA adapter, DP
    prompt_template: str         # public prompt template text
    text_description: str        # public
    extractor: dict = Field(default_factory=dict)  # ExtractorConfig of the reward (public models)

    @model_validator(mode="after")
    def _files_exist(self) -> RLArtifacts:
        for name in ("schema_path", "attributes_path", "anchors_path", "adapter_dir"):
            if not getattr(self, name).exists():
                raise DataError(f"anchored RL: artifact '{name}' not found: {getattr(self, name)}")
        return self


def assert_no_private_paths(artifacts: RLArtifacts, private_dir: Path | None = None) -> None:
    """Refuse artifacts that live inside the private data directory (``data_dir()`` by default)."""
    if private_dir is None:
        try:
            from dpsynth_core.data import data_dir

            private_dir = data_dir()
        except Exception:  # no private data dir configured here: nothing to collide with
            return
    private = Path(private_dir).resolve()
    for name in ("schema_path", "attributes_path", "anchors_path", "adapter_dir"):
        p = Path(getattr(artifacts, name)).resolve()
        if p == private or private in p.parents:
            raise DataError(f"anchored RL: artifact '{name}' lies inside the private data directory {private}")


@dataclass
class RLResult:
    adapter_dir: Path
    history: list[dict] = field(default_factory=list)  # step, gamma, reward, rl_loss, sft_loss, loss


# ---------------------------------------------------------------------------------------------
# the update
# ---------------------------------------------------------------------------------------------
def rloo_advantages(rewards, group_size: int):
    """A_i = r_i - mean of the other rewards of the same prompt (rewards laid out prompt-major)."""
    r = rewards.view(-1, group_size).double()
    adv = group_size / (group_size - 1) * (r - r.mean(dim=1, keepdim=True))  # = r_i - mean_{j!=i} r_j
    tied = (r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values)
    return adv.masked_fill(tied, 0.0).view(-1).to(rewards.dtype)  # a tied group carries no signal (exactly 0)


def sample_completions(policy, tokenizer, prompts: Sequence[str], config: AnchoredRLConfig, seed: int,
                       synced_gpus: bool = False):
    """Sample with the current policy; returns (sequences, prompt_width, completion_mask, texts).

    Prompts are left-padded; the completion mask keeps tokens up to and including the first eos.
    """
    import torch

    torch.manual_seed(seed)
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
    enc = {k: v.to(policy.device) for k, v in enc.items()}
    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        seqs = policy.generate(**enc, max_new_tokens=config.max_new_tokens, do_sample=True,
                               temperature=config.temperature, top_p=config.top_p,
                               pad_token_id=tokenizer.pad_token_id,
                               **({"synced_gpus": True} if synced_gpus else {}))  # ZeRO-3: ranks in lockstep
    policy.train(was_training)
    width = enc["input_ids"].shape[1]
    completion = seqs[:, width:]
    eos = tokenizer.eos_token_id
    is_eos = completion == eos if eos is not None else torch.zeros_like(completion, dtype=torch.bool)
    # keep tokens up to and including the first eos
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    mask = ~after_eos
    texts = [t.strip() for t in tokenizer.batch_decode(completion.masked_fill(~mask, tokenizer.pad_token_id),
                                                        skip_special_tokens=True)]
    attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
    return seqs, width, mask, attn, texts


def completion_logprob_mean(policy, seqs, attn, width: int, mask):
    """Per sequence: mean log-prob of its completion tokens under ``policy`` (with grad)."""
    import torch

    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
    logits = policy(input_ids=seqs, attention_mask=attn, position_ids=position_ids).logits
    logits = logits[:, width - 1:-1, :].float()
    target = seqs[:, width:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    m = mask.float()
    return (logp * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


def kl_to_reference(policy, seqs, attn, width: int, mask, reference: str = "ref"):
    """Per sequence: sum over completion tokens of log pi(y_t) - log pi_ref(y_t), the first-order KL
    estimate that RLOO subtracts from the reward; ``reference`` is the frozen copy of the DP adapter."""
    import torch

    if reference not in getattr(policy, "peft_config", {}):
        raise DataError(f"anchored RL: beta > 0 needs the frozen reference adapter '{reference}' "
                        "(load_trainable_policy(..., with_reference=True))")
    tokens = mask.float().sum(dim=1)
    with torch.no_grad():
        logp = completion_logprob_mean(policy, seqs, attn, width, mask)
        policy.set_adapter(reference)
        try:
            ref = completion_logprob_mean(policy, seqs, attn, width, mask)
        finally:
            policy.set_adapter("default")
    return (logp - ref) * tokens


def sft_loss(policy, tokenizer, anchor_examples: Sequence, max_seq_len: int):
    """Mean target-token cross entropy of the policy on a batch of anchor TrainExamples."""
    from dpsynth_core.dpsgd.data import collate, per_example_loss, tokenize_examples

    rows = tokenize_examples(anchor_examples, tokenizer, max_seq_len)
    batch = {k: v.to(policy.device) for k, v in collate(rows, tokenizer.pad_token_id).items()}
    logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"]).logits
    return per_example_loss(logits, batch["labels"]).mean()


def anchored_rl_step(policy, tokenizer, optimizer, *, prompts: Sequence[str], targets: Sequence[dict],
                     anchor_examples: Sequence, gamma: float, reward_fn: RewardFn,
                     config: AnchoredRLConfig, seed: int, accelerator=None) -> dict:
    """One Anchored-RL optimizer step: sample, reward, RLOO loss + gamma * SFT loss, backward, step."""
    import torch

    g = config.group_size
    flat_prompts = [p for p in prompts for _ in range(g)]
    flat_targets = [t for t in targets for _ in range(g)]
    sampler = accelerator.unwrap_model(policy) if accelerator is not None else policy
    synced = accelerator is not None and accelerator.num_processes > 1
    seqs, width, mask, attn, texts = sample_completions(sampler, tokenizer, flat_prompts, config, seed, synced)
    rewards = torch.tensor(reward_fn(texts, flat_targets), dtype=torch.float32)
    kl = kl_to_reference(sampler, seqs, attn, width, mask) if config.beta > 0 else torch.zeros_like(rewards)  # unwrapped: set_adapter
    adv = rloo_advantages(rewards - config.beta * kl.cpu(), g).to(policy.device)
    policy.train()
    logp = completion_logprob_mean(policy, seqs, attn, width, mask)
    rl_loss = -(adv * logp).mean()
    anchor = sft_loss(policy, tokenizer, anchor_examples, config.max_seq_len) if gamma > 0 else torch.zeros(())
    loss = rl_loss + gamma * anchor
    optimizer.zero_grad(set_to_none=True)
    if accelerator is not None:
        accelerator.backward(loss)
    else:
        loss.backward()
    params = [p for p in policy.parameters() if p.requires_grad]
    if accelerator is not None:  # under ZeRO-3 the grads are sharded: let accelerate clip them
        grad_norm = accelerator.clip_grad_norm_(params, config.max_grad_norm)
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    optimizer.step()
    return {"gamma": gamma, "reward": float(rewards.mean()), "kl": float(kl.mean()), "reward_std": float(rewards.std(unbiased=False)),
            "rl_loss": float(rl_loss.detach()), "sft_loss": float(anchor.detach()),
            "loss": float(loss.detach()), "grad_norm": float(grad_norm),
            "completion_tokens": float(mask.float().sum(dim=1).mean())}


# ---------------------------------------------------------------------------------------------
# the stage
# ---------------------------------------------------------------------------------------------
def load_trainable_policy(base_model: str, adapter_dir: Path, with_reference: bool = False, placement=None):
    """The DP generator (base + LoRA adapter) with its LoRA weights trainable; ``with_reference``
    adds a frozen copy of the DP adapter named "ref" (the KL reference of the torch engine; trl
    makes the same copy itself). ``placement`` (``config.placement.Placement``; default CPU fp32) puts it
    on its device, the trainable LoRA weights in fp32."""
    from peft import PeftModel

    from dpsynth_core.config.placement import place_model, resolve_placement
    from dpsynth_core.models import load_causal_lm

    placement = placement or resolve_placement("cpu")
    base, tokenizer = load_causal_lm(base_model, placement=placement)
    policy = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    if with_reference:
        policy.load_adapter(str(adapter_dir), adapter_name="ref", is_trainable=False)
        policy.set_adapter("default")
    return place_model(policy, placement), tokenizer


def read_anchor_set(path: Path) -> list[dict]:
    """Anchors written by the Best-of-N stage: one JSON object per line with attributes and text."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise DataError(f"{path}: line {i + 1}: not valid JSON") from None
            if not isinstance(row.get("attributes"), dict) or not isinstance(row.get("text"), str):
                raise DataError(f"{path}: line {i + 1}: expected fields 'attributes' (object) and 'text' (string)")
            rows.append(row)
    if not rows:
        raise DataError(f"{path}: the anchor set is empty")
    return rows


def save_adapter_plain(policy, directory: Path) -> bool:
    """The trained adapter only (not the frozen KL reference) -> ``directory``; True: written."""
    policy.save_pretrained(str(directory), selected_adapters=["default"])
    return True


def run_anchored_rl(artifacts: RLArtifacts, config: AnchoredRLConfig, output_dir: Path, *,
                    reward_fn: RewardFn | None = None, progress: bool = True,
                    save_adapter: Callable[[object, Path], bool] = save_adapter_plain) -> RLResult:
    """Anchored RL from artifact paths only; writes ``output_dir/adapter`` (atomically) and
    ``output_dir/rl_history.json``. ``reward_fn`` defaults to the configured extractor's IFAcc.
    ``save_adapter(policy, dir)`` writes the adapter (a ZeRO-3 runner gathers the sharded LoRA
    weights first and writes on rank 0 only: ``ray_jobs.rl_deepspeed``); False: nothing written here."""
    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    from dpsynth_core.actg.generator import format_prompt
    from dpsynth_core.actg.schema import load_schema
    from dpsynth_core.dpsgd import TrainExample

    placement = config.placement()  # a forced device this process cannot see fails before any file is read
    assert_no_private_paths(artifacts)
    schema = load_schema(artifacts.schema_path)
    table = pd.read_csv(artifacts.attributes_path, dtype=str, keep_default_na=False)
    schema.validate_table(table, source=str(artifacts.attributes_path))
    attribute_rows = table[schema.field_names].to_dict("records")
    anchors = read_anchor_set(artifacts.anchors_path)
    if reward_fn is None:
        from dpsynth_core.actg.extractors import build_extractor

        extractor = build_extractor(artifacts.extractor or "embedding", schema)  # the reward's own placement
        reward_fn = extractor.ifacc

    def prompt_of(row: dict) -> str:
        return format_prompt(schema, row, artifacts.prompt_template, text_description=artifacts.text_description)

    anchor_examples = [TrainExample(prompt=prompt_of(a["attributes"]), target=" " + a["text"].strip())
                       for a in anchors if a["text"].strip()]
    if not anchor_examples:
        raise DataError(f"{artifacts.anchors_path}: every anchor text is empty")
    torch.manual_seed(config.seed)
    policy, tokenizer = load_trainable_policy(artifacts.base_model, artifacts.adapter_dir,
                                              with_reference=config.engine == "torch" and config.beta > 0,
                                              placement=placement)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    accelerator = None
    if config.engine == "trl":
        from dpsynth_core.actg.anchored_rl_trl import train_with_trl

        # enough prompts for every step; trl samples them without replacement per epoch
        n = max(len(attribute_rows), config.steps * config.prompts_per_step)
        targets = [attribute_rows[i % len(attribute_rows)] for i in range(n)]
        history = train_with_trl(policy, tokenizer, prompts=[prompt_of(r) for r in targets], targets=targets,
                                 anchor_examples=anchor_examples, reward_fn=reward_fn, config=config,
                                 output_dir=output_dir, progress=progress, placement=placement)
    else:
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
        if config.use_accelerate:  # pragma: no cover - GPU clusters only, unmeasured here
            from accelerate import Accelerator

            accelerator = Accelerator()
            policy, optimizer = accelerator.prepare(policy, optimizer)
        gamma = config.gamma_schedule()
        rng = torch.Generator().manual_seed(config.seed)
        history = []
        for t in tqdm(range(config.steps), desc="anchored RL", disable=not progress, unit="step"):
            idx = torch.randint(len(attribute_rows), (config.prompts_per_step,), generator=rng).tolist()
            aidx = torch.randint(len(anchor_examples), (config.anchor_batch_size,), generator=rng).tolist()
            targets = [attribute_rows[i] for i in idx]
            t0 = time.perf_counter()
            row = anchored_rl_step(policy, tokenizer, optimizer, prompts=[prompt_of(r) for r in targets],
                                   targets=targets, anchor_examples=[anchor_examples[i] for i in aidx],
                                   gamma=gamma(t), reward_fn=reward_fn, config=config,
                                   seed=config.seed * 7919 + t, accelerator=accelerator)
            row.update(step=t + 1, seconds=time.perf_counter() - t0)
            history.append(row)
    if accelerator is not None:  # pragma: no cover
        policy = accelerator.unwrap_model(policy)
    final, tmp = output_dir / "adapter", output_dir / ".adapter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if save_adapter(policy, tmp):
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    hist_tmp = output_dir / ".rl_history.json.tmp"
    hist_tmp.write_text(json.dumps(history, indent=2))
    os.replace(hist_tmp, output_dir / "rl_history.json")
    return RLResult(adapter_dir=final, history=history)



def plot_rl_history(history: Sequence[dict], path: Path) -> Path:
    """Reward, SFT loss and gamma per RL step (matplotlib Agg, written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward"] for h in history], marker="o", label="reward (IFAcc)")
    ax.plot(steps, [h["sft_loss"] for h in history], marker="s", label="anchor SFT loss")
    ax.set_xlabel("RL step")
    ax2 = ax.twinx()
    ax2.plot(steps, [h["gamma"] for h in history], color="tab:gray", linestyle="--", label="gamma(t)")
    ax2.set_ylabel("gamma")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [l.get_label() for l in lines], loc="best", fontsize=8)
    ax.set_title("Anchored RL (RLOO + gamma(t) * SFT)")
    return _save(fig, Path(path))


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
