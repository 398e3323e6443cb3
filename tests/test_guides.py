"""The bring-your-own-data guides (issue 19, item 9d): each pipeline has one, and its minimal config
and example schema pass validation (so a guide cannot drift from the config classes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dpsynth_core.config import load_config

GUIDES = Path(__file__).resolve().parent.parent / "docs" / "guides"


def _config_class(pipeline: str):
    from dpsynth_core.actg.pipeline import ActgConfig
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.tabular.config import AimConfig, DpFairConfig

    return {"actg": ActgConfig, "wasp": PEConfig, "augpe": PEConfig, "dpfair": DpFairConfig, "aim": AimConfig}[pipeline]


def _yaml_block(text: str, heading: str) -> str:
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    assert blocks, f"no yaml block under '## {heading}'"
    return blocks[0]


@pytest.mark.parametrize("pipeline", ["actg", "wasp", "augpe", "dpfair", "aim"])
def test_guide_minimal_config_validates(pipeline, tmp_path, capsys):
    text = (GUIDES / f"{pipeline}.md").read_text(encoding="utf-8")
    for heading in ("Your data", "Config keys", "Minimal config", "Run it", "What comes out", "Common errors"):
        assert f"## {heading}" in text, heading
    assert f"dpsynth run {pipeline} --config" in text
    path = tmp_path / "minimal.yaml"
    path.write_text(_yaml_block(text, "Minimal config"))
    cfg = load_config(path, _config_class(pipeline))
    assert capsys.readouterr().err == ""  # no deprecated key in a guide
    if pipeline in ("wasp", "augpe"):
        assert cfg.method == pipeline and cfg.data.source == "file"


def test_guide_schemas_validate(tmp_path):
    from dpsynth_core.actg.schema import load_schema as load_text_schema
    from dpsynth_core.tabular.schema import load_schema as load_table_schema

    for guide, load in (("actg", load_text_schema), ("dpfair", load_table_schema)):
        text = (GUIDES / f"{guide}.md").read_text(encoding="utf-8")
        path = tmp_path / f"{guide}_schema.yaml"
        path.write_text(re.sub(r"(?m)^  ", "", _yaml_block(text, "Your data")))  # the block sits in a list item
        assert load(path) is not None


def test_actg_guide_runs_its_preflight_on_an_unlabelled_corpus_from_another_cwd(tmp_path, monkeypatch, capsys):
    """The guide's config and schema as written (paths next to the config), a corpus with no label
    column, `dpsynth run actg --check` from another directory: the whole file is valid, nothing written."""
    from dpsynth.cli.main import cli_command

    text = (GUIDES / "actg.md").read_text(encoding="utf-8")
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    cfg = yaml.safe_load(_yaml_block(text, "Minimal config"))
    cfg["output_dir"] = str(project / "runs")
    cfg["data"].update(n_records=40, n_eval=10)
    (project / "tickets.yaml").write_text(yaml.safe_dump(cfg))
    (project / "tickets_schema.yaml").write_text(re.sub(r"(?m)^  ", "", _yaml_block(text, "Your data")))
    rows = "".join(f"My order {i} did not arrive in time\n" for i in range(80))
    (project / "tickets.csv").write_text("body\n" + rows)
    monkeypatch.chdir(elsewhere)
    code = cli_command().main(args=["run", "actg", "--config", str(project / "tickets.yaml"), "--check"],
                              prog_name="dpsynth", standalone_mode=False)
    out = capsys.readouterr().out
    assert code in (0, None) and "pre-flight OK" in out and "80 rows, valid" in out
    assert sorted(p.name for p in project.iterdir()) == ["tickets.csv", "tickets.yaml", "tickets_schema.yaml"]
    assert list(elsewhere.iterdir()) == []
