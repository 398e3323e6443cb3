"""DPFairLLM tables: public schema validation, row serialization round trip, number precision."""

from __future__ import annotations

import math
import random
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.tabular.schema import ColumnSpec, TableSchema, load_schema
from dpsynth_core.tabular.serialize import RowParseError, RowSerializer

REPO = Path(__file__).resolve().parent.parent
ADULT_SCHEMA = REPO / "configs" / "schemas" / "adult.yaml"

# ---- random schemas ------------------------------------------------------------------------------
_CAT_CHARS = st.sampled_from(list("abcXYZ019-<>=?()&._ "))


@st.composite
def category_lists(draw) -> list[str]:
    cats = draw(st.lists(st.text(_CAT_CHARS, min_size=1, max_size=8).map(str.strip).filter(bool), min_size=1, max_size=6, unique=True))
    return cats


@st.composite
def numeric_columns(draw, name: str) -> ColumnSpec:
    kind = draw(st.sampled_from(["integer", "numeric"]))
    precision = 0 if kind == "integer" else draw(st.integers(0, 3))
    scale = 10**precision
    # bounds with up to 4 decimals: more than the column keeps, so rounding at the bounds is exercised
    a = draw(st.integers(-200_000, 200_000)) / 10**draw(st.integers(0, 4))
    width = draw(st.integers(1, 400_000)) / 10**draw(st.integers(0, 2))
    lo, hi = a, a + width
    if math.ceil(round(lo * scale, 6)) > math.floor(round(hi * scale, 6)):
        hi = lo + 1.0  # make sure one grid value exists
    return ColumnSpec(name=name, type=kind, min=lo, max=hi, precision=precision)


@st.composite
def schemas(draw, max_cols: int = 5) -> TableSchema:
    n = draw(st.integers(1, max_cols))
    cols = []
    for i in range(n):
        name = f"c{i}_" + draw(st.sampled_from(["age", "x", "hours_per_week", "label", "g"]))
        if draw(st.booleans()):
            cols.append(ColumnSpec(name=name, type="categorical", categories=draw(category_lists())))
        else:
            cols.append(draw(numeric_columns(name)))
    return TableSchema(name="t", columns=cols)


@st.composite
def raw_values(draw, col: ColumnSpec):
    """A raw value for ``col``: any category, or any float near/inside/outside the bounds."""
    if col.is_categorical:
        return draw(st.sampled_from(col.categories))
    lo, hi = float(col.min), float(col.max)
    return draw(st.one_of(st.floats(lo, hi), st.floats(lo - abs(lo) - 10, hi + abs(hi) + 10), st.sampled_from([lo, hi])))


def _expected(col: ColumnSpec, raw):
    if col.is_categorical:
        return raw
    scale = 10**col.decimals
    g_lo, g_hi = col.grid_bounds()
    return min(max(round(raw, col.decimals), g_lo / scale), g_hi / scale)


# ---- round trip ------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_any_schema_any_order(data):
    schema = data.draw(schemas())
    random_order = data.draw(st.booleans())
    ser = RowSerializer(schema, random_order=random_order, seed=data.draw(st.integers(0, 10**6)), prefix=data.draw(st.sampled_from(["full", "names", "none"])))
    row = {c.name: data.draw(raw_values(c)) for c in schema.columns}
    order = ser.order_for_row()
    assert sorted(order) == sorted(schema.names)
    text = ser.to_text(row, order)
    parsed = ser.parse(text, order if random_order else None)
    assert list(parsed) == order  # the text carries the column order
    for col in schema.columns:
        exp = _expected(col, row[col.name])
        got = parsed[col.name]
        if col.is_categorical:
            assert got == exp
        else:
            g_lo, g_hi = col.grid_bounds()
            assert g_lo <= round(got * 10**col.decimals, 6) <= g_hi  # on the grid inside [min, max]
            # fixed precision: the written number has exactly `decimals` decimals and is the rounded value
            field = text.split(f"{col.name}: ", 1)[1].split(", ")[0]
            if col.decimals:
                assert len(field.split(".")[1]) == col.decimals
            else:
                assert "." not in field
            assert abs(got - exp) <= 0.5 * 10**-col.decimals + 1e-9
            if col.type == "integer":
                assert isinstance(got, int)
    # parse is order-free unless an order is asked for; serializing the parsed row is a fixed point
    assert ser.to_text(parsed, order) == text
    if random_order and len(order) > 1 and order != sorted(order):
        with pytest.raises(RowParseError, match="order"):
            ser.parse(text, sorted(order))


