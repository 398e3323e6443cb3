"""Plain batched sampling from a causal LM (post-processing: sees no private data).

Shared by batch generation (Ray Data), the pipelines and the benchmarks. Reproducible: one
seed per call; left padding; returns only the new text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 0.95
    seed: int = 0
    chat: bool = False  # wrap each prompt in the tokenizer's chat template (instruct models)


def format_prompts(tokenizer, prompts: Sequence[str], chat: bool) -> list[str]:
    if not chat:
        return list(prompts)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


@torch.no_grad()
def sample_texts(model, tokenizer, prompts: Sequence[str], params: SamplingParams, logits_processor=None) -> list[str]:
    """One completion per prompt."""
    if not prompts:
        return []
    torch.manual_seed(params.seed)
    texts = format_prompts(tokenizer, prompts, params.chat)
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not params.chat)
    batch = {k: v.to(model.device) for k, v in batch.items()}
    do_sample = params.temperature > 0
    out = model.generate(
        **batch,
        max_new_tokens=params.max_new_tokens,
        do_sample=do_sample,
        temperature=params.temperature if do_sample else None,
        top_p=params.top_p if do_sample else None,
        pad_token_id=tokenizer.pad_token_id,
        logits_processor=logits_processor,
    )
    new_tokens = out[:, batch["input_ids"].shape[1]:]
    return [t.strip() for t in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]
