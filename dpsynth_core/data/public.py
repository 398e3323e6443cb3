"""Public data sets used for development and benchmarks: bioRxiv abstracts and UCI Adult.

They are read from :func:`data_dir` and never copied into the repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from dpsynth_core.data.errors import data_error
from dpsynth_core.data.loaders import load_records
from dpsynth_core.errors import DataError

ENV_VAR = "DPSYNTH_DATA_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[2]

BIORXIV_FILE = Path("biorxiv") / "biorxiv_1500.csv"
ADULT_FILES = {"train": Path("adult") / "adult.data", "test": Path("adult") / "adult.test"}
EXPECTED_LAYOUT = f"{BIORXIV_FILE}, {ADULT_FILES['train']}, {ADULT_FILES['test']}"

BIORXIV_ATTRIBUTES: list[str] = [
    "primary_research_area",
    "model_organism",
    "experimental_approach",
    "dominant_data_type",
    "research_focus_scale",
    "disease_mention",
    "sample_size",
    "research_goal",
]
BIORXIV_BASE_COLUMNS = ["doi", "title", "abstract", "category", "date", "license"]

ADULT_COLUMNS: list[str] = [
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
    "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week",
    "native_country", "income",
]
ADULT_NUMERIC = ["age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"]
ADULT_LABELS = ("<=50K", ">50K")


def data_dir() -> Path:
    """Directory holding the public data sets.

    ``$DPSYNTH_DATA_DIR`` when set; else ``../shared/data`` relative to the current directory,
    then relative to the repository root, whichever exists first. Raises DataError saying
    where to put the files otherwise.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DataError(
                f"{ENV_VAR}={env} is not a directory. Point it at a folder containing {EXPECTED_LAYOUT}"
            )
        return path
    candidates = [Path.cwd().parent / "shared" / "data", _REPO_ROOT.parent / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    raise DataError(
        "public data directory not found (looked in "
        + ", ".join(str(p) for p in candidates)
        + f"). Set {ENV_VAR} to a folder containing {EXPECTED_LAYOUT}, "
        f"or create {candidates[-1]} with those files"
    )


def _public_file(relative: Path) -> Path:
    root = data_dir()
    path = root / relative
    if not path.is_file():
        raise data_error(
            path, "file not found",
            hint=f"Put it at {path} (the data directory {root} must contain {EXPECTED_LAYOUT})",
        )
    return path


def load_biorxiv() -> pd.DataFrame:
    """The 1,500 bioRxiv abstracts with the 8 oracle attributes parsed from the ``schema`` column.

    Columns: doi, title, abstract, category, date, license, then :data:`BIORXIV_ATTRIBUTES`
    (strings). The raw JSON ``schema`` column is dropped.
    """
    path = _public_file(BIORXIV_FILE)
    frame = load_records(
        path, text_col="abstract", label_col="category",
        columns=BIORXIV_BASE_COLUMNS + ["schema"], max_chars=None,
    )
    parsed = {name: [] for name in BIORXIV_ATTRIBUTES}
    for row, raw in enumerate(frame["schema"], start=1):
        try:
            schema = json.loads(raw)
        except (TypeError, json.JSONDecodeError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not a string"
            raise data_error(path, f"malformed JSON ({msg})", column="schema", row=row) from None
        if not isinstance(schema, dict):
            raise data_error(path, "expected a JSON object", column="schema", row=row)
        for name in BIORXIV_ATTRIBUTES:
            value = schema.get(name)
            if not isinstance(value, str) or not value.strip():
                raise data_error(
                    path, f"attribute {name!r} missing or not a non-empty string", column="schema", row=row
                )
            parsed[name].append(value.strip())
    out = frame[BIORXIV_BASE_COLUMNS].copy()
    for name in BIORXIV_ATTRIBUTES:
        out[name] = parsed[name]
    return out


def load_adult(split: str = "train") -> pd.DataFrame:
    """UCI Adult, ``split`` "train" (adult.data, 32,561 rows) or "test" (adult.test, 16,281 rows).

    Column names are :data:`ADULT_COLUMNS`; strings are stripped; numeric columns are int64;
    ``income`` is "<=50K" or ">50K" in both splits (adult.test's trailing '.' removed, its
    junk first line skipped). Unknown values, written "?" in the source, are kept as the
    category value "?" (not NaN), so every row stays and tabular synthesizers see "?" as
    one more category.
    """
    if split not in ADULT_FILES:
        raise DataError(f"load_adult: unknown split {split!r}; expected 'train' or 'test'")
    path = _public_file(ADULT_FILES[split])
    try:
        frame = pd.read_csv(
            path, header=None, names=ADULT_COLUMNS, dtype=str, skipinitialspace=True,
            skiprows=1 if split == "test" else 0, keep_default_na=False, na_values=[""],
            skip_blank_lines=True, encoding="utf-8",
        )
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise data_error(path, f"cannot parse Adult file ({type(exc).__name__})") from None
    if len(frame) == 0:
        raise data_error(path, "no data rows (0 rows)")
    for name in ADULT_COLUMNS:
        col = frame[name]
        if col.isna().any():
            row = int(col.isna().to_numpy().argmax()) + 1
            raise data_error(path, "missing value (expected 15 comma-separated fields)", column=name, row=row)
        frame[name] = col.str.strip()
    frame["income"] = frame["income"].str.rstrip(".")
    bad = ~frame["income"].isin(ADULT_LABELS)
    if bad.any():
        row = int(bad.to_numpy().argmax()) + 1
        raise data_error(path, "income label is not one of <=50K, >50K", column="income", row=row)
    for name in ADULT_NUMERIC:
        parsed = pd.to_numeric(frame[name], errors="coerce")
        if parsed.isna().any():
            row = int(parsed.isna().to_numpy().argmax()) + 1
            raise data_error(path, "expected a number, found a non-numeric value", column=name, row=row)
        frame[name] = parsed.astype("int64")
    return frame
