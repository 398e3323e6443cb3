"""One key name per meaning across pipelines, old spellings accepted with one line naming the new key
(issue 19, item 9a); input paths in a config read next to the config file, from any cwd (item 9b)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from dpsynth_core.config import load_config
from dpsynth_core.config.keys import renamed_keys
from dpsynth_core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _classes() -> dict[str, type]:
    from dpsynth_core.actg.pipeline import ActgConfig
    from dpsynth.cli.audit import AuditJobConfig
    from dpsynth_core.dpsgd.train_job import TrainJobConfig
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.tabular.config import AimConfig, DpFairConfig

    return {"actg": ActgConfig, "wasp": PEConfig, "augpe": PEConfig, "dpfair": DpFairConfig, "aim": AimConfig,
            "train": TrainJobConfig, "audit": AuditJobConfig}


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def test_bundled_configs_use_the_shared_names():
    checked = 0
    folders = ("configs", "tests/configs", "experiments/configs")  # issue 41 moved some out of configs/
    for path in sorted(p for folder in folders for p in (REPO / folder).glob("*.yaml")):
        cls = _classes().get(path.stem.split("_")[0])
        if cls is None:
            continue
        raw = yaml.safe_load(path.read_text())
        assert renamed_keys(raw, cls) == [], path.name
        checked += 1
    assert checked >= 20


def test_old_spellings_load_with_one_line_naming_the_new_key(tmp_path, capsys):
    from dpsynth_core.pe.config import PEConfig

    run = tmp_path / "r"
    old = _write(tmp_path / "old.yaml", {"method": "wasp", "data": {"source": "biorxiv", "classes": ["neuroscience", "bioinformatics"]}, "run_dir": str(run)})
    assert load_config(old, PEConfig).run_dir == run
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key 'run_dir' is now 'output_dir'" in err

    new = _write(tmp_path / "new.yaml", {"method": "wasp", "data": {"source": "biorxiv", "classes": ["neuroscience", "bioinformatics"]}, "output_dir": str(run)})
    assert load_config(new, PEConfig).run_dir == run
    assert capsys.readouterr().err == ""

    both = _write(tmp_path / "both.yaml", {"method": "wasp", "data": {"source": "biorxiv", "classes": ["neuroscience", "bioinformatics"]}, "output_dir": str(run), "run_dir": str(run)})
    with pytest.raises(ConfigError, match="give 'output_dir' only"):
        load_config(both, PEConfig)


def test_nested_old_spelling_is_named_with_its_path(tmp_path, capsys):
    from dpsynth_core.dpsgd.train_job import TrainJobConfig

    raw = yaml.safe_load((REPO / "configs" / "train_tiny.yaml").read_text())
    raw["data"]["text_column"] = raw["data"].pop("text_col")
    job = load_config(_write(tmp_path / "t.yaml", raw), TrainJobConfig)
    assert job.data.text_column == "abstract"
    assert "key 'data.text_column' is now 'data.text_col'" in capsys.readouterr().err


def test_tabular_data_path_is_the_file(tmp_path):
    from dpsynth_core.tabular.config import AimConfig

    raw = yaml.safe_load((REPO / "configs" / "aim_tiny_test.yaml").read_text())
    (tmp_path / "table.csv").write_text("age,sex\n30,Male\n")
    raw["data"] = {"path": "table.csv", "train_rows": 10}
    cfg = load_config(_write(tmp_path / "aim.yaml", raw), AimConfig)
    assert cfg.data.source == str(tmp_path / "table.csv")


def test_pipeline_reads_data_next_to_its_config_from_another_cwd(tmp_path, monkeypatch, capsys):
    """Old code: `data.path: corpus.csv` was read from the current directory, so this --check failed."""
    from dpsynth.cli.main import cli_command

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    rows = "".join(f"text number {i},{'ab'[i % 2]}\n" for i in range(40))
    (project / "corpus.csv").write_text("text,label\n" + rows)
    cfg = _write(project / "wasp.yaml", {
        "method": "wasp", "output_dir": str(project / "run"),
        "data": {"source": "file", "path": "corpus.csv", "text_col": "text", "label_col": "label",
                 "classes": ["a", "b"], "num_private": 10, "sample_fraction": 0.25, "num_test": 0},
        "plms": [{"model": "tiny-llama", "name": "t", "backend": "hf"}], "iterations": 1, "num_synthetic": 4})
    monkeypatch.chdir(elsewhere)
    code = cli_command().main(args=["run", "wasp", "--config", str(cfg),
                                    "--check"], prog_name="dpsynth", standalone_mode=False)
    out = capsys.readouterr()
    assert code in (0, None), out.out + out.err
    assert not (project / "run").exists() and sorted(p.name for p in elsewhere.iterdir()) == []
