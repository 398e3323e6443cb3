"""Loaders: good files load identically in every format; each bad input gives a DataError that
names the file, the column and the 1-based data row, and never contains the private value."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.data import (
    ADULT_COLUMNS,
    BIORXIV_ATTRIBUTES,
    TextDataset,
    data_dir,
    load_adult,
    load_biorxiv,
    load_records,
    load_text_dataset,
)
from dpsynth_core.data import public as public_mod
from dpsynth_core.errors import DataError, DpsynthError

REPO_ROOT = Path(__file__).resolve().parent.parent
DPSYNTH = REPO_ROOT / ".venv" / "bin" / "dpsynth"
SECRET = "ZQXJ-private-marker-7731"  # planted in bad records; must never appear in an error

ROWS = [
    {"text": "first note about a patient", "label": "a", "user": "u1", "age": 31, "city": "Oslo"},
    {"text": "second, with a comma", "label": "b", "user": "u2", "age": 45, "city": "Rome"},
    {"text": "third line\nspans two lines", "label": "a", "user": "u1", "age": 27, "city": "Oslo"},
    {"text": "fourth \u00e9t\u00e9 unicode \u2713", "label": "c", "user": "u3", "age": 60, "city": "Lima"},
]


def write(path: Path, rows: list[dict]) -> Path:
    """Write rows in the format given by the path's extension."""
    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        frame.to_parquet(path, index=False)
    return path


def raises_at(func, *, path: Path, column: str | None, row: int | None, words: str) -> DataError:
    """Call func, expect a DataError locating the problem; return it."""
    with pytest.raises(DataError) as info:
        func()
    exc = info.value
    msg = str(exc)
    assert str(path) in msg
    assert words.lower() in msg.lower(), msg
    if column is not None:
        assert f"column {column!r}" in msg and exc.column == column, msg
    if row is not None:
        assert f"row {row}" in msg and exc.row == row, msg
    assert SECRET not in msg
    return exc


# ---------------------------------------------------------------- good input, three formats


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_formats_load_the_same_data(tmp_path, suffix):
    path = write(tmp_path / f"good{suffix}", ROWS)
    frame = load_records(
        path, text_col="text", label_col="label", user_col="user",
        columns={"age": "numeric", "city": "categorical"},
    )
    expected = pd.DataFrame(ROWS)[["text", "label", "user", "age", "city"]]
    assert list(frame.columns) == list(expected.columns)
    assert frame["text"].tolist() == expected["text"].tolist()
    assert frame["label"].tolist() == expected["label"].tolist()
    assert frame["city"].tolist() == expected["city"].tolist()
    assert pd.api.types.is_integer_dtype(frame["age"])
    assert frame["age"].tolist() == [31, 45, 27, 60]

    ds = load_text_dataset(path, text_col="text", label_col="label", user_col="user")
    assert isinstance(ds, TextDataset) and len(ds) == 4
    assert ds.texts == [r["text"] for r in ROWS]
    assert ds.labels == ["a", "b", "a", "c"] and ds.user_ids == ["u1", "u2", "u1", "u3"]
    assert ds.source == str(path)
    assert ROWS[0]["text"] not in repr(ds)  # a repr may reach a log


def test_unmapped_load_keeps_all_columns_and_infers_numbers(tmp_path):
    path = write(tmp_path / "good.csv", ROWS)
    frame = load_records(path)
    assert list(frame.columns) == ["text", "label", "user", "age", "city"]
    assert pd.api.types.is_numeric_dtype(frame["age"])
    ds = load_text_dataset(path, text_col="text")
    assert ds.labels is None and ds.user_ids is None


def test_numeric_user_ids_and_labels_become_strings(tmp_path):
    rows = [{"text": "x", "label": 1, "user": 10}, {"text": "y", "label": 0, "user": 11}]
    for suffix in (".csv", ".jsonl", ".parquet"):
        ds = load_text_dataset(write(tmp_path / f"n{suffix}", rows), "text", "label", "user")
        assert ds.labels == ["1", "0"] and ds.user_ids == ["10", "11"], suffix


