"""Tokenization for conditional LM fine-tuning: loss on the target only, per-row position ids.

Padding is masked in the labels through the attention mask, never by token id: SmolLM2's pad
token equals its eos token, which the target must still learn to emit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpsynth_core.dpsgd.config import TrainExample
from dpsynth_core.errors import DataError

IGNORE_INDEX = -100


@dataclass(frozen=True)
class TokenizedExample:
    prompt_ids: list[int]
    target_ids: list[int]


def tokenize_examples(
    examples: Sequence[TrainExample], tokenizer, max_seq_len: int
) -> list[TokenizedExample]:
    """Tokenize prompt and target separately so the prompt/target boundary is exact.

    The target ends with eos (the generator must learn to stop). Over-long rows keep the end of
    the prompt (up to half the budget) and the start of the target.
    """
    eos = tokenizer.eos_token_id
    prompts = tokenizer([e.prompt for e in examples], add_special_tokens=True)["input_ids"]
    targets = tokenizer([e.target for e in examples], add_special_tokens=False)["input_ids"]
    out = []
    for row, (p, t) in enumerate(zip(prompts, targets)):
        t = list(t) + ([eos] if eos is not None else [])
        if len(t) <= 1 and not examples[row].target:
            raise DataError(f"training example row {row}: empty target (nothing to learn)")
        p = list(p)
        if len(p) + len(t) > max_seq_len:
            keep_prompt = min(len(p), max(max_seq_len - len(t), max_seq_len // 2))
            p = p[len(p) - keep_prompt :] if keep_prompt else []
            t = t[: max_seq_len - len(p)]
        out.append(TokenizedExample(p, t))
    return out


def collate(rows: Sequence[TokenizedExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``rows`` into input_ids, attention_mask, labels and per-row position_ids.

    Labels are IGNORE_INDEX on prompt tokens and wherever attention_mask == 0. position_ids are
    built per row (shape [B, T]): opacus's embedding sampler needs the batch dimension.
    """
    if not rows:
        raise ValueError("collate needs at least one row")
    width = max(len(r.prompt_ids) + len(r.target_ids) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    target_mask = torch.zeros((n, width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids = r.prompt_ids + r.target_ids
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        target_mask[i, len(r.prompt_ids) : len(ids)] = True
    labels = input_ids.masked_fill(~(target_mask & attention_mask.bool()), IGNORE_INDEX)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "position_ids": position_ids,
    }


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over each row's target tokens: shape [B].

    Each row's loss depends on that row only, so per-sample clipping bounds its influence.
    """
    # Shift the labels, not the logits: slicing logits[:, :-1] costs a copy of the [B, T, V]
    # tensor (reshape of a non-contiguous slice) and, in backward, a zero-filled [B, T, V]
    # gradient plus another copy. The last position predicts nothing (label IGNORE_INDEX).
    if logits.dtype != torch.float32:
        logits = logits.float()
    next_labels = torch.full_like(labels, IGNORE_INDEX)
    next_labels[:, :-1] = labels[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        next_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(next_labels.shape)
    valid = (next_labels != IGNORE_INDEX).float()
    return (token_loss * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)
