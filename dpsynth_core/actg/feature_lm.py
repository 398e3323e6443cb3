"""Ablation "AIM -> DP-FT feature generator" (``features.generator: dp_ft``).

Instead of AIM, an LM is LoRA-fine-tuned with DP-SGD under eps1 (ledger stage ``features``, its own
DpSgdEvent) on the private attribute rows written as text -- one line per attribute, exactly the
text the conditional generator's prompts carry (``schema.format_attributes``) -- and synthetic rows
are sampled from it. Sampling is constrained to the schema: for each attribute in turn, every
option's log-likelihood after the row so far is scored and one option drawn from their softmax, so
every sampled row is valid (a free-text sample of a small model often is not) and the row's
distribution is the LM's own over the public option lists. Sampling is post-processing of the DP
adapter: its seed is the config's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

FEATURE_PROMPT = "Attributes of a {description}:\n"


def feature_examples(rows: list[dict], schema, text_description: str) -> list:
    """One training example per private attribute row: a fixed prompt -> the row as text."""
    from dpsynth_core.dpsgd import TrainExample

    prompt = FEATURE_PROMPT.format(description=text_description)
    return [TrainExample(prompt=prompt, target=schema.format_attributes(r)) for r in rows]


def _line_prefix(field) -> str:
    # no trailing space: the option is scored as " option" (BPE tokenizers fold the space into it)
    return f"- {field.description or field.name.replace('_', ' ')}:"


def option_logprobs(model, tokenizer, prefix: str, options: list[str]) -> np.ndarray:
    """Sum of token log-probs of ``" " + option + newline`` after ``prefix``, for each option.

    The prefix runs once and its KV cache is shared by the options (one batch, right-padded), so a
    field costs one prefix plus the options' few tokens (~10x fewer tokens than scoring each
    option with the prefix again)."""
    import torch

    prefix_ids = tokenizer(prefix, add_special_tokens=True)["input_ids"]
    conts = [tokenizer(" " + o + "\n", add_special_tokens=False)["input_ids"] for o in options]
    width = max(len(c) for c in conts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(conts), width), pad, dtype=torch.long)
    attn = torch.zeros((len(conts), len(prefix_ids) + width), dtype=torch.long)
    attn[:, :len(prefix_ids)] = 1
    for i, c in enumerate(conts):  # right padding: the real tokens keep their positions
        ids[i, :len(c)], attn[i, len(prefix_ids):len(prefix_ids) + len(c)] = torch.tensor(c), 1
    with torch.no_grad():
        head = model(input_ids=torch.tensor([prefix_ids]), use_cache=True)
        cache = head.past_key_values
        cache.batch_repeat_interleave(len(conts))
        first = torch.log_softmax(head.logits[0, -1].float(), dim=-1)  # predicts each option's first token
        rest = torch.log_softmax(model(input_ids=ids, attention_mask=attn, past_key_values=cache,
                                       use_cache=True).logits.float(), dim=-1)
    out = np.zeros(len(options))
    for i, c in enumerate(conts):
        out[i] = float(first[c[0]]) + sum(float(rest[i, j - 1, c[j]]) for j in range(1, len(c)))
    return out


def sample_rows(model, tokenizer, schema, n_rows: int, text_description: str, seed: int,
                temperature: float = 1.0) -> pd.DataFrame:
    """``n_rows`` schema-valid rows, each attribute drawn from the LM's softmax over its options."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        text, row = FEATURE_PROMPT.format(description=text_description), {}
        for f in schema.fields:
            text += _line_prefix(f)
            scores = option_logprobs(model, tokenizer, text, list(f.options)) / max(temperature, 1e-6)
            p = np.exp(scores - scores.max())
            choice = f.options[int(rng.choice(len(p), p=p / p.sum()))]
            row[f.name] = choice
            text += " " + choice + "\n"
        rows.append(row)
    return pd.DataFrame(rows, columns=schema.field_names)


def synthesize_features_lm(real: pd.DataFrame, schema, cfg, rd, ledger, public_size: int
                           ) -> tuple[pd.DataFrame, dict]:
    """Train the feature LM on the private rows (DP-SGD under eps1, or no noise for epsilon = inf),
    sample ``features.n_synthetic`` rows -> ``rd.features``. Returns (rows, summary)."""
    from dpsynth_core.actg.features import write_csv_atomic
    from dpsynth_core.dpsgd import load_generator, train_dp_lora

    examples = feature_examples(real[schema.field_names].to_dict("records"), schema, cfg.data.text_description)
    # q from the public expected size (the drawn set's size is private), as for the generator
    dp = cfg.feature_lm_config(cfg.epsilon_features).model_copy(update={"public_num_units": public_size})
    out_dir = Path(rd.root) / "feature_lm"
    adapter = out_dir / "adapter"
    if not (adapter / "adapter_config.json").is_file():  # resumed after training: sample again, never re-charge
        if cfg.is_reference:
            from dpsynth_core.dpsgd.noiseless import train_noiseless_lora

            train_noiseless_lora(examples, dp, output_dir=out_dir, ledger=ledger, stage="features")
        else:
            train_dp_lora(examples, dp, output_dir=out_dir, ledger=ledger, stage="features", progress=False)
    model, tokenizer = load_generator(dp.model, adapter)
    synth = sample_rows(model, tokenizer, schema, cfg.features.n_synthetic, cfg.data.text_description, cfg.data.seed)
    schema.validate_table(synth, source="feature LM output")
    write_csv_atomic(synth, rd.features)
    event = [e for e in ledger.entries() if e.stage == "features"]
    return synth, {"mechanism": "DP-SGD LoRA feature LM (option-constrained sampling)", "steps": dp.steps,
                   "noise_multiplier": event[0].params["noise_multiplier"] if event else 0.0,
                   "epsilon_of_event": event[0].epsilon if event else math.inf}