# ---------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    raises_at(lambda: load_records(path, text_col="text"), path=path, column=None, row=None, words="not found")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "data.xlsx"
    path.write_bytes(b"whatever")
    exc = raises_at(lambda: load_records(path), path=path, column=None, row=None, words="unsupported")
    assert ".csv" in str(exc) and ".jsonl" in str(exc) and ".parquet" in str(exc)


def test_missing_column_lists_available(tmp_path):
    path = write(tmp_path / "d.csv", ROWS)
    exc = raises_at(
        lambda: load_records(path, text_col="body"), path=path, column="body", row=None, words="not found"
    )
    assert "text, label, user, age, city" in str(exc)
    raises_at(lambda: load_records(path, columns=["age", "zip"]), path=path, column="zip", row=None, words="not found")


@pytest.mark.parametrize("content", [b"", b"\n\n", b"text,label\n"], ids=["zero-bytes", "blank", "header-only"])
def test_empty_csv(tmp_path, content):
    path = tmp_path / "empty.csv"
    path.write_bytes(content)
    raises_at(lambda: load_records(path, text_col="text"), path=path, column=None, row=None, words="0 rows")


def test_empty_jsonl_and_parquet(tmp_path):
    jl = tmp_path / "empty.jsonl"
    jl.write_text("\n")
    raises_at(lambda: load_records(jl), path=jl, column=None, row=None, words="0 rows")
    pq = tmp_path / "empty.parquet"
    pd.DataFrame({"text": pd.Series([], dtype=str)}).to_parquet(pq)
    raises_at(lambda: load_records(pq, text_col="text"), path=pq, column=None, row=None, words="0 rows")


def test_non_utf8_csv_names_column_and_row(tmp_path):
    path = tmp_path / "latin1.csv"
    body = 'id,text\n1,"fine"\n2,"multi\nline"\n3,"caf\xe9 ' + SECRET + '"\n'
    path.write_bytes(body.encode("latin-1"))
    exc = raises_at(lambda: load_records(path, text_col="text"), path=path, column="text", row=3, words="UTF-8")
    assert "byte offset" in str(exc)


def test_non_utf8_jsonl_names_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9 ' + SECRET.encode() + b'"}\n')
    raises_at(lambda: load_records(path, text_col="text"), path=path, column=None, row=2, words="UTF-8")


