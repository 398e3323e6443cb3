"""The DP fairness term closes the group gap and keeps the label's dependence on the other features.

The generator is stood in for by free logits per context (x, a) -- the most expressive model of
P(Y | x, a). In the label-position logits the objective (LM loss + penalty, exactly as the DP-SGD
engine computes it) is convex (cross entropy + a term linear in the logits, as sum_y c_y = 0), so a
point where its gradient vanishes is THE optimum. The tests put the label distribution at the
point the docstring's formula names, p* = q - lambda (r[a] - t), and check that the gradient
vanishes there: group rates equal (lambda = 1), each group keeping its education effect.

The old term (lambda * CE(t, p_i) on every row) is stationary at (q + n lambda t) / (1 + n lambda)
instead (n = the row's target tokens): there P(>50K | Bachelors) - P(>50K | HS-grad) is 0.02 (n = 17), not 0.4,
and its gradient at the new optimum is far from 0 (these tests fail with it).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from dpsynth_core.dpsgd import TrainExample
from dpsynth_core.dpsgd.data import collate, per_example_loss, tokenize_examples
from dpsynth_core.tabular.constrained import RowConstraint
from dpsynth_core.tabular.fairness import FairnessPenalty, FairnessTargets
from dpsynth_core.tabular.schema import load_schema
from dpsynth_core.tabular.serialize import RowSerializer

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"
HI, LO = "Bachelors", "HS-grad"


def _table(rates: dict[tuple[str, str], int], per_context: int = 5) -> tuple[pd.DataFrame, list[float]]:
    """rates[(sex, education)] = how many of the context's ``per_context`` rows earn >50K.

    Returns one row per (context, label) with its multiplicity as a weight (same objective as the
    repeated rows, a third of the compute)."""
    rows, weights = [], []
    for (sex, edu), k in rates.items():
        for label, w in ((">50K", k), ("<=50K", per_context - k)):
            rows.append({"education": edu, "sex": sex, "income": label})
            weights.append(float(w))
    return pd.DataFrame(rows), weights


def _counts(df: pd.DataFrame, weights: list[float]) -> dict[str, dict[str, float]]:
    w = pd.Series(weights, index=df.index)
    return {a: {y: float(w[(df.sex == a) & (df.income == y)].sum()) for y in ["<=50K", ">50K"]} for a in ["Female", "Male"]}


def _setup(table, lambda_dp: float, penalty_cls):
    from dpsynth_core.models import load_tokenizer

    df, weights = table
    schema = load_schema(ADULT_SCHEMA).select(["education", "sex", "income"])
    ser = RowSerializer(schema, prefix="none")
    tok = load_tokenizer("tiny-llama")
    targets = FairnessTargets.from_counts(_counts(df, weights), "sex")
    pen = penalty_cls(RowConstraint(ser, tok), schema, targets, lambda_dp, 0.0)
    batch = collate(tokenize_examples([TrainExample(p, t) for p, t in ser.examples(df)], tok, 32), tok.pad_token_id)
    return df, torch.tensor(weights), pen, batch, len(tok)


def _gradient_at(table, lambda_dp: float, p_pos: dict, penalty_cls=FairnessPenalty) -> float:
    """Largest |d objective / d label logit| with P(>50K | context) = p_pos[context] (all mass on the labels)."""
    df, w, pen, batch, vocab = _setup(table, lambda_dp, penalty_cls)
    logits = torch.zeros(*batch["input_ids"].shape, vocab)
    pos = pen.labels.index(">50K")
    where = []
    for i, c in enumerate(zip(df.sex, df.education)):
        y_pos = pen.locate(batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist())[0]
        logits[i, y_pos - 1] = -30.0  # no mass outside the labels' first tokens
        for k, tok_id in enumerate(pen.label_first.tolist()):
            logits[i, y_pos - 1, tok_id] = math.log(p_pos[c] if k == pos else 1 - p_pos[c])
        where.append((i, y_pos - 1))
    logits.requires_grad_(True)
    (w * (per_example_loss(logits, batch["labels"]) + pen(logits, batch))).sum().backward()
    # the same context's rows share one logit vector: its gradient is the sum over them
    grads: dict = {}
    for (i, t), c in zip(where, zip(df.sex, df.education)):
        grads[c] = grads.get(c, 0) + logits.grad[i, t, pen.label_first]
    return max(float(g.abs().max()) for g in grads.values())


def _formula(table, lambda_dp: float) -> dict:
    """p*(>50K | x, a) = q(>50K | x, a) - lambda (r[a] - t) from the module docstring."""
    df, weights = table
    counts = _counts(df, weights)
    t = FairnessTargets.from_counts(counts, "sex")
    out = {}
    for c in dict.fromkeys(zip(df.sex, df.education)):
        rows = [(y, wi) for s_, e, y, wi in zip(df.sex, df.education, df.income, weights) if (s_, e) == c]
        q = sum(wi for y, wi in rows if y == ">50K") / sum(wi for _, wi in rows)
        out[c] = q - lambda_dp * t.shift(c[0])[">50K"]
    return out


def _x_effect(p: dict, sex: str) -> float:
    return p[(sex, HI)] - p[(sex, LO)]


def _gap(p: dict) -> float:
    return (p[("Male", HI)] + p[("Male", LO)]) / 2 - (p[("Female", HI)] + p[("Female", LO)]) / 2


def test_label_keeps_its_dependence_on_x_when_it_does_not_depend_on_a():
    """Y depends on education only (0.8 vs 0.4 in both groups): the optimum at lambda_dp = 1 is the data's q."""
    table = _table({("Female", HI): 4, ("Female", LO): 2, ("Male", HI): 4, ("Male", LO): 2})
    opt = _formula(table, 1.0)
    assert all(_x_effect(opt, a) == pytest.approx(0.4) for a in ("Female", "Male")) and _gap(opt) == pytest.approx(0.0)
    assert _gradient_at(table, 1.0, opt) < 1e-4
    flat = {c: 0.5 for c in opt}  # where a term that erases P(Y | x) would sit: not an optimum
    assert _gradient_at(table, 1.0, flat) > 1e-2


def test_dp_term_closes_the_gap_and_keeps_the_x_effect():
    """Y depends on x (0.4) and on a (data gap 0.2): at lambda_dp = 1 the optimum has no group gap and
    each group keeps its 0.4 education effect; lambda_dp = 0.5 halves the gap."""
    table = _table({("Female", HI): 3, ("Female", LO): 1, ("Male", HI): 4, ("Male", LO): 2})
    data = _formula(table, 0.0)
    assert _gap(data) == pytest.approx(0.2)
    for lam, gap in ((1.0, 0.0), (0.5, 0.1)):
        opt = _formula(table, lam)
        assert _gap(opt) == pytest.approx(gap) and all(_x_effect(opt, a) == pytest.approx(0.4) for a in ("Female", "Male"))
        assert _gradient_at(table, lam, opt) < 1e-4, f"lambda_dp={lam}: the formula's point is not the optimum"
    assert _gradient_at(table, 1.0, data) > 1e-2  # the data's own q is no longer the optimum: the term acts
