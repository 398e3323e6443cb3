"""Fairness regularizers: per-example, correctly placed, and they move the generator's DP gap."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest
import torch

from dpsynth_core.dpsgd import DpSgdConfig, TrainExample
from dpsynth_core.dpsgd.data import collate, tokenize_examples
from dpsynth_core.tabular.constrained import RowConstraint
from dpsynth_core.tabular.fairness import FairnessPenalty, FairnessTargets, group_rates
from dpsynth_core.tabular.generation import GapTracker, _accept, FairGenerationSettings, dp_gap_of
from dpsynth_core.tabular.schema import load_schema
from dpsynth_core.tabular.serialize import RowSerializer

REPO = Path(__file__).resolve().parent.parent
ADULT_SCHEMA = REPO / "configs" / "schemas" / "adult.yaml"
COLUMNS = ["age", "sex", "hours_per_week", "income"]


@pytest.fixture(scope="module")
def setup():
    from dpsynth_core.models import load_tokenizer

    torch.set_num_threads(2)
    schema = load_schema(ADULT_SCHEMA).select(COLUMNS)
    ser = RowSerializer(schema)
    tok = load_tokenizer("tiny-llama")
    return schema, ser, tok, RowConstraint(ser, tok)


def _biased_table(n: int, seed: int = 0) -> pd.DataFrame:
    """Constructed data: income is >50K for every man and no woman (DP gap 1)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        sex = "Male" if i % 2 else "Female"
        rows.append({"age": rng.randint(20, 60), "sex": sex, "hours_per_week": rng.randint(20, 60),
                     "income": ">50K" if sex == "Male" else "<=50K"})
    return pd.DataFrame(rows)


def test_targets_from_counts():
    counts = {"Female": {"<=50K": 90.0, ">50K": 10.0}, "Male": {"<=50K": 60.0, ">50K": 40.0}}
    ft = FairnessTargets.from_counts(counts, "sex")
    assert ft.target_y == pytest.approx({"<=50K": 0.75, ">50K": 0.25})
    # the DP term's constants: each group's rates r[a] and its shift r[a] - t (summing to 0 over the labels)
    assert ft.group_rates["Female"][">50K"] == pytest.approx(0.1)
    assert ft.group_rates["Male"][">50K"] == pytest.approx(0.4)
    assert ft.shift("Female") == pytest.approx({"<=50K": 0.15, ">50K": -0.15})
    assert ft.shift("Male") == pytest.approx({"<=50K": -0.15, ">50K": 0.15})
    with pytest.raises(Exception, match="target_y"):
        FairnessTargets.from_counts(counts, "sex", target_y={"<=50K": 0.3, ">50K": 0.3})


def test_fair_targets_written_before_reweighing_was_removed_still_load():
    """A run directory's fair_targets.json from before lambda_reweigh went holds the reweighing weights too."""
    import json

    from dpsynth_core.tabular.fairness import dump_targets, load_targets

    counts = {"Female": {"<=50K": 90.0, ">50K": 10.0}, "Male": {"<=50K": 60.0, ">50K": 40.0}}
    ft = FairnessTargets.from_counts(counts, "sex")
    old = json.loads(dump_targets([ft]))
    old["attributes"][0]["weights"] = {"Female": {"<=50K": 0.83, ">50K": 2.5}, "Male": {"<=50K": 1.25, ">50K": 0.625}}
    assert load_targets(json.dumps(old)) == [ft]


def test_mixed_rates_run_from_parity_to_the_tables_own_group_rates():
    """rate_mix's targets: 0 is P(Y = pos) for every group, 1 each group's own P(Y = pos | A), and a mix
    in between keeps that share of the groups' difference (here 0.30 x 0.75 = 0.225 -> DP gap 0.225)."""
    counts = {"Female": {"<=50K": 90.0, ">50K": 10.0}, "Male": {"<=50K": 60.0, ">50K": 40.0}}
    ft = FairnessTargets.from_counts(counts, "sex")
    assert ft.mixed_rates(">50K", 0.0) == pytest.approx({"Female": 0.25, "Male": 0.25})
    assert ft.mixed_rates(">50K", 1.0) == pytest.approx({"Female": 0.10, "Male": 0.40})
    half = ft.mixed_rates(">50K", 0.75)
    assert half == pytest.approx({"Female": 0.1375, "Male": 0.3625})
    assert half["Male"] - half["Female"] == pytest.approx(0.75 * (0.40 - 0.10))


