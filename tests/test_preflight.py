"""Pre-flight (issue 19, item 4): config and the whole data file are checked before a run
directory exists or Ray starts; an empty config is an error; delta >= 1 is named by its field at
config load; `--check` runs only the pre-flight and writes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from cli_in_process import dpsynth
from dpsynth_core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
SECRET = "Zebra-7731 secret abstract"

def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def bad_corpus(tmp_path: Path) -> Path:
    """A private corpus whose 3rd data row has an empty text (and a secret elsewhere)."""
    rows = ["text,category"] + [f"{SECRET} {i},cat{i % 2}" for i in range(2)] + [",cat0"]
    rows += [f"record {i},cat{i % 2}" for i in range(30)]
    path = tmp_path / "corpus.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_actg_bad_data_fails_in_seconds_and_writes_nothing(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    # warm the imports with a missing config: the modules' import time is not what is measured
    assert dpsynth(monkeypatch, capsys, "run", "actg", "--config", str(tmp_path / "missing.yaml"))[0] != 0
    cfg = write_yaml(tmp_path / "actg.yaml", {
        "name": "bad", "run_dir": str(run_dir),
        "data": {"path": str(bad_corpus(tmp_path)), "text_col": "text", "n_records": 10, "n_eval": 4},
    })
    start = time.perf_counter()
    code, out = dpsynth(monkeypatch, capsys, "run", "actg", "--config", str(cfg))
    elapsed = time.perf_counter() - start
    assert code != 0
    assert elapsed < 5, f"pre-flight took {elapsed:.1f} s"
    assert "corpus.csv" in out and "column 'text'" in out and "row 3" in out
    assert SECRET not in out and "Traceback" not in out
    assert not run_dir.exists()


@pytest.mark.parametrize("text", ["", "# only a comment\n\n# and another\n"])
def test_empty_config_is_an_error_naming_the_file(tmp_path, monkeypatch, capsys, text):
    from dpsynth_core.actg.pipeline import load_actg_config

    cfg = tmp_path / "empty.yaml"
    cfg.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"empty\.yaml: the config file is empty"):
        load_actg_config(cfg)
    monkeypatch.chdir(tmp_path)  # the default run directory would be runs/actg here
    code, out = dpsynth(monkeypatch, capsys, "run", "actg", "--config", str(cfg))
    assert code != 0 and "is empty" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.yaml"]


def _pe_config(tmp_path: Path, **extra) -> Path:
    return write_yaml(tmp_path / "wasp.yaml", {
        "method": "wasp", "run_dir": str(tmp_path / "run"),
        "data": {"source": "file", "path": str(tmp_path / "c.csv"), "text_col": "text", "classes": ["a", "b"]},
        **extra})


@pytest.mark.parametrize("delta", [1, 1.5, 0])
def test_wasp_delta_out_of_range_named_at_config_load(tmp_path, delta):
    from dpsynth_core.pe.pipeline import load_pe_config

    with pytest.raises(ConfigError, match=r"field 'privacy.delta': must be in \(0, 1\)"):
        load_pe_config(_pe_config(tmp_path, delta=delta), "wasp")


def test_dpfair_delta_one_named_at_config_load(tmp_path):
    from dpsynth_core.tabular.config import load_dpfair_config

    with pytest.raises(ConfigError, match=r"field 'privacy.delta'"):
        load_dpfair_config(write_yaml(tmp_path / "d.yaml", {"epsilon": 1.0, "delta": 1.0}))


def test_train_delta_one_named_at_config_load(tmp_path):
    from dpsynth_core.dpsgd.train_job import TrainJobConfig
    from dpsynth_core.config import load_config

    raw = yaml.safe_load((REPO / "configs" / "train_tiny.yaml").read_text())
    raw["privacy"]["delta"] = 1.0
    with pytest.raises(ConfigError, match=r"field 'privacy\.delta'"):
        load_config(write_yaml(tmp_path / "t.yaml", raw), TrainJobConfig)


def test_dpfair_check_prints_the_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    raw = yaml.safe_load((REPO / "configs" / "dpfair_tiny_test.yaml").read_text())
    raw.update(output_dir=str(tmp_path / "out" / raw["name"]), schema_path=str(REPO / "configs" / "schemas" / "adult.yaml"))
    cfg = write_yaml(tmp_path / "dpfair.yaml", raw)
    code, out = dpsynth(monkeypatch, capsys, "run", "dpfair", "--config", str(cfg), "--check")
    assert code == 0, out
    assert "prepare -> fair_stats -> train" in out and "epsilon 4" in out
    assert str((tmp_path / "out" / "dpfair_tiny").resolve()) in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dpfair.yaml"]


def test_check_reports_bad_data_without_writing(tmp_path, monkeypatch, capsys):
    (tmp_path / "c.csv").write_text("text,category\nfine,a\nok,b\n,a\n", encoding="utf-8")
    cfg = _pe_config(tmp_path)
    code, out = dpsynth(monkeypatch, capsys, "run", "wasp", "--config", str(cfg), "--check")
    assert code != 0 and "c.csv, column 'text', row 3" in out
    assert not (tmp_path / "run").exists()


def test_train_bad_data_fails_before_anything_is_written(tmp_path, monkeypatch, capsys):
    # (the full plan of `train --check` calibrates the noise and loads the model config: tens of
    # seconds on this CPU, so the printed plan is tested on DPFairLLM and generate instead)
    raw = yaml.safe_load((REPO / "configs" / "train_tiny.yaml").read_text())
    data = tmp_path / "corpus.csv"
    data.write_text("abstract,category\n" + f"{SECRET},a\n" * 20 + ",b\n", encoding="utf-8")
    raw["data"].update(path=str(data), max_records=None)
    raw["output_dir"] = str(tmp_path / "out")
    cfg = write_yaml(tmp_path / "train.yaml", raw)
    for extra in (["--check"], []):
        code, out = dpsynth(monkeypatch, capsys, "train", "--config", str(cfg), *extra)
        assert code == 2 and "corpus.csv, column 'abstract', row 21" in out and SECRET not in out, out
        assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.csv", "train.yaml"]


def test_generate_check_and_a_missing_adapter_write_nothing(tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "shards"
    cfg = write_yaml(tmp_path / "g.yaml", {"prompt": "Write a sentence.", "num_rows": 30, "shard_size": 10,
                                           "output_dir": str(out_dir)})
    code, out = dpsynth(monkeypatch, capsys, "generate", "--config", str(cfg), "--check")
    assert code == 0 and "30 generations in 3 shard(s)" in out and "none spent" in out
    cfg = write_yaml(tmp_path / "g.yaml", {"prompt": "x", "adapter_dir": str(tmp_path / "nope"),
                                           "output_dir": str(out_dir)})
    code, out = dpsynth(monkeypatch, capsys, "generate", "--config", str(cfg))
    assert code == 2 and "field 'adapter_dir'" in out
    assert not out_dir.exists()
