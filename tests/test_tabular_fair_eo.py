"""The equalized-odds regularizer (tabular.fair_eo): zero exactly at equal conditional rates, bounded,
its per-example surrogate carries exactly its gradient, and that gradient moves the rates together.

The old "EO" term was a reweighing towards independence of Y and A (``lambda_reweigh``, since removed); these
tests need ``eo_objective`` / ``eo_surrogate`` / ``GeneratedRowsEO``, which the old code lacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpsynth_core.tabular.fair_eo import GeneratedRowsEO, eo_duals, eo_gap, eo_objective, eo_surrogate

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"


def _rows(rates: dict[tuple[str, int], list[float]]) -> tuple[torch.Tensor, list[str], list[int]]:
    """rows with P(Y_hat = 1) as given per (group, label) cell (binary: probs = [1 - p, p])."""
    probs, groups, labels = [], [], []
    for (a, y), ps in rates.items():
        for p in ps:
            probs.append([1 - p, p])
            groups.append(a)
            labels.append(y)
    return torch.tensor(probs), groups, labels


def test_zero_exactly_when_the_conditional_rates_are_equal_positive_otherwise_and_bounded():
    # equal group means per label (0.7 for y = 1, 0.2 for y = 0), different spreads and group sizes
    equal = _rows({("F", 1): [0.6, 0.8], ("M", 1): [0.7, 0.7, 0.5, 0.9], ("F", 0): [0.2], ("M", 0): [0.1, 0.3]})
    assert float(eo_objective(*equal)) == pytest.approx(0.0, abs=1e-12) and eo_gap(*equal) == pytest.approx(0.0, abs=1e-7)
    # the true-positive rate differs (0.7 vs 0.5), false-positive rates equal
    tpr_gap = _rows({("F", 1): [0.6, 0.8], ("M", 1): [0.5, 0.5], ("F", 0): [0.2], ("M", 0): [0.2]})
    assert float(eo_objective(*tpr_gap)) > 1e-3 and eo_gap(*tpr_gap) == pytest.approx(0.2)
    # a classifier that satisfies demographic parity but not equalized odds is still penalised
    dp_only = _rows({("F", 1): [0.9], ("F", 0): [0.1], ("M", 1): [0.1], ("M", 0): [0.9]})
    assert float(eo_objective(*dp_only)) > 0.1
    # bounded: binary R <= 1/2, reached when one group always predicts 1 and the other 0
    extreme = _rows({("F", 1): [1.0], ("M", 1): [0.0], ("F", 0): [1.0], ("M", 0): [0.0]})
    assert float(eo_objective(*extreme)) == pytest.approx(0.5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):  # random rows, three labels: R <= |Y|
        n = 30
        probs = torch.softmax(5 * torch.randn(n, 3, generator=gen), -1)
        groups = [["a", "b", "c"][int(i)] for i in torch.randint(0, 3, (n,), generator=gen)]
        labels = [int(i) for i in torch.randint(0, 3, (n,), generator=gen)]
        assert 0.0 <= float(eo_objective(probs, groups, labels)) <= 3.0


def test_the_per_example_surrogate_has_exactly_the_gradient_of_the_objective():
    """mean_i (mu[a_i, y_i] / P(y_i)) . p_i with mu constant: the gradient of R, so per-example
    clipping sees a per-row term whose sum is the regularizer's gradient."""
    gen = torch.Generator().manual_seed(1)
    n = 40
    logits = torch.randn(n, 3, generator=gen, requires_grad=True)
    groups = [["F", "M"][i % 2] for i in range(n)]
    labels = [(i // 2) % 3 for i in range(n)]
    probs = torch.softmax(logits, -1)
    (g_r,) = torch.autograd.grad(eo_objective(probs, groups, labels), logits)
    mu = eo_duals(probs, groups, labels)
    prior = torch.tensor([labels.count(y) / n for y in range(3)])
    per_row_mu = torch.stack([mu[(a, y)] for a, y in zip(groups, labels)])
    s = eo_surrogate(torch.softmax(logits, -1), per_row_mu, prior[labels])
    assert s.shape == (n,)
    (g_s,) = torch.autograd.grad(s.mean(), logits)
    assert torch.allclose(g_r, g_s, atol=1e-7) and g_r.abs().max() > 1e-3


def _toy(n: int = 2000):
    """Y depends on x and on the group a: the fitted classifier's TPR / FPR differ by group."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, generator=gen)
    a = (torch.rand(n, generator=gen) < 0.5).long()
    y = (torch.rand(n, generator=gen) < torch.sigmoid(2 * x + 2.0 * a - 1.0)).long()
    return x, a, y


def _fit(lam: float, steps: int = 150):
    """Logistic model p(1 | x, a) = sigmoid(w x + b_a); loss = CE + lam * mean surrogate, mu renewed
    every step from the model's current predictions (the stand-in for rows it generates)."""
    x, a, y = _toy()
    w = torch.tensor(0.0, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    groups, labels = [str(int(v)) for v in a], [int(v) for v in y]
    prior = torch.tensor([labels.count(0) / len(labels), labels.count(1) / len(labels)])
    for _ in range(steps):
        p1 = torch.sigmoid(w * x + b[a])
        probs = torch.stack([1 - p1, p1], -1)
        mu = eo_duals(probs, groups, labels)
        per_row_mu = torch.stack([mu[(g, yy)] for g, yy in zip(groups, labels)])
        loss = torch.nn.functional.binary_cross_entropy(p1, y.float()) + lam * eo_surrogate(probs, per_row_mu, prior[y]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    p1 = torch.sigmoid(w * x + b[a]).detach()
    probs = torch.stack([1 - p1, p1], -1)
    return eo_gap(probs, groups, labels), float(eo_objective(probs, groups, labels)), float(w.detach())


def test_its_gradient_moves_the_conditional_rates_together_and_keeps_the_feature_effect():
    gap0, r0, w0 = _fit(0.0)
    gap1, r1, w1 = _fit(4.0)
    assert gap0 > 0.15  # the unregularised classifier: unequal odds
    assert gap1 < 0.5 * gap0 and r1 < 0.25 * r0
    assert w1 > 0.5 * w0 > 0.5  # Y keeps its dependence on x (the term does not flatten the label)


@pytest.fixture(scope="module")
def tiny():
    from dpsynth_core.models import load_causal_lm
    from dpsynth_core.tabular.constrained import RowConstraint
    from dpsynth_core.tabular.schema import load_schema
    from dpsynth_core.tabular.serialize import RowSerializer

    torch.set_num_threads(2)
    schema = load_schema(ADULT_SCHEMA).select(["sex", "race", "income"])  # short rows: few decoding steps
    ser = RowSerializer(schema, prefix="none")
    model, tok = load_causal_lm("tiny-llama")
    return schema, ser, model, tok, RowConstraint(ser, tok)


def test_refresh_reads_only_generated_rows_and_the_penalty_applies_mu_per_row(tiny):
    import pandas as pd

    from dpsynth_core.dpsgd import TrainExample
    from dpsynth_core.dpsgd.data import collate, tokenize_examples
    from dpsynth_core.tabular.fairness import FairnessPenalty, FairnessTargets

    schema, ser, model, tok, constraint = tiny
    eo = GeneratedRowsEO(constraint, ["sex", "race"], {"<=50K": 0.75, ">50K": 0.25}, rows=6, refresh_every=3, seed=0)
    seen = []
    sample = eo.sample
    eo.sample = lambda *args: seen.append(sample(*args)) or seen[-1]
    model.train()
    rng_before = torch.get_rng_state()
    for step in range(4):
        eo.refresh(model, tok, step)
    assert eo.refreshed_at == [0, 3] and len(seen) == 2  # every refresh_every steps
    assert [h["step"] for h in eo.history] == [0, 3] and all(0.0 <= h["eo_gap_sex"] <= 1.0 for h in eo.history if h["rows"])
    assert model.training and torch.equal(torch.get_rng_state(), rng_before)  # mode and global RNG left as found
    probs, groups, labels = seen[0]
    assert probs.shape[1] == 2 and len(labels) == len(groups["sex"]) == len(groups["race"]) > 0
    assert torch.allclose(probs.sum(-1), torch.ones(len(labels)))
    assert set(eo.mu["sex"]) <= {(g, y) for g in ("Female", "Male") for y in (0, 1)}

    # mu from constructed rows: women's TPR 0.8, men's 0.4 -> mu = +-0.2 on P(>50K) for Y = >50K
    eo.set_from_rows(*_rows_two({("Female", "White", 1): [0.8, 0.8], ("Male", "White", 1): [0.4, 0.4],
                                 ("Female", "White", 0): [0.3, 0.3], ("Male", "White", 0): [0.3, 0.3]}))
    targets = [FairnessTargets.from_counts({g: {"<=50K": 3.0, ">50K": 1.0} for g in schema.column(a).categories}, a)
               for a in ("sex", "race")]
    pen = FairnessPenalty(constraint, schema, targets, lambda_eo={"sex": 2.0}, eo=eo)
    df = pd.DataFrame([{"sex": s, "race": "White", "income": y} for s in ("Female", "Male") for y in (">50K", "<=50K")])
    batch = collate(tokenize_examples([TrainExample(p, t) for p, t in ser.examples(df)], tok, 64), tok.pad_token_id)
    logits = torch.randn(len(df), batch["input_ids"].shape[1], len(tok), requires_grad=True)
    out = pen(logits, batch)
    n_tok = (batch["labels"] != -100).sum(1)
    for i, (s, y) in enumerate(zip(df.sex, df.income)):
        y_pos, _, _ = pen.locate(batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist())
        p = pen.label_log_probs(logits, i, y_pos).exp().detach()
        mu = {("Female", ">50K"): 0.2, ("Male", ">50K"): -0.2}.get((s, y), 0.0)
        expected = 2.0 * float(mu * p[1] - mu * p[0]) / 0.25 / float(n_tok[i]) if y == ">50K" else 0.0
        assert float(out[i].detach()) == pytest.approx(expected, abs=1e-6)
    # per example: row 0 (a woman earning >50K, her group's TPR too high) depends on row 0 alone, and
    # its gradient lowers her P(>50K) at the label position
    (g,) = torch.autograd.grad(out[0], logits)
    assert g[1:].abs().sum() == 0
    y_pos = pen.locate(batch["input_ids"][0, : int(batch["attention_mask"][0].sum())].tolist())[0]
    assert g[0, y_pos - 1, pen.label_first[1]] > 0 > g[0, y_pos - 1, pen.label_first[0]]
    with pytest.raises(Exception, match="generated-rows"):
        FairnessPenalty(constraint, schema, targets, lambda_eo=1.0)  # no constants, no silent zero term


def _rows_two(rates: dict[tuple[str, str, int], list[float]]):
    probs, groups, labels = [], {"sex": [], "race": []}, []
    for (s, r, y), ps in rates.items():
        for p in ps:
            probs.append([1 - p, p])
            groups["sex"].append(s)
            groups["race"].append(r)
            labels.append(y)
    return torch.tensor(probs), groups, labels


def test_the_dp_sgd_engine_refreshes_the_penalty_before_each_step():
    from dpsynth_core.dpsgd import DpSgdConfig, TrainExample
    from dpsynth_core.dpsgd.engine import DpSgdEngine

    class Recording:
        def __init__(self):
            self.steps, self.modes = [], []

        def refresh(self, model, tokenizer, step):
            self.steps.append(step)
            self.modes.append(hasattr(model, "generate") and tokenizer is not None)

        def __call__(self, logits, batch):
            return logits.new_zeros(logits.shape[0])

    pen = Recording()
    examples = [TrainExample(prompt="row:", target=f" value {i}") for i in range(16)]
    cfg = DpSgdConfig(model="tiny-llama", epsilon=8.0, steps=2, expected_batch_size=4, physical_batch_size=4,
                      max_seq_len=16, clipping="hooks", torch_threads=2)
    engine = DpSgdEngine(examples, cfg, noise_multiplier=1.0, sampling_seed=0, per_example_penalty=pen)
    engine.train_step()
    engine.train_step()
    assert pen.steps == [0, 1] and all(pen.modes)
