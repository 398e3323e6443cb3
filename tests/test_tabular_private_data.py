"""The private table of a tabular run: a secret Bernoulli working subset kept in owner-only state,
delta < 1/m, pre-flight of the whole file before any budget is spent, and values outside a
DP-estimated category list handled ("other" / "drop") instead of aborting after the spend.
No model is trained here: each test is a second or two."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.privacy import PrivacyLedger
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import DpFairConfig
from dpsynth_core.tabular.schema import load_schema

REPO = Path(__file__).resolve().parent.parent
ADULT_SCHEMA = REPO / "configs" / "schemas" / "adult.yaml"
COLUMNS = ["age", "education", "sex", "hours_per_week", "income"]


@pytest.fixture(scope="module")
def adult_csv(tmp_path_factory, adult_dir) -> Path:
    from dpsynth_core.data import load_adult

    path = tmp_path_factory.mktemp("adult") / "adult_400.csv"
    load_adult("train").head(400)[COLUMNS].to_csv(path, index=False)
    return path


def _cfg(tmp_path: Path, source: Path, **over) -> DpFairConfig:
    raw = {"name": "t", "output_dir": str(tmp_path / "runs"), "schema_path": str(ADULT_SCHEMA), "columns": COLUMNS,
           "data": {"source": str(source), "test_path": str(source), "train_rows": 100, "sample_fraction": 0.25,
                    "seed": 0},
           "recipe": "none", "epsilon": 2.0, "training": {"model": "tiny-llama"}, "use_ray": False}
    raw.update(over)
    return DpFairConfig.model_validate(raw)


def test_working_subset_is_secret_bernoulli_and_kept_for_resume(tmp_path, adult_csv):
    """Issue 12, Critical 1 / Major 5: the old `train.sample(train_rows, random_state=data.seed)` gave the
    same 100 rows on every run (public seed, fixed size). Now: Bernoulli inclusion from OS entropy."""
    cfg = _cfg(tmp_path, adult_csv)
    draws = [private_data.private_rows(cfg, tmp_path / f"run{i}", first_stage=True) for i in range(4)]
    index_sets = [frozenset(d.index) for d in draws]
    assert len(set(index_sets)) == 4  # two runs of the same config select different rows
    assert len({len(s) for s in index_sets}) > 1  # the size varies: Bernoulli(m / n), not a fixed-size sample
    assert all(40 < len(s) < 160 for s in index_sets)  # about m = 100 of 400
    # a resumed run (or another process of the same run) sees exactly the rows its first stage drew
    again = private_data.private_rows(cfg, tmp_path / "run0")
    assert frozenset(again.index) == index_sets[0]
    assert frozenset(private_data.private_rows(cfg, tmp_path / "run0", first_stage=True).index) == index_sets[0]
    # lost state: refuse rather than silently draw another subset after DP stages spent budget on the first
    private_data.subset_state(tmp_path / "run1").unlink()
    with pytest.raises(ConfigError, match="missing.*--fresh"):
        private_data.private_rows(cfg, tmp_path / "run1")
    # the file changed since the run started: refuse
    changed = tmp_path / "changed.csv"
    pd.read_csv(adult_csv).iloc[1:].to_csv(changed, index=False)
    with pytest.raises(DataError, match="changed since this run started"):
        private_data.private_rows(_cfg(tmp_path, changed), tmp_path / "run2")


def test_delta_must_be_below_one_over_m(tmp_path, adult_csv):
    """delta < 1/m for the expected working-set size m (so delta * m / n < 1/n on the file)."""
    schema = load_schema(ADULT_SCHEMA).select(COLUMNS)
    _, delta = private_data.preflight(_cfg(tmp_path, adult_csv), schema)
    assert delta == min(1e-5, 100 ** -1.1)  # the default for m = train_rows = 100
    with pytest.raises(ConfigError, match="field 'privacy.delta'") as err:
        private_data.preflight(_cfg(tmp_path, adult_csv, delta=0.02), schema)
    assert "400" not in str(err.value) and "100" not in str(err.value)  # no size in the message


def test_preflight_checks_the_whole_file_before_anything_is_written(tmp_path, adult_csv):
    """A bad value anywhere in the file (not only in the drawn subset) stops the run before the run
    directory exists; the error names the file, the column and the 1-based file row, not the value
    and not how many rows are affected."""
    from dpsynth_core.tabular.pipeline import run_dpfair

    frame = pd.read_csv(adult_csv)
    frame.loc[[336, 337], "sex"] = "SECRET-VALUE"
    bad = tmp_path / "bad.csv"
    frame.to_csv(bad, index=False)
    with pytest.raises(DataError) as err:
        run_dpfair(_cfg(tmp_path, bad))
    msg = str(err.value)
    assert f"{bad}: column 'sex', row 337:" in msg
    assert "SECRET" not in msg and "affected" not in msg and "2 rows" not in msg
    assert not (tmp_path / "runs").exists()


def test_validate_frame_messages_name_one_based_row_without_counts():
    schema = load_schema(ADULT_SCHEMA).select(["age", "sex"])
    frame = pd.DataFrame({"age": [30, 40, 50], "sex": ["Male", "Secret-value", "Other-secret"]})
    with pytest.raises(DataError) as err:
        schema.validate_frame(frame, "f.csv")
    assert str(err.value) == "f.csv: column 'sex', row 2: value not in the schema's categories"
    # a subset of a file keeps its file rows: row 3 of the file is position 0 of this frame
    with pytest.raises(DataError, match="row 3:"):
        schema.validate_frame(frame.iloc[[2]], "f.csv")


def _dp_category_schema(tmp_path: Path, unknown: str) -> Path:
    path = tmp_path / f"schema_{unknown}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: toy
        target: income
        sensitive: [sex]
        unknown: {unknown}
        columns:
          - {{name: age, type: integer, min: 17, max: 90}}
          - {{name: education, type: categorical, domain: dp, candidate_categories: [Bachelors, HS-grad, Masters]}}
          - {{name: sex, type: categorical, categories: [Female, Male]}}
          - {{name: income, type: categorical, categories: ["<=50K", ">50K"]}}
    """))
    return path


