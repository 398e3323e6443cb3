"""The HF backend's one ``model.generate`` call: a batch of prompts, one completion each, seeded per call.

Post-processing (sees no private data). Every HF generation of the library runs through here, by way
of :class:`~dpsynth_core.engines.hf_engine.HFEngine`; left padding; returns only the new text, stripped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dpsynth_core.engines.config import SamplingParams


def format_prompts(tokenizer, prompts: Sequence[str], chat: bool) -> list[str]:
    if not chat:
        return list(prompts)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def model_device(model) -> torch.device:
    """Where the model's weights are (a wrapped training model, e.g. Opacus', has no ``.device``)."""
    device = getattr(model, "device", None)
    return device if device is not None else next(model.parameters()).device


@torch.no_grad()
def sample_texts(model, tokenizer, prompts: Sequence[str], params: SamplingParams, seed: int,
                 logits_processor=None) -> list[str]:
    """One completion per prompt (``params.n`` and ``params.stop`` are the engine's business), from one
    ``generate`` call after ``torch.manual_seed(seed)``; ``logits_processor`` sees the rows in order."""
    if not prompts:
        return []
    torch.manual_seed(seed)
    texts = format_prompts(tokenizer, prompts, params.chat)
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not params.chat)
    device = model_device(model)
    batch = {k: v.to(device) for k, v in batch.items()}
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