def test_random_order_shuffles_and_prompt_shows_it():
    schema = load_schema(ADULT_SCHEMA).select(["age", "workclass", "sex", "hours_per_week", "income"])
    ser = RowSerializer(schema, random_order=True, seed=3)
    orders = {tuple(ser.order_for_row()) for _ in range(30)}
    assert len(orders) > 10
    order = list(next(iter(orders)))
    assert ser.prompt(order).endswith("Order: " + ", ".join(order) + ".\n")
    fixed = RowSerializer(schema)
    assert {tuple(fixed.order_for_row()) for _ in range(5)} == {tuple(schema.names)}


def test_number_precision_and_clipping():
    col = ColumnSpec(name="x", type="numeric", min=-1.25, max=3.14159, precision=2)
    assert col.format_value(1) == "1.00"
    assert col.format_value(2.005) in {"2.00", "2.01"}  # binary rounding of 2.005, either way 2 decimals
    assert col.format_value(-0.001) == "0.00"  # no negative zero
    assert col.format_value(100) == "3.14"  # clipped onto the grid inside [min, max]
    assert col.format_value(-7) == "-1.25"
    assert col.parse_value("3.14") == 3.14
    with pytest.raises(DataError, match="column 'x'.*outside"):
        col.parse_value("3.15")
    # an integer column with fractional bounds: clipped values stay inside [min, max]
    icol = ColumnSpec(name="n", type="integer", min=0.5, max=9.7)
    assert icol.format_value(0.5) == "1" and icol.format_value(9.7) == "9"
    assert icol.parse_value(icol.format_value(-3)) == 1
    with pytest.raises(DataError, match="outside"):
        icol.parse_value("9.6")  # would round to 10, above max
    # float noise in a bound: what format_value writes must parse back (found by hypothesis in CI)
    ncol = ColumnSpec(name="y", type="numeric", min=-2.77, max=-2.7600000000000002, precision=2)
    assert ncol.format_value(0.0) == "-2.76" and ncol.parse_value("-2.76") == -2.76
    with pytest.raises(DataError, match="outside"):
        ncol.parse_value("-2.75")
    # the frame validator applies the same grid
    schema = TableSchema(columns=[col, icol])
    out = schema.validate_frame(pd.DataFrame({"x": [5.0, -9.0, 0.123], "n": [0.5, 9.7, 4.4]}))
    assert out["x"].tolist() == [3.14, -1.25, 0.12] and out["n"].tolist() == [1, 9, 4]


def test_segments_tokenize_like_the_whole_row():
    """Constrained decoding emits segment by segment; training tokenizes whole rows: same ids.

    The one exception is a category ending in punctuation that BPE merges with the following
    separator (Adult's 'Outlying-US(Guam-USVI-etc)' + ',' -> '),'): there the decoder still emits
    the same text (the category is fixed by then) and the fairness penalty locates columns by the
    name tokens after the separator mark.
    """
    from dpsynth_core.models import load_tokenizer

    tok = load_tokenizer("tiny-llama")
    schema = load_schema(ADULT_SCHEMA)
    schema = schema.select([c.name for c in schema.columns if c.domain == "public"])
    ser = RowSerializer(schema, random_order=True, seed=1)
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    merging = {
        (c.name, cat) for c in schema.columns if c.is_categorical for cat in c.categories
        if enc(" " + cat + ", x:") != enc(" " + cat) + enc(", x:")
    }
    assert all(not cat[-1].isalnum() for _, cat in merging) and len(merging) <= 2, merging
    rng = random.Random(0)
    for _ in range(200):
        row = {}
        for c in schema.columns:
            if c.is_categorical:
                row[c.name] = rng.choice([x for x in c.categories if (c.name, x) not in merging])
            else:
                row[c.name] = rng.uniform(c.min, c.max)
        order = ser.order_for_row()
        text = ser.to_text(row, order)
        seg = []
        for i, name in enumerate(order):
            seg += enc(ser.name_segment(i, name))
            seg += enc(ser.value_segment(schema.column(name).format_value(row[name])))
        assert enc(text) == seg
    for name, cat in merging:  # same text either way
        row = {c.name: (c.categories[0] if c.is_categorical else c.min) for c in schema.columns} | {name: cat}
        text = ser.to_text(row, schema.names)
        seg = [t for i, n in enumerate(schema.names) for t in enc(ser.name_segment(i, n)) + enc(ser.value_segment(schema.column(n).format_value(row[n])))]
        assert tok.decode(seg) == text


