"""The plain-torch Anchored RLOO update: the reference the library's one RL engine (trl's
``RLOOTrainer`` + the anchor term, ``dpsynth_core.actg.anchored_rl_trl``) is checked against.

It was the library's second engine (``rl.engine: torch``); it now lives only here, where a test runs
one step of each from the same start and compares the updates. The standard on-policy RLOO step:
sample ``group_size`` completions per prompt, reward r_i, advantage A_i = r_i - mean_{j != i} r_j
(minus ``beta`` x the per-sequence KL to the frozen DP adapter "ref"), and

    L_RL  = - mean_i  A_i * (1/|y_i|) sum_t log pi(y_i,t | x_i, y_i,<t)
    L     = L_RL + gamma(t) * L_SFT(anchor batch)      (one backward, one optimizer step)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dpsynth_core.actg.anchored_rl import load_trainable_policy as load_dp_policy
from dpsynth_core.actg.anchored_rl_base import AnchoredRLConfig, RewardFn, sft_loss
from dpsynth_core.errors import DataError


def load_trainable_policy(base_model: str, adapter_dir: Path, with_reference: bool = False, placement=None):
    """The library's trainable DP policy; ``with_reference`` adds a frozen copy of the DP adapter named
    "ref" (trl makes the same copy itself when ``beta > 0``)."""
    from dpsynth_core.config.placement import place_model, resolve_placement

    policy, tokenizer = load_dp_policy(base_model, adapter_dir, placement=placement)
    if with_reference:
        policy.load_adapter(str(adapter_dir), adapter_name="ref", is_trainable=False)
        policy.set_adapter("default")
        place_model(policy, placement or resolve_placement("cpu"))  # the frozen copy joins the base's dtype
    return policy, tokenizer


# ---------------------------------------------------------------------------------------------
def rloo_advantages(rewards, group_size: int):
    """A_i = r_i - mean of the other rewards of the same prompt (rewards laid out prompt-major)."""
    r = rewards.view(-1, group_size).double()
    adv = group_size / (group_size - 1) * (r - r.mean(dim=1, keepdim=True))  # = r_i - mean_{j!=i} r_j
    tied = (r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values)
    return adv.masked_fill(tied, 0.0).view(-1).to(rewards.dtype)  # a tied group carries no signal (exactly 0)


def sample_completions(policy, tokenizer, prompts: Sequence[str], config: AnchoredRLConfig, seed: int):
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
                               pad_token_id=tokenizer.pad_token_id)
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


def anchored_rl_step(policy, tokenizer, optimizer, *, prompts: Sequence[str], targets: Sequence[dict],
                     anchor_examples: Sequence, gamma: float, reward_fn: RewardFn,
                     config: AnchoredRLConfig, seed: int) -> dict:
    """One Anchored-RL optimizer step: sample, reward, RLOO loss + gamma * SFT loss, backward, step."""
    import torch

    g = config.group_size
    flat_prompts = [p for p in prompts for _ in range(g)]
    flat_targets = [t for t in targets for _ in range(g)]
    seqs, width, mask, attn, texts = sample_completions(policy, tokenizer, flat_prompts, config, seed)
    rewards = torch.tensor(reward_fn(texts, flat_targets), dtype=torch.float32)
    kl = kl_to_reference(policy, seqs, attn, width, mask) if config.beta > 0 else torch.zeros_like(rewards)
    adv = rloo_advantages(rewards - config.beta * kl.cpu(), g).to(policy.device)
    policy.train()
    logp = completion_logprob_mean(policy, seqs, attn, width, mask)
    rl_loss = -(adv * logp).mean()
    anchor = sft_loss(policy, tokenizer, anchor_examples, config.max_seq_len) if gamma > 0 else torch.zeros(())
    loss = rl_loss + gamma * anchor
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    optimizer.step()
    return {"gamma": gamma, "reward": float(rewards.mean()), "kl": float(kl.mean()), "reward_std": float(rewards.std(unbiased=False)),
            "rl_loss": float(rl_loss.detach()), "sft_loss": float(anchor.detach()),
            "loss": float(loss.detach()), "grad_norm": float(grad_norm),
            "completion_tokens": float(mask.float().sum(dim=1).mean())}
