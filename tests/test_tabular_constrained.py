"""Constrained decoding: whatever the logits, every generated row parses and respects the schema."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsynth_core.tabular.constrained import ConstrainedRowProcessor, NumberAutomaton, RowConstraint
from dpsynth_core.tabular.schema import ColumnSpec, TableSchema, load_schema
from dpsynth_core.tabular.serialize import RowSerializer

REPO = Path(__file__).resolve().parent.parent
ADULT_SCHEMA = REPO / "configs" / "schemas" / "adult.yaml"


@pytest.fixture(scope="module")
def tokenizer():
    from dpsynth_core.models import load_tokenizer

    return load_tokenizer("tiny-llama")  # the real SmolLM2 BPE tokenizer


_CAT_CHARS = st.sampled_from(list("abcXYZ019-<>=?()&._ "))


@st.composite
def columns(draw, name: str) -> ColumnSpec:
    kind = draw(st.sampled_from(["categorical", "integer", "numeric"]))
    if kind == "categorical":
        cats = draw(st.lists(st.text(_CAT_CHARS, min_size=1, max_size=7).map(str.strip).filter(bool), min_size=1, max_size=5, unique=True))
        return ColumnSpec(name=name, type="categorical", categories=cats)
    precision = 0 if kind == "integer" else draw(st.integers(0, 3))
    scale = 10**precision
    lo = draw(st.integers(-30_000, 30_000)) / 10 ** draw(st.integers(0, 3))
    hi = lo + draw(st.integers(0, 120_000)) / 10 ** draw(st.integers(0, 3))
    if math.ceil(round(lo * scale, 6)) > math.floor(round(hi * scale, 6)):
        hi = lo + 1.0
    return ColumnSpec(name=name, type=kind, min=lo, max=hi, precision=precision)


@st.composite
def schemas(draw) -> TableSchema:
    n = draw(st.integers(1, 4))
    return TableSchema(name="t", columns=[draw(columns(f"{draw(st.sampled_from(['age', 'x', 'y_val', 'group']))}{i}")) for i in range(n)])


def _decode_with_logits(constraint: RowConstraint, ser: RowSerializer, tok, orders, logits_fn, max_new: int):
    """Greedy-decode under the processor with arbitrary logits; returns generated ids per row."""
    enc = tok([ser.prompt(o) for o in orders], return_tensors="pt", padding=True)
    ids = enc["input_ids"]
    proc = ConstrainedRowProcessor(constraint, orders)
    eos = tok.eos_token_id
    new = [[] for _ in orders]
    finished = [False] * len(orders)
    for step in range(max_new):
        scores = logits_fn(step, ids.shape[0], len(tok))
        masked = proc(ids, scores.clone())
        assert torch.isfinite(masked).any(dim=1).all(), "the processor left a row with no allowed token"
        nxt = masked.argmax(dim=1)
        for i, t in enumerate(nxt.tolist()):
            if finished[i]:
                nxt[i] = eos  # what HF generate does with finished rows (pad == eos)
            else:
                new[i].append(t)
                finished[i] = t == eos
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if all(finished):
            break
    return new, finished


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_logits_give_rows_that_parse_and_respect_the_schema(tokenizer, data):
    schema = data.draw(schemas())
    ser = RowSerializer(schema, random_order=data.draw(st.booleans()), seed=data.draw(st.integers(0, 999)))
    constraint = RowConstraint(ser, tokenizer)
    orders = [ser.order_for_row() for _ in range(data.draw(st.integers(1, 3)))]
    seed = data.draw(st.integers(0, 2**31 - 1))
    temperature = data.draw(st.sampled_from([0.1, 1.0, 30.0]))
    # adversarial biases: push EOS, digits/'-'/'.'/spaces, or one random token far above the rest
    bias = data.draw(st.sampled_from(["none", "eos", "numbers", "one_token"]))
    gen = torch.Generator().manual_seed(seed)
    favoured = torch.randint(0, len(tokenizer), (1,), generator=gen).item()
    number_ids = torch.tensor([i for i, _ in constraint.number_tokens] or [0])

    def logits_fn(step, b, v):
        x = torch.randn(b, v, generator=gen) * temperature
        if bias == "eos":
            x[:, tokenizer.eos_token_id] += 1e4
        elif bias == "numbers":
            x[:, number_ids] += 50.0 * torch.rand(b, len(number_ids), generator=gen)
        elif bias == "one_token":
            x[:, favoured] += 1e4
        return x

    max_new = max(constraint.max_row_tokens(o) for o in orders)
    new, finished = _decode_with_logits(constraint, ser, tokenizer, orders, logits_fn, max_new)
    assert all(finished), "a row did not end within max_row_tokens"
    for order, ids in zip(orders, new):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        row = ser.parse(text, order)  # raises unless valid, in the requested order
        for col in schema.columns:
            v = row[col.name]
            if col.is_categorical:
                assert v in col.categories
            else:
                assert col.min <= v <= col.max
                assert ser.schema.column(col.name).format_value(v) == text.split(f"{col.name}: ", 1)[1].split(", ")[0]


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_number_automaton_accepts_exactly_the_canonical_numbers(data):
    col = data.draw(columns("x").filter(lambda c: not c.is_categorical))
    auto = NumberAutomaton(col)
    x = data.draw(st.floats(float(col.min) - 50, float(col.max) + 50))
    text = " " + f"{round(x, col.decimals):.{col.decimals}f}"
    if text == " -0" or text.startswith(" -0.") and float(text) == 0:
        text = text.replace("-", "")
    inside = col.min <= float(text) <= col.max
    assert auto.complete(text) == inside
    if inside:  # every prefix of a valid number is feasible
        assert all(auto.feasible(text[:k]) for k in range(len(text) + 1))
    for junk in (" 01", " 1.", " --1", "1", " 1e3", " +1"):
        assert not auto.complete(junk)


@pytest.mark.parametrize("lo, hi", [(-1, -1), (-9, -2), (-120, -15)])
def test_unsigned_digits_are_not_feasible_for_a_negative_only_column(lo, hi):
    """Found by hypothesis: ' 1' was taken as a prefix of -1 and decoding then had no way to go on."""
    auto = NumberAutomaton(ColumnSpec(name="x", type="integer", min=lo, max=hi, precision=0))
    assert auto.feasible(" ") and auto.feasible(" -") and auto.feasible(f" {lo}")
    assert not any(auto.feasible(f" {d}") for d in range(10))


def test_real_generate_on_tiny_model_gives_100_percent_valid_rows(tokenizer):
    """A random-weight model (pure noise) through HF generate + the processor: every row parses."""
    from dpsynth_core.dpsgd import load_generator
    from dpsynth_core.tabular.generation import FairGenerationSettings, GenerationSettings, generate_rows

    schema = load_schema(ADULT_SCHEMA).select(["age", "workclass", "education", "sex", "hours_per_week", "income"])
    ser = RowSerializer(schema, random_order=True, seed=0)
    model, tok = load_generator("tiny-llama")
    res = generate_rows(model, tok, ser, GenerationSettings(num_rows=24, batch_size=12, temperature=1.5,
                                                            fairness=FairGenerationSettings(enabled=True, warmup_rows=4, max_dp_gap=0.3)),
                        progress=False)
    assert res.invalid == 0 and res.valid_fraction == 1.0
    assert res.attempted == len(res.frame) + res.rejected
    assert len(res.frame) == 24
    valid = schema.validate_frame(res.frame, "generated")  # re-validated against the schema
    assert valid.equals(res.frame[schema.names].astype(valid.dtypes.to_dict()))
    assert res.frame["age"].between(17, 90).all() and res.frame["sex"].isin(["Female", "Male"]).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fixed_values_are_written_whatever_the_logits(tokenizer, data):
    """A row with a fixed categorical value (stratified generation) parses, has that value, and the other
    columns stay free."""
    schema = load_schema(ADULT_SCHEMA).select(["age", "marital_status", "sex", "income"])
    ser = RowSerializer(schema, random_order=data.draw(st.booleans()), seed=data.draw(st.integers(0, 99)))
    constraint = RowConstraint(ser, tokenizer)
    orders = [ser.order_for_row() for _ in range(4)]
    fixed = [{"sex": data.draw(st.sampled_from(["Female", "Male"]))} for _ in orders]
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    enc = tokenizer([ser.prompt(o) for o in orders], return_tensors="pt", padding=True)
    ids, proc = enc["input_ids"], ConstrainedRowProcessor(constraint, orders, fixed=fixed)
    new, finished = [[] for _ in orders], [False] * len(orders)
    for _ in range(max(constraint.max_row_tokens(o) for o in orders) + 2):
        masked = proc(ids, torch.randn(ids.shape[0], len(tokenizer), generator=gen) * 5)
        nxt = masked.argmax(dim=1)
        for i, t in enumerate(nxt.tolist()):
            if finished[i]:
                nxt[i] = tokenizer.eos_token_id
            else:
                new[i].append(t)
                finished[i] = t == tokenizer.eos_token_id
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if all(finished):
            break
    assert all(finished)
    rows = [ser.parse(tokenizer.decode(n, skip_special_tokens=True)) for n in new]
    assert [r["sex"] for r in rows] == [f["sex"] for f in fixed]


def test_a_fixed_value_outside_the_categories_is_refused(tokenizer):
    schema = load_schema(ADULT_SCHEMA).select(["age", "sex", "income"])
    constraint = RowConstraint(RowSerializer(schema), tokenizer)
    with pytest.raises(ValueError, match="cannot fix column 'sex'"):
        ConstrainedRowProcessor(constraint, [schema.names], fixed=[{"sex": "Other"}])
    with pytest.raises(ValueError, match="1 column orders but 2"):
        ConstrainedRowProcessor(constraint, [schema.names], fixed=[None, None])


def test_stratified_generation_on_tiny_model_follows_the_quota(tokenizer):
    """HF generate + fixed values from a quota: every row valid, the column's shares are the quota's."""
    from dpsynth_core.dpsgd import load_generator
    from dpsynth_core.tabular.generation import GenerationSettings, StratumQuota, generate_rows

    schema = load_schema(ADULT_SCHEMA).select(["age", "marital_status", "sex", "income"])
    model, tok = load_generator("tiny-llama")
    quota = StratumQuota("sex", {"Female": 600.0, "Male": 300.0, "unused": -5.0})  # noisy DP counts: clamped
    res = generate_rows(model, tok, RowSerializer(schema), GenerationSettings(num_rows=12, batch_size=6), progress=False,
                        strata=quota)
    assert res.invalid == 0 and len(res.frame) == 12
    assert (res.frame["sex"] == "Female").sum() == 8 and (res.frame["sex"] == "Male").sum() == 4
    assert quota.counts == {("Female",): 8, ("Male",): 4, ("unused",): 0}


def test_a_two_column_quota_tracks_its_table_in_every_prefix():
    """Two columns: the cells of a 2-way table; each prefix of n rows holds each cell within one row of
    n x its share, and a zero (noise-clamped) cell is never drawn."""
    from dpsynth_core.tabular.generation import StratumQuota

    table = {("Female", "Married"): 3.0, ("Female", "Never"): 17.0, ("Male", "Married"): 45.0,
             ("Male", "Never"): 35.0, ("Male", "Widowed"): -2.0}
    quota = StratumQuota(["sex", "marital_status"], table)
    rows = [quota.next() for _ in range(200)]
    assert set(rows[0]) == {"sex", "marital_status"}
    for n in (1, 7, 50, 133, 200):
        seen = Counter((r["sex"], r["marital_status"]) for r in rows[:n])
        for cell, share in quota.shares.items():
            assert abs(seen.get(cell, 0) - n * share) < 1 + 1e-9
    assert quota.counts[("Male", "Widowed")] == 0 and quota.counts[("Female", "Married")] == 6
    with pytest.raises(ValueError, match="one value per column"):
        StratumQuota(["sex", "marital_status"], {("Female",): 1.0})
