"""Hugging Face backend: one batched decode loop over rows with their own sampling parameters.

``model.generate`` applies one temperature/top-p/seed to a whole batch, but Serve's dynamic batching
mixes rows from different requests. So we run the KV-cached decode loop ourselves: each row keeps its
own temperature, top-p, token budget and ``torch.Generator`` (so a seeded request gives the same
completion whatever it was batched with, up to floating-point effects of padding).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpsynth_core.errors import ConfigError
from serving.schemas import RequestLimitError, SequenceJob, SequenceOutput, truncate_at_stop


def load_model(model: str, adapter: str | None, *, dtype: str = "auto", merge_adapter: bool = True,
               device: str = "auto"):
    """``(model, tokenizer)`` from the registry on the replica's placement (``dpsynth_core.config.placement``), with a
    peft LoRA adapter applied if given."""
    from dpsynth_core.config.placement import place_model, resolve_placement
    from dpsynth_core.models import load_causal_lm

    placement = resolve_placement(device, dtype)
    lm, tokenizer = load_causal_lm(model, placement=placement)
    if adapter is not None:
        adapter_dir = Path(adapter).expanduser()
        if not (adapter_dir / "adapter_config.json").is_file():
            raise ConfigError(f"{adapter_dir}: not a LoRA adapter directory (no adapter_config.json)")
        from peft import PeftModel

        lm = place_model(PeftModel.from_pretrained(lm, str(adapter_dir)), placement)
        if merge_adapter:
            lm = lm.merge_and_unload()
        lm.eval()
    return lm, tokenizer


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def sample_next(logits: torch.Tensor, jobs: list[SequenceJob], generators: list[torch.Generator]) -> torch.Tensor:
    """Next token per row: greedy where temperature == 0, else temperature + nucleus (top-p) sampling.

    Each row draws one uniform number from its own generator and inverts its CDF (vectorised), so
    a row's randomness never depends on the other rows of the batch.
    """
    logits = logits.float()
    out = logits.argmax(dim=-1)
    sampled = [i for i, job in enumerate(jobs) if job.temperature > 0]
    if not sampled:
        return out
    temps = torch.tensor([jobs[i].temperature for i in sampled], dtype=torch.float32).unsqueeze(1)
    probs = torch.softmax(logits[sampled] / temps, dim=-1)
    order = None
    top_p = torch.tensor([jobs[i].top_p for i in sampled], dtype=torch.float32).unsqueeze(1)
    if bool((top_p < 1.0).any()):  # sorting 50k-entry rows is the expensive part: only when needed
        probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        drop = ((probs.cumsum(dim=-1) - probs) >= top_p) & (top_p < 1.0)
        probs = probs.masked_fill(drop, 0.0)
    cdf = probs.cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=generators[i]) for i in sampled]).unsqueeze(1) * cdf[:, -1:]
    picks = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1).squeeze(1)
    if order is not None:
        picks = order.gather(1, picks.unsqueeze(1)).squeeze(1)
    out[sampled] = picks
    return out


class HFBackend:
    """Loads the model once per replica; ``generate(jobs)`` runs one padded batch to completion."""

    def __init__(
        self,
        model: str,
        adapter: str | None = None,
        *,
        dtype: str = "auto",
        torch_threads: int = 2,
        merge_adapter: bool = True,
        max_prompt_tokens: int = 2048,
        device: str = "auto",
    ) -> None:
        torch.set_num_threads(torch_threads)
        self.model, self.tokenizer = load_model(model, adapter, dtype=dtype, merge_adapter=merge_adapter, device=device)
        self.device = self.model.device
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id
        self.max_prompt_tokens = max_prompt_tokens
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    def render_chat(self, messages: list[dict]) -> str:
        """The tokenizer's chat template, ending with the assistant turn prompt."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestLimitError("this model has no chat template; use /v1/completions")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, jobs: list[SequenceJob]) -> tuple[torch.Tensor, torch.Tensor]:
        # Rows tokenized one by one: chat rows must not get special tokens added twice.
        rows = [
            self.tokenizer(job.prompt, add_special_tokens=job.add_special_tokens)["input_ids"] for job in jobs
        ]
        for job, ids in zip(jobs, rows):
            if len(ids) > self.max_prompt_tokens:
                raise RequestLimitError(f"'prompt': {len(ids)} tokens exceed the limit of {self.max_prompt_tokens}")
            if self.context_length and len(ids) + job.max_new_tokens > self.context_length:
                raise RequestLimitError(
                    f"'max_tokens': prompt ({len(ids)} tokens) + max_tokens ({job.max_new_tokens}) exceed the "
                    f"model context of {self.context_length}"
                )
        width = max(len(ids) for ids in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for r, ids in enumerate(rows):  # left padding: every row's last token sits at the end
            if ids:
                input_ids[r, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                attention[r, width - len(ids):] = 1
        return input_ids, attention

    @torch.inference_mode()
    def generate(self, jobs: list[SequenceJob]) -> list[SequenceOutput]:
        """Decode all rows together until each hit eos or its own ``max_new_tokens``."""
        input_ids, attention = self._encode(jobs)
        prompt_lengths = attention.sum(dim=1).tolist()
        generators = [torch.Generator().manual_seed(job.seed) for job in jobs]
        budgets = [job.max_new_tokens for job in jobs]
        tokens: list[list[int]] = [[] for _ in jobs]
        finish = ["length"] * len(jobs)
        done = [False] * len(jobs)

        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        step_ids, cache = input_ids, None
        for _ in range(max(budgets)):
            for r, job in enumerate(jobs):  # a cancelled request (timeout, client gone) frees its rows' work
                if job.cancelled is not None and job.cancelled.is_set():
                    done[r] = True
            if all(done):
                break
            out = self.model(  # index tensors live on CPU; only the forward runs on the model's device
                input_ids=step_ids.to(self.device),
                attention_mask=attention.to(self.device),
                position_ids=positions.to(self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            next_ids = sample_next(out.logits[:, -1, :].cpu(), jobs, generators)  # per-row CPU generators
            for r, token in enumerate(next_ids.tolist()):
                if done[r]:
                    continue
                if token in self.eos_ids:
                    done[r], finish[r] = True, "stop"
                    continue
                tokens[r].append(token)
                if len(tokens[r]) >= budgets[r]:
                    done[r] = True
            if all(done):
                break
            step_ids = torch.tensor(
                [[self.pad_id if done[r] else t] for r, t in enumerate(next_ids.tolist())], dtype=torch.long
            )
            attention = torch.cat([attention, torch.ones((len(jobs), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1

        outputs = []
        for r, job in enumerate(jobs):
            text = self.tokenizer.decode(tokens[r], skip_special_tokens=True)
            reason = finish[r]
            if job.stop:
                text, cut = truncate_at_stop(text, job.stop)
                reason = "stop" if cut else reason
            outputs.append(SequenceOutput(text, int(prompt_lengths[r]), len(tokens[r]), reason))
        return outputs
