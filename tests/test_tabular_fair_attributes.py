"""Several sensitive attributes: config forms, the DP term summed over attributes (its optimum closes
each attribute's gap by its own lambda), one DP table per attribute in one ledger entry, and the
rejection sampler and the label tilt enforcing every attribute.

On the old code ``fairness.sensitive`` took one string, the penalty one attribute, generation one
tracker and one tilt: every test here fails there (a list is refused, or the names do not exist).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pandas as pd
import pytest
import torch

from dpsynth_core.tabular.config import FairGenerationSettings, FairnessSettings
from dpsynth_core.tabular.schema import load_schema

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"


def test_sensitive_is_one_name_or_a_list_with_weights_shared_or_per_attribute():
    one = FairnessSettings(sensitive="sex", lambda_dp=1.0)
    assert one.attributes == ["sex"] and one.weight("dp", "sex") == 1.0 and one.enabled
    two = FairnessSettings(sensitive=["sex", "race"], lambda_dp={"sex": 1.0, "race": 0.5}, lambda_eo=0.3)
    assert two.attributes == ["sex", "race"] and two.weight("dp", "race") == 0.5 and two.weight("eo", "race") == 0.3
    assert not FairnessSettings(sensitive=["sex", "race"]).enabled
    for bad, match in (({"sensitive": []}, "non-empty"), ({"sensitive": ["sex", "sex"]}, "distinct"),
                       ({"sensitive": ["sex"], "lambda_dp": {"race": 1.0}}, "not in fairness.sensitive"),
                       ({"sensitive": "sex", "lambda_eo": -1.0}, ">= 0")):
        with pytest.raises(ValueError, match=match):
            FairnessSettings(**bad)
    gen = FairGenerationSettings(enabled=True, sensitive=["sex", "race"]).with_rates({"race": {"White": 0.3}})
    assert gen.attributes(["sex"]) == ["sex", "race"] and gen.targets_for("race", ["sex", "race"]) == {"White": 0.3}
    assert gen.targets_for("sex", ["sex", "race"]) is None
    assert FairGenerationSettings().with_rates({"sex": {"Male": 0.3}}).targets_for("sex", ["sex", "race"]) == {"Male": 0.3}
    assert FairGenerationSettings().attributes(["sex", "race"]) == ["sex"]  # default: the schema's first


# ---- the DP term over two attributes: where its optimum lies --------------------------------------
HI, LO = "Bachelors", "HS-grad"
# positives out of 10 per (sex, race, education): 0.2 + 0.4 [HI] + 0.2 [Male] + 0.1 [White]; a
# balanced design, so sex and race are independent (the case the docstring's formula is exact for)
POSITIVES = {(s, r, e): 2 + 4 * (e == HI) + 2 * (s == "Male") + (r == "White")
             for s in ("Female", "Male") for r in ("Black", "White") for e in (HI, LO)}


def _two_attribute_penalty(lambda_dp):
    from dpsynth_core.dpsgd import TrainExample
    from dpsynth_core.dpsgd.data import collate, tokenize_examples
    from dpsynth_core.models import load_tokenizer
    from dpsynth_core.tabular.constrained import RowConstraint
    from dpsynth_core.tabular.fairness import FairnessPenalty, FairnessTargets
    from dpsynth_core.tabular.serialize import RowSerializer

    rows, weights = [], []
    for (s, r, e), k in POSITIVES.items():
        for label, w in ((">50K", k), ("<=50K", 10 - k)):
            rows.append({"education": e, "race": r, "sex": s, "income": label})
            weights.append(float(w))
    df = pd.DataFrame(rows)
    schema = load_schema(ADULT_SCHEMA).select(["education", "race", "sex", "income"])
    schema = schema.model_copy(update={"columns": [c.model_copy(update={"categories": ["White", "Black"]})
                                                   if c.name == "race" else c for c in schema.columns]})
    ser = RowSerializer(schema, prefix="none")
    tok = load_tokenizer("tiny-llama")
    w = pd.Series(weights)
    targets = [FairnessTargets.from_counts({g: {y: float(w[(df[a] == g) & (df.income == y)].sum()) for y in ("<=50K", ">50K")}
                                            for g in sorted(set(df[a]))}, a) for a in ("sex", "race")]
    pen = FairnessPenalty(RowConstraint(ser, tok), schema, targets, lambda_dp=lambda_dp)
    batch = collate(tokenize_examples([TrainExample(p, t) for p, t in ser.examples(df)], tok, 48), tok.pad_token_id)
    return df, torch.tensor(weights), pen, batch, len(tok), targets


def _max_gradient(setup, p_pos: dict) -> float:
    from dpsynth_core.dpsgd.data import per_example_loss

    df, w, pen, batch, vocab, _ = setup
    logits = torch.zeros(*batch["input_ids"].shape, vocab)
    ctx = list(zip(df.sex, df.race, df.education))
    where = []
    for i, c in enumerate(ctx):
        y_pos = pen.locate(batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist())[0]
        logits[i, y_pos - 1] = -30.0  # no mass outside the labels' first tokens
        for k, tok_id in enumerate(pen.label_first.tolist()):
            logits[i, y_pos - 1, tok_id] = math.log(p_pos[c] if pen.labels[k] == ">50K" else 1 - p_pos[c])
        where.append((i, y_pos - 1))
    logits.requires_grad_(True)
    (w * (per_example_loss(logits, batch["labels"]) + pen(logits, batch))).sum().backward()
    grads: dict = {}
    for (i, t), c in zip(where, ctx):
        grads[c] = grads.get(c, 0) + logits.grad[i, t, pen.label_first]
    return max(float(g.abs().max()) for g in grads.values())


def _rate(p: dict, attribute: int, value: str) -> float:
    vals = [v for c, v in p.items() if c[attribute] == value]
    return sum(vals) / len(vals)


def test_dp_term_over_two_attributes_closes_each_gap_by_its_own_lambda_and_keeps_the_x_effect():
    lam = {"sex": 1.0, "race": 0.5}
    setup = _two_attribute_penalty(lam)
    _, _, _, _, _, targets = setup
    shift = {a: t for a, t in zip(("sex", "race"), targets)}
    q = {c: k / 10 for c, k in POSITIVES.items()}
    # the docstring's optimum: p* = q - sum_k lambda_k (r_k[a_k] - t)
    opt = {c: q[c] - lam["sex"] * shift["sex"].shift(c[0])[">50K"] - lam["race"] * shift["race"].shift(c[1])[">50K"] for c in q}
    # (the objective is strictly convex in each context's label logits, so q != opt is not stationary:
    # the terms act)
    assert _max_gradient(setup, opt) < 1e-4, "the formula's point is not the optimum"
    assert _rate(q, 0, "Male") - _rate(q, 0, "Female") == pytest.approx(0.2)
    assert _rate(q, 1, "White") - _rate(q, 1, "Black") == pytest.approx(0.1)
    assert _rate(opt, 0, "Male") - _rate(opt, 0, "Female") == pytest.approx(0.0, abs=1e-9)  # (1 - 1.0) * 0.2
    assert _rate(opt, 1, "White") - _rate(opt, 1, "Black") == pytest.approx(0.05)  # (1 - 0.5) * 0.1
    for s in ("Female", "Male"):
        for r in ("Black", "White"):
            assert opt[(s, r, HI)] - opt[(s, r, LO)] == pytest.approx(0.4)  # education keeps its effect


def test_the_two_attribute_penalty_is_the_sum_of_the_one_attribute_penalties():
    setup = _two_attribute_penalty({"sex": 1.0, "race": 0.5})
    df, _, pen, batch, vocab, targets = setup
    from dpsynth_core.tabular.fairness import FairnessPenalty

    logits = torch.randn(*batch["input_ids"].shape, vocab)
    one = [FairnessPenalty(pen.c, pen.schema, [t], lambda_dp=lam) for t, lam in zip(targets, (1.0, 0.5))]
    assert torch.allclose(pen(logits, batch), one[0](logits, batch) + one[1](logits, batch), atol=1e-6)
    assert pen(logits, batch).abs().sum() > 0


def test_one_dp_table_per_attribute_in_one_ledger_entry(tmp_path):
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.tabular.dp_domain import dp_group_label_tables

    schema = load_schema(ADULT_SCHEMA).select(["race", "sex", "income"])
    rng = random.Random(0)
    frame = pd.DataFrame([{"race": rng.choice(schema.column("race").categories), "sex": rng.choice(["Female", "Male"]),
                           "income": rng.choice(["<=50K", ">50K"])} for _ in range(300)])
    ledger = PrivacyLedger.create(tmp_path, "t", 1.0, 1e-5)
    counts = dp_group_label_tables(frame, schema, ["sex", "race"], epsilon=0.2, ledger=ledger)
    assert set(counts) == {"sex", "race"} and set(counts["race"]) == set(schema.column("race").categories)
    (entry,) = ledger.entries()
    assert entry.event().compositions == 2 and entry.epsilon <= 0.2 + 1e-6


# ---- generation: rejection and tilt over every attribute -----------------------------------------
def test_rejection_keeps_every_attributes_gap_under_the_threshold():
    from dpsynth_core.tabular.generation import GapTracker, _accept, dp_gap_of

    fs = FairGenerationSettings(enabled=True, sensitive=["sex", "race"], max_dp_gap=0.1, warmup_rows=10)
    trackers = {"sex": GapTracker(groups=["F", "M"]), "race": GapTracker(groups=["W", "B"])}
    rng = random.Random(0)
    kept = []
    for _ in range(3000):
        s, r = rng.choice("FM"), rng.choice("WB")
        y = int(rng.random() < 0.3 + 0.1 * (s == "M") + 0.4 * (r == "W"))  # race gap 0.4, sex gap 0.1
        if _accept(trackers, fs, {"sex": s, "race": r}, y, y):
            kept.append({"sex": s, "race": r, "income": ">50K" if y else "<=50K"})
    kept = pd.DataFrame(kept)
    assert len(kept) > 500
    assert dp_gap_of(kept, "race", "income", ">50K") <= 0.1 + 1e-9 and dp_gap_of(kept, "sex", "income", ">50K") <= 0.1 + 1e-9
    # the one-attribute sampler (sex only) leaves the race gap where it was
    only_sex = {"sex": GapTracker(groups=["F", "M"])}
    kept_sex = []
    for _ in range(3000):
        s, r = rng.choice("FM"), rng.choice("WB")
        y = int(rng.random() < 0.3 + 0.1 * (s == "M") + 0.4 * (r == "W"))
        if _accept(only_sex, fs, {"sex": s}, y, y):
            kept_sex.append({"race": r, "income": ">50K" if y else "<=50K"})
    assert dp_gap_of(pd.DataFrame(kept_sex), "race", "income", ">50K") > 0.3


def test_the_tilt_shifts_the_label_logit_by_the_sum_of_each_attributes_delta():
    from dpsynth_core.models import load_tokenizer
    from dpsynth_core.tabular.constrained import ConstrainedRowProcessor, RowConstraint
    from dpsynth_core.tabular.fair_decoding import LabelTilt, tilt_processor
    from dpsynth_core.tabular.serialize import RowSerializer

    schema = load_schema(ADULT_SCHEMA).select(["race", "sex", "income"])
    ser = RowSerializer(schema)
    c = RowConstraint(ser, load_tokenizer("tiny-llama"))
    tilts = [LabelTilt(c, schema, "sex"), LabelTilt(c, schema, "race")]
    tilts[0].delta["Male"], tilts[1].delta["White"] = -1.5, 0.5
    order = schema.names
    rows = ConstrainedRowProcessor(c, [order])
    prompt = torch.tensor([[1, 2, 3]])
    vocab = len(c.tokenizer)
    proc = tilt_processor(tilts, rows)
    # walk a row "race: White, sex: Male, income: " through the constrained processor
    ids = prompt
    emitted = list(c.forced(0, "race")) + list(c.cat_ids["race"]["White"]) + list(c.forced(1, "sex")) \
        + list(c.cat_ids["sex"]["Male"]) + list(c.forced(2, "income"))
    rows(ids, torch.zeros(1, vocab))
    for t in emitted:
        ids = torch.cat([ids, torch.tensor([[t]])], 1)
        rows(ids, torch.zeros(1, vocab))
    out = proc(ids, torch.zeros(1, vocab))
    assert float(out[0, tilts[0].pos_first]) == pytest.approx(-1.0)  # -1.5 (Male) + 0.5 (White)
    assert float(out.abs().sum()) == pytest.approx(1.0)  # only the positive label's first token moves