def test_parse_errors_name_the_column_not_the_value():
    schema = load_schema(ADULT_SCHEMA).select(["age", "sex", "income"])
    ser = RowSerializer(schema)
    good = ser.to_text({"age": 39, "sex": "Male", "income": ">50K"})
    assert ser.parse(good) == {"age": 39, "sex": "Male", "income": ">50K"}
    cases = {
        "age: 39, sex: Robot, income: >50K": "column 'sex'",
        "age: 12, sex: Male, income: >50K": "column 'age'",
        "age: 39, sex: Male": "missing columns \\['income'\\]",
        "age: 39, sex: Male, sex: Male, income: >50K": "appears twice",
        "age: 39, height: 3, sex: Male, income: >50K": "unknown column",
        "": "empty",
    }
    for text, msg in cases.items():
        with pytest.raises(RowParseError, match=msg) as err:
            ser.parse(text)
        assert "Robot" not in str(err.value)
    frame, bad = ser.parse_many([good, "nonsense", good])
    assert bad == 1 and len(frame) == 2


# ---- bad schemas -----------------------------------------------------------------------------------
def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "schema.yaml"
    p.write_text(textwrap.dedent(body))
    return p


@pytest.mark.parametrize(
    "body, message",
    [
        (
            """
            columns:
              - {name: sex, type: categorical, categories: []}
            """,
            r"column 'sex': empty category list",
        ),
        (
            """
            columns:
              - {name: age, type: integer, min: 90, max: 17}
            """,
            r"column 'age': min > max \(90.0 > 17.0\)",
        ),
        (
            """
            columns:
              - {name: w, type: integer, domain: dp, candidate_min: 5, candidate_max: 1}
            """,
            r"column 'w': candidate_min > candidate_max",
        ),
        (
            """
            sensitive: [gender]
            columns:
              - {name: sex, type: categorical, categories: [F, M]}
            """,
            r"sensitive attribute 'gender' is an unknown column",
        ),
        (
            """
            target: income
            columns:
              - {name: sex, type: categorical, categories: [F, M]}
            """,
            r"target 'income' is an unknown column",
        ),
        (
            """
            columns:
              - {name: age, type: integer}
            """,
            r"column 'age': integer column needs 'min' and 'max'",
        ),
        (
            """
            columns:
              - {name: x, type: numeric, min: 0.11, max: 0.14, precision: 1}
            """,
            r"column 'x': no value with 1 decimals",
        ),
        (
            """
            columns:
              - {name: c, type: categorical, categories: ["a, b", c]}
            """,
            r"column 'c': category #0",
        ),
        (
            """
            columns:
              - {name: c, type: categorical, categories: [a], colour: red}
            """,
            r"colour",
        ),
    ],
)
def test_bad_schema_files_give_clear_errors(tmp_path, body, message):
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError, match=message) as err:
        load_schema(path)
    assert str(path) in str(err.value)  # the file is named


def test_unknown_column_selected_or_in_data():
    schema = load_schema(ADULT_SCHEMA)
    with pytest.raises(ConfigError, match=r"unknown column 'salary'"):
        schema.select(["age", "salary"])
    small = schema.select(["age", "sex"])
    with pytest.raises(DataError, match=r"adult.csv: missing columns \['sex'\]"):
        small.validate_frame(pd.DataFrame({"age": [30]}), "adult.csv")
    with pytest.raises(DataError, match=r"adult.csv: column 'sex', row 2: value not in the schema's categories") as err:
        small.validate_frame(pd.DataFrame({"age": [30, 40], "sex": ["Male", "Secret-value"]}), "adult.csv")
    assert "Secret-value" not in str(err.value)  # private values are never echoed
    with pytest.raises(DataError, match=r"column 'age', row 1: expected a number"):
        small.validate_frame(pd.DataFrame({"age": ["old"], "sex": ["Male"]}), "adult.csv")


def test_dp_domain_columns_cannot_be_used_unresolved():
    """Bounds of a `domain: dp` column are never read off the data for free: unresolved use fails."""
    schema = load_schema(ADULT_SCHEMA).select(["age", "capital_loss", "income"])
    assert not schema.column("capital_loss").resolved()
    with pytest.raises(ConfigError, match=r"\['capital_loss'\] have 'domain: dp'"):
        RowSerializer(schema)
    with pytest.raises(ConfigError, match="must be estimated"):
        schema.validate_frame(pd.DataFrame({"age": [30], "capital_loss": [0], "income": ["<=50K"]}))


def test_adult_schema_matches_the_public_documentation(adult_dir):
    """Every category list of the shipped schema is the one documented in adult.names."""
    names = (adult_dir / "adult.names").read_text()
    schema = load_schema(ADULT_SCHEMA)
    for col in schema.columns:
        if col.is_categorical and col.name != "income":
            for cat in col.categories:
                if cat != "?":
                    assert cat in names, (col.name, cat)
