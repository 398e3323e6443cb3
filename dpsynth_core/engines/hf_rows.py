"""The HF backend's decode loop for rows that each carry their own sampling parameters.

``model.generate`` applies one temperature/top-p/seed to a whole batch, but a server's dynamic batching
mixes rows of different requests. So the KV-cached decode loop runs here: each row keeps its own
temperature, top-p, token budget and ``torch.Generator`` (a seeded row gives the same completion whatever
it was batched with, up to floating-point effects of padding). Post-processing: sees no private data.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpsynth_core.engines.config import SamplingParams


@dataclass
class DecodeRow:
    """One row of a batch: its prompt's token ids and its sampling parameters (``seed`` set, ``n`` 1).
    ``cancelled`` set (request timed out, client gone): the loop stops decoding the row."""

    input_ids: list[int]
    params: SamplingParams
    cancelled: threading.Event | None = None


@dataclass
class DecodedRow:
    token_ids: list[int]
    finish_reason: str  # "stop" (eos) | "length"


def eos_ids(model, tokenizer) -> set[int]:
    """Every token id that ends a completion (the model's generation config and the tokenizer's)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index of the first entry whose cumulative mass exceeds ``u`` x the row's total mass."""
    cdf = probs.cumsum(dim=-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=cdf.shape[1] - 1).squeeze(1)


def sample_next(logits: torch.Tensor, params: Sequence[SamplingParams], generators: list[torch.Generator]) -> torch.Tensor:
    """Next token per row: greedy where temperature == 0, else temperature + nucleus (top-p) sampling.

    Each row draws one uniform number from its own generator and inverts its own CDF: in vocabulary order
    without top-p, in descending-probability order with it. So a row's token depends on its own parameters
    and draw only, never on whether a batch mate asked for top-p (it used to: one mate with top_p < 1 sorted
    every row's CDF).
    """
    logits = logits.float()
    out = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if not sampled:
        return out
    temps = torch.tensor([params[i].temperature for i in sampled], dtype=torch.float32).unsqueeze(1)
    probs = torch.softmax(logits[sampled] / temps, dim=-1)
    u = torch.cat([torch.rand(1, generator=generators[i]) for i in sampled]).unsqueeze(1)
    picks = torch.empty(len(sampled), dtype=torch.long)
    plain = [j for j, i in enumerate(sampled) if params[i].top_p >= 1.0]
    nucleus = [j for j, i in enumerate(sampled) if params[i].top_p < 1.0]
    if plain:
        picks[plain] = _inverse_cdf(probs[plain], u[plain])
    if nucleus:  # sorting 50k-entry rows is the expensive part: only the rows that need it
        top_p = torch.tensor([params[sampled[j]].top_p for j in nucleus], dtype=torch.float32).unsqueeze(1)
        ordered, order = probs[nucleus].sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        ordered = ordered.masked_fill((ordered.cumsum(dim=-1) - ordered) >= top_p, 0.0)
        picks[nucleus] = order.gather(1, _inverse_cdf(ordered, u[nucleus]).unsqueeze(1)).squeeze(1)
    out[sampled] = picks
    return out


def _left_padded(rows: Sequence[DecodeRow], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r.input_ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding: every row's last token sits at the end
        if row.input_ids:
            input_ids[i, width - len(row.input_ids):] = torch.tensor(row.input_ids, dtype=torch.long)
            attention[i, width - len(row.input_ids):] = 1
    return input_ids, attention


@torch.inference_mode()
def decode_rows(model, tokenizer, rows: Sequence[DecodeRow]) -> list[DecodedRow]:
    """Decode all rows together until each hit eos or its own ``max_new_tokens``."""
    if any(r.params.seed is None or r.params.n != 1 for r in rows):
        raise ValueError("every decode row needs its own seed and n = 1")
    params = [r.params for r in rows]
    pad_id, stops = tokenizer.pad_token_id, eos_ids(model, tokenizer)
    device = model.device
    input_ids, attention = _left_padded(rows, pad_id)
    generators = [torch.Generator().manual_seed(p.seed) for p in params]
    budgets = [p.max_new_tokens for p in params]
    tokens: list[list[int]] = [[] for _ in rows]
    finish = ["length"] * len(rows)
    done = [False] * len(rows)

    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    step_ids, cache = input_ids, None
    for _ in range(max(budgets, default=0)):
        for r, row in enumerate(rows):  # a cancelled request (timeout, client gone) frees its rows' work
            if row.cancelled is not None and row.cancelled.is_set():
                done[r] = True
        if all(done):
            break
        out = model(  # index tensors live on CPU; only the forward runs on the model's device
            input_ids=step_ids.to(device),
            attention_mask=attention.to(device),
            position_ids=positions.to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        next_ids = sample_next(out.logits[:, -1, :].cpu(), params, generators)  # per-row CPU generators
        for r, token in enumerate(next_ids.tolist()):
            if done[r]:
                continue
            if token in stops:
                done[r], finish[r] = True, "stop"
                continue
            tokens[r].append(token)
            if len(tokens[r]) >= budgets[r]:
                done[r] = True
        if all(done):
            break
        step_ids = torch.tensor([[pad_id if done[r] else t] for r, t in enumerate(next_ids.tolist())], dtype=torch.long)
        attention = torch.cat([attention, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
    return [DecodedRow(t, f) for t, f in zip(tokens, finish)]
