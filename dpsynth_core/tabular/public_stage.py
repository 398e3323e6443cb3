"""Stage 1 of DPFairLLM's two-stage training: teach the row format without private data.

The seed paper fine-tunes first on public rows of the table's shape, then runs DP-SGD on the
private rows. Here the public rows are drawn from the public schema alone (each categorical value
uniform over its public categories, each number uniform between its public or DP-released bounds,
the label uniform), so the model learns the serialization, the value vocabulary and a balanced
label prior before it sees any private row. Without this stage a 10-step DP-SGD run on SmolLM2
emits one label for every row (the base model's prior for the label's first token wins).

With ``rows_from: dp_marginals`` each column is drawn from its DP 1-way marginal instead (released
by the ``marginals`` stage under ``budget.marginals``): the model then starts DP-SGD with the
table's marginals, which a short DP-SGD run does not reach from uniform rows.

Privacy: stage 1 reads no private data (only the resolved schema and, optionally, the DP marginals,
each public or the output of an accounted DP mechanism), so it costs no budget of its own and
records nothing in the ledger. The LoRA
adapter it trains is merged into the base model; stage 2 (DP-SGD) trains a fresh adapter on that
merged model. The merged model is a deterministic function of public inputs and is cached by their
hash, so runs with the same public settings share it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import pandas as pd

from dpsynth_core.runs.files import atomic_dir
from dpsynth_core.tabular.schema import TableSchema

MODEL_DIRNAME = "model"


def public_rows(schema: TableSchema, n: int, seed: int, marginals: dict | None = None) -> pd.DataFrame:
    """``n`` rows drawn without private rows: each column independently, uniform over the schema, or
    from its DP 1-way marginal (``dp_domain.dp_marginals``; a numeric column: a bin by its noisy count,
    then uniform inside the bin). The draw is post-processing, so its seed is a config seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        row = {}
        for col in schema.columns:
            m = (marginals or {}).get(col.name)
            weights = m["counts"] if m and sum(m["counts"]) > 0 else None  # all-zero noisy counts: uniform
            if col.is_categorical:
                cells = m["values"] if weights else list(col.categories)
                row[col.name] = rng.choices(cells, weights=weights)[0]
                continue
            lo, hi = float(col.min), float(col.max)
            if weights:
                k = rng.choices(range(len(weights)), weights=weights)[0]
                lo, hi = m["edges"][k], m["edges"][k + 1]
            if col.type == "integer":
                row[col.name] = rng.randint(math.ceil(lo), max(math.ceil(lo), math.floor(hi)))
            else:
                row[col.name] = round(rng.uniform(lo, hi), col.precision)
        rows.append(row)
    return pd.DataFrame(rows, columns=schema.names)


def stage_key(base_model: str, schema: TableSchema, settings: dict, serializer: dict) -> str:
    """Hash of every input of stage 1: the same key means the same merged model."""
    blob = json.dumps({"model": base_model, "schema": schema.model_dump(mode="json"), "settings": settings,
                       "serializer": serializer}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_public_stage(base_model: str, ser, settings, lora, out_dir: Path, *, max_seq_len: int,
                       placement=None, marginals: dict | None = None) -> dict:
    """Non-private LoRA fine-tuning on public schema rows, merged into the base -> ``out_dir/model``.

    ``settings``: :class:`dpsynth_core.tabular.config.PublicStageSettings`; ``lora``: LoraSettings.
    Returns a summary (steps, first and last loss); reuses ``out_dir/model`` when it exists.
    """
    out_dir = Path(out_dir)
    model_dir = out_dir / MODEL_DIRNAME
    if (model_dir / "config.json").is_file():
        return json.loads((out_dir / "summary.json").read_text())
    import torch
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.config.placement import place_model, resolve_placement
    from dpsynth_core.dpsgd import TrainExample
    from dpsynth_core.dpsgd.data import collate, per_example_loss, tokenize_examples
    from dpsynth_core.models import load_causal_lm

    torch.manual_seed(settings.seed)
    placement = placement or resolve_placement("auto")
    model, tok = load_causal_lm(base_model, placement=placement)
    model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                             target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM"))
    place_model(model, placement)  # LoRA weights in fp32 beside a bf16 base
    frame = public_rows(ser.schema, settings.rows, settings.seed, marginals)
    rows = tokenize_examples([TrainExample(p, t) for p, t in ser.examples(frame)], tok, max_seq_len)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate)
    order = random.Random(settings.seed)
    losses = []
    model.train()
    for _ in range(settings.steps):
        batch = collate(order.sample(rows, min(settings.batch_size, len(rows))), tok.pad_token_id)
        batch = {k: v.to(placement.torch_device()) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
        loss = per_example_loss(logits, batch["labels"]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    merged = model.merge_and_unload().to(device="cpu", dtype=torch.float32)  # saved as the CPU fp32 loader expects
    merged.config.use_cache = True
    summary = {"steps": settings.steps, "rows": settings.rows, "loss_first": losses[0], "loss_last": losses[-1]}

    def write(d: Path) -> None:
        merged.save_pretrained(str(d), safe_serialization=True)
        tok.save_pretrained(str(d))

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary))
    atomic_dir(model_dir, write)
    return summary
