"""`dpsynth eval tabular` (issue 19, item 5): a bad row anywhere in a whole file is found, and the error
names that file, the column and the 1-based data row (as `dpsynth data check` does), never the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.cli.main import cli_command
from dpsynth_core.errors import DataError

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"
COLUMNS = ["age", "education", "sex", "hours_per_week", "income"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory, adult_dir):
    from dpsynth_core.data import load_adult

    d = tmp_path_factory.mktemp("eval_rows")
    train = load_adult("train").sample(300, random_state=0)[COLUMNS].reset_index(drop=True)
    train.to_csv(d / "train.csv", index=False)
    load_adult("test").sample(300, random_state=1)[COLUMNS].to_csv(d / "test.csv", index=False)
    train.head(60).to_csv(d / "synthetic.csv", index=False)
    return d


def _eval(tables: Path, out: Path, **files: Path) -> None:
    paths = {"synthetic": tables / "synthetic.csv", "real-train": tables / "train.csv",
             "real-test": tables / "test.csv", **{k.replace("_", "-"): v for k, v in files.items()}}
    args = ["eval", "tabular", "--schema", str(ADULT_SCHEMA), "--out", str(out)]
    for name, path in paths.items():
        args += [f"--{name}", str(path)]
    cli_command().main(args=args, prog_name="dpsynth", standalone_mode=False)


def _with_bad_cell(src: Path, dest: Path, row: int, column: str, value: str) -> Path:
    import pandas as pd

    frame = pd.read_csv(src).astype({column: object})
    frame.loc[row - 1, column] = value  # row = 1-based data row (row 1 = first record after the header)
    frame.to_csv(dest, index=False)
    return dest


def test_bad_category_names_the_file_and_its_data_row(tables, tmp_path):
    bad = _with_bad_cell(tables / "train.csv", tmp_path / "bad_train.csv", 18, "education", "Secret-Degree")
    with pytest.raises(DataError) as err:
        _eval(tables, tmp_path / "r", real_train=bad)
    msg = str(err.value)
    assert str(bad) in msg and "column 'education'" in msg and "row 18:" in msg
    assert "Secret-Degree" not in msg
    assert not (tmp_path / "r").exists()


def test_bad_number_in_the_last_row_of_the_test_file_is_found(tables, tmp_path):
    bad = _with_bad_cell(tables / "test.csv", tmp_path / "bad_test.csv", 300, "age", "forty")
    with pytest.raises(DataError) as err:
        _eval(tables, tmp_path / "r", real_test=bad)
    msg = str(err.value)
    assert str(bad) in msg and "column 'age'" in msg and "row 300:" in msg and "forty" not in msg