@pytest.mark.parametrize("unknown", ["other", "drop"])
def test_value_outside_the_dp_category_list_is_handled_after_the_spend(tmp_path, adult_csv, unknown):
    """Issue 12 minor: education has 16 values in Adult, the DP candidates only 3. The old pipeline
    raised DataError in `validate_frame` right after `estimate_domain` had spent its budget; now the
    values map to "Other" (default) or their rows are dropped, and the run goes on."""
    from dpsynth_core.tabular.run_schema import resolved_schema
    from dpsynth_core.tabular.stages_dp import stage_prepare

    cfg = _cfg(tmp_path, adult_csv, schema_path=str(_dp_category_schema(tmp_path, unknown)),
               columns=["age", "education", "sex", "income"], data={"source": str(adult_csv), "seed": 0})
    run = tmp_path / "run"
    PrivacyLedger.create(run, "t", 2.0, 1e-4)
    stage_prepare(cfg, str(run))
    assert [e.stage for e in PrivacyLedger.open(run).entries()] == ["dp_domain"]
    schema = resolved_schema(run)
    cats = schema.column("education").categories
    private = private_data.load_private(cfg, run, schema)
    raw = pd.read_csv(adult_csv)
    if unknown == "other":
        assert cats[-1] == "Other" and "Other" not in schema.column("sex").categories  # public lists untouched
        assert len(private) == len(raw) and set(private.education) <= set(cats)
        assert (private.education == "Other").sum() == (~raw.education.isin(cats[:-1])).sum()
    else:
        assert "Other" not in cats
        assert len(private) == raw.education.isin(cats).sum() and set(private.education) <= set(cats)


def test_one_file_is_split_by_content_keys(tmp_path, adult_csv):
    """data.holdout_rows: a public count of rows held out as the test set, chosen by a keyed hash of each
    row's content; the private pool is the rest. Neighbouring files (one row removed) keep neighbouring
    pools: the held-out sets differ in at most one row besides the removed one."""
    raw = {"source": str(adult_csv), "holdout_rows": 50, "train_rows": 100, "sample_fraction": 0.25, "seed": 0}
    cfg = _cfg(tmp_path, adult_csv, data=raw)
    pool, test = private_data.read_source(cfg), private_data.load_test(cfg)
    assert len(test) == 50 and len(pool) == 350
    whole = private_data._read_file(cfg)
    held = set(whole.index[private_data._holdout_index(whole, cfg)])
    assert len(held) == 50 and not held & set(pool.index)  # disjoint: no test row is in the private pool
    assert pool.index.max() >= 349 and pool.index.is_monotonic_increasing  # original file rows: errors name them
    assert test.equals(private_data.load_test(cfg))  # reproducible: the same split on every call
    assert not test.equals(private_data.load_test(_cfg(tmp_path, adult_csv, data={**raw, "seed": 1})))
    # neighbouring file: drop one pool row
    full = pd.read_csv(adult_csv)
    victim = int(pool.index[10])
    neighbour = tmp_path / "neighbour.csv"
    full.drop(index=victim).to_csv(neighbour, index=False)
    test_n = private_data.load_test(_cfg(tmp_path, neighbour, data={**raw, "source": str(neighbour)}))
    rows = lambda f: {tuple(r) for r in f.astype(str).to_numpy()}  # noqa: E731
    assert len(rows(test) ^ rows(test_n)) <= 2
    with pytest.raises(Exception, match="not both"):
        _cfg(tmp_path, adult_csv, data={**raw, "test_path": str(adult_csv)})