def test_penalty_reads_the_label_logits_and_shifts_each_group_towards_the_target(setup):
    schema, ser, tok, constraint = setup
    df = _biased_table(8)
    ft = FairnessTargets(sensitive="sex", labels=["<=50K", ">50K"], target_y={"<=50K": 0.5, ">50K": 0.5},
                         group_rates={"Female": {"<=50K": 0.7, ">50K": 0.3}, "Male": {"<=50K": 0.3, ">50K": 0.7}})
    pen = FairnessPenalty(constraint, schema, ft, lambda_dp=1.0, lambda_eo=0.0)
    rows = tokenize_examples([TrainExample(p, t) for p, t in ser.examples(df)], tok, 96)
    batch = collate(rows, tok.pad_token_id)
    for i, r in enumerate(rows):
        ids = batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
        y_pos, groups, label = pen.locate(ids)
        assert (groups, label) == ({"sex": df.sex[i]}, df.income[i])
        assert tok.decode(ids[y_pos:]).startswith(" " + label)  # the label's first token
    # logits: every row predicts >50K with p = 0.9 at the label position
    V = len(tok)
    logits = torch.zeros(len(rows), batch["input_ids"].shape[1], V, requires_grad=True)
    hi, lo = pen.label_first.tolist()[1], pen.label_first.tolist()[0]
    with torch.no_grad():
        logits[:, :, hi] += float(torch.log(torch.tensor(9.0)))
    out = pen(logits, batch)
    assert out.shape == (len(rows),)
    # (lambda / n_i) * sum_y (r[a, y] - t_y) log p_i(y), n_i = the row's target tokens (the LM loss is their mean)
    n_tok = (batch["labels"] != -100).sum(dim=1).float()
    male = torch.tensor([1.0 if s == "Male" else -1.0 for s in df.sex])
    expected = male * 0.2 * (torch.log(torch.tensor(0.9)) - torch.log(torch.tensor(0.1))) / n_tok
    assert torch.allclose(out, expected, atol=1e-5)
    # per-example: row i's penalty depends only on row i's logits
    (g,) = torch.autograd.grad(out[3], logits, retain_graph=True)
    assert g[torch.arange(len(rows)) != 3].abs().sum() == 0
    # the gradient step lowers p(>50K) of the over-represented group (row 3: Male) at exactly the label position
    y_pos = pen.locate(batch["input_ids"][3, : int(batch["attention_mask"][3].sum())].tolist())[0]
    assert g[3, y_pos - 1, hi] > 0 and g[3, y_pos - 1, lo] < 0
    (g2,) = torch.autograd.grad(out[2], logits)  # row 2 (Female): raised
    y2 = pen.locate(batch["input_ids"][2, : int(batch["attention_mask"][2].sum())].tolist())[0]
    assert g2[2, y2 - 1, hi] < 0 and g2[2, y2 - 1, lo] > 0
    assert g[3].abs().sum() == pytest.approx(float(g[3, y_pos - 1, hi].abs() + g[3, y_pos - 1, lo].abs()))


# Where the objective's optimum lies (gap closed, P(Y | x) kept): tests/test_tabular_fair_objective.py


def test_rejection_keeps_the_running_gap_under_the_threshold():
    fs = FairGenerationSettings(enabled=True, max_dp_gap=0.1, warmup_rows=10)
    tracker = GapTracker(groups=["F", "M"])
    rng = random.Random(0)
    accepted = []
    for _ in range(2000):
        a = rng.choice(["F", "M"])
        y = int(rng.random() < (0.8 if a == "M" else 0.2))  # a source with gap 0.6
        if _accept({"sex": tracker}, fs, {"sex": a}, y, y):
            accepted.append({"sex": a, "income": ">50K" if y else "<=50K"})
    kept = pd.DataFrame(accepted)
    assert len(kept) > 400
    assert tracker.dp_gap() <= 0.1 + 1e-9
    assert dp_gap_of(kept, "sex", "income", ">50K") == pytest.approx(tracker.dp_gap())
    # and with no fairness on, the same source keeps its gap
    src = pd.DataFrame([{"sex": a, "income": ">50K" if rng.random() < (0.8 if a == "M" else 0.2) else "<=50K"}
                        for a in [rng.choice(["F", "M"]) for _ in range(2000)]])
    assert dp_gap_of(src, "sex", "income", ">50K") > 0.5