def test_malformed_jsonl_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "ok2"}\n{"text": "' + SECRET + '"\n', encoding="utf-8")
    exc = raises_at(lambda: load_records(path, text_col="text"), path=path, column=None, row=3, words="malformed JSON")
    assert exc.line == 4  # the blank line counts as a file line but not as a row
    path.write_text('{"text": "ok"}\n["not", "an", "object"]\n')
    raises_at(lambda: load_records(path), path=path, column=None, row=2, words="JSON object")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_nan_text(tmp_path, suffix):
    rows = [{"text": "ok", "label": "a"}, {"text": "fine", "label": "b"}, {"text": None, "label": "a"}]
    path = write(tmp_path / f"nan{suffix}", rows)
    raises_at(lambda: load_records(path, text_col="text"), path=path, column="text", row=3, words="missing text")


def test_nan_text_counts_data_rows_not_lines(tmp_path):
    path = tmp_path / "multi.csv"
    path.write_text('text\n"a\nb\nc"\n"d"\n""\n', encoding="utf-8")
    raises_at(lambda: load_records(path, text_col="text"), path=path, column="text", row=3, words="missing text")


@pytest.mark.parametrize("blank", ["   ", "\t\n "])
def test_empty_text(tmp_path, blank):
    path = write(tmp_path / "blank.jsonl", [{"text": "ok"}, {"text": blank}])
    raises_at(lambda: load_records(path, text_col="text"), path=path, column="text", row=2, words="whitespace-only")


def test_non_string_text_in_jsonl(tmp_path):
    path = write(tmp_path / "num.jsonl", [{"text": "ok"}, {"text": 12345}])
    raises_at(lambda: load_records(path, text_col="text"), path=path, column="text", row=2, words="non-string")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_over_length_record_never_echoes_value(tmp_path, suffix):
    long_text = (SECRET + " ") * 40
    rows = [{"text": "short"}, {"text": "short too"}, {"text": long_text}, {"text": long_text}]
    path = write(tmp_path / f"long{suffix}", rows)
    exc = raises_at(
        lambda: load_records(path, text_col="text", max_chars=100), path=path, column="text", row=3, words="max_chars=100"
    )
    assert "rows affected" not in str(exc) and "2 rows" not in str(exc)  # no count of bad rows: a private statistic
    assert str(len(long_text)) not in str(exc)  # not even the record's length
    assert len(load_records(path, text_col="text", max_chars=len(long_text))) == 4


def test_non_numeric_value_in_numeric_column(tmp_path):
    rows = [{"age": "31", "city": "Oslo"}, {"age": " 4.5 ", "city": "Rome"}, {"age": SECRET, "city": "Lima"}]
    path = write(tmp_path / "tab.csv", rows)
    raises_at(
        lambda: load_records(path, columns={"age": "numeric", "city": "categorical"}),
        path=path, column="age", row=3, words="expected a number",
    )
    ok = load_records(write(tmp_path / "ok.csv", rows[:2]), columns={"age": "numeric"})
    assert ok["age"].tolist() == [31.0, 4.5] and ok["age"].dtype == np.float64


def test_missing_value_in_numeric_column(tmp_path):
    path = write(tmp_path / "tab.jsonl", [{"age": 3}, {"age": None}])
    raises_at(lambda: load_records(path, columns={"age": "numeric"}), path=path, column="age", row=2, words="missing value")


def test_unknown_column_type(tmp_path):
    path = write(tmp_path / "tab.csv", ROWS)
    raises_at(lambda: load_records(path, columns={"age": "float"}), path=path, column="age", row=None, words="unknown column type")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_nan_user_id_and_label(tmp_path, suffix):
    rows = [{"text": "a", "label": "x", "user": "u1"}, {"text": "b", "label": None, "user": None}]
    path = write(tmp_path / f"u{suffix}", rows)
    raises_at(lambda: load_text_dataset(path, "text", user_col="user"), path=path, column="user", row=2, words="missing user id")
    raises_at(lambda: load_text_dataset(path, "text", label_col="label"), path=path, column="label", row=2, words="missing label")


def test_unreadable_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not parquet " + SECRET.encode())
    raises_at(lambda: load_records(path), path=path, column=None, row=None, words="cannot read Parquet")


def test_errors_are_dpsynth_errors(tmp_path):
    with pytest.raises(DpsynthError):
        load_records(tmp_path / "x.csv")


# ---------------------------------------------------------------- public data sets


def test_biorxiv_loads_1500_rows_with_attributes():
    frame = load_biorxiv()
    assert len(frame) == 1500
    assert list(frame.columns) == ["doi", "title", "abstract", "category", "date", "license"] + BIORXIV_ATTRIBUTES
    assert len(BIORXIV_ATTRIBUTES) == 8
    for name in BIORXIV_ATTRIBUTES:
        assert frame[name].map(lambda v: isinstance(v, str) and v.strip() == v and v != "").all(), name
    # Option counts documented in shared/data/README.md.
    assert frame["primary_research_area"].nunique() == 25
    assert frame["model_organism"].nunique() == 17
    assert frame["sample_size"].nunique() == 6
    assert frame["category"].nunique() == 25


def test_biorxiv_malformed_schema(tmp_path, monkeypatch):
    (tmp_path / "biorxiv").mkdir()
    path = tmp_path / "biorxiv" / "biorxiv_1500.csv"
    good = json.dumps({name: "X" for name in BIORXIV_ATTRIBUTES})
    base = {"doi": "d", "title": "t", "abstract": "a", "category": "c", "date": "2025", "license": "l"}
    pd.DataFrame([{**base, "schema": good}, {**base, "schema": "{not json " + SECRET}]).to_csv(path, index=False)
    monkeypatch.setenv("DPSYNTH_DATA_DIR", str(tmp_path))
    raises_at(load_biorxiv, path=path, column="schema", row=2, words="malformed JSON")
    partial = json.dumps({"primary_research_area": "X"})
    pd.DataFrame([{**base, "schema": good}, {**base, "schema": partial}]).to_csv(path, index=False)
    raises_at(load_biorxiv, path=path, column="schema", row=2, words="model_organism")


@pytest.mark.parametrize("split,n", [("train", 32561), ("test", 16281)])
def test_adult_splits(split, n):
    frame = load_adult(split)
    assert len(frame) == n
    assert list(frame.columns) == ADULT_COLUMNS
    assert set(frame["income"]) == {"<=50K", ">50K"}
    assert 0.2 < (frame["income"] == ">50K").mean() < 0.3  # the published ~24 % positive rate
    for name in ["age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"]:
        assert pd.api.types.is_integer_dtype(frame[name]), name
    for name in ["workclass", "sex", "race", "native_country", "occupation"]:
        assert not frame[name].str.match(r"^\s|\s$").any(), name
    assert set(frame["sex"]) == {"Male", "Female"}
    assert (frame["workclass"] == "?").any()  # unknowns kept as the category "?", not NaN
    assert not frame.isna().any().any()


def test_adult_unknown_split():
    with pytest.raises(DataError, match="split"):
        load_adult("validation")


def test_data_dir_env_and_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(DataError, match="biorxiv_1500.csv") as info:
        load_biorxiv()
    assert str(tmp_path / "biorxiv" / "biorxiv_1500.csv") in str(info.value)
    monkeypatch.setenv("DPSYNTH_DATA_DIR", str(tmp_path / "absent"))
    with pytest.raises(DataError, match="not a directory"):
        data_dir()
    # No env var and no ../shared/data anywhere: the message says where to put the files.
    monkeypatch.delenv("DPSYNTH_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(public_mod, "_REPO_ROOT", tmp_path / "repo")
    with pytest.raises(DataError) as info:
        data_dir()
    msg = str(info.value)
    assert "DPSYNTH_DATA_DIR" in msg and "adult/adult.data" in msg and "adult/adult.test" in msg
    assert str(tmp_path / "shared" / "data") in msg


def test_data_dir_default_is_shared_data(monkeypatch):
    monkeypatch.delenv("DPSYNTH_DATA_DIR", raising=False)
    assert data_dir() == (REPO_ROOT.parent / "shared" / "data").resolve()


# ---------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([str(DPSYNTH), "data", "check", *args], capture_output=True, text=True, timeout=120, env=env)


def test_cli_check_good_and_bad(tmp_path):
    good = write(tmp_path / "good.jsonl", ROWS)
    res = run_cli(str(good), "--text-col", "text", "--label-col", "label", "--user-col", "user", "--columns", "age:numeric,city")
    assert res.returncode == 0, res.stderr
    assert "rows: 4" in res.stdout and "OK" in res.stdout
    assert "age: int64" in res.stdout
    for row in ROWS:  # structure only: no value of any record is printed
        assert row["text"] not in res.stdout and row["city"] not in res.stdout

    bad = write(tmp_path / "bad.csv", ROWS + [{"text": (SECRET + " ") * 30, "label": "a", "user": "u9", "age": 1, "city": "X"}])
    res = run_cli(str(bad), "--text-col", "text", "--max-chars", "50")
    assert res.returncode == 2
    assert str(bad) in res.stderr and "column 'text'" in res.stderr and "row 5" in res.stderr
    assert SECRET not in res.stderr + res.stdout
    assert "Traceback" not in res.stderr

    res = run_cli(str(tmp_path / "missing.csv"), "--text-col", "text")
    assert res.returncode == 2 and "not found" in res.stderr
