"""DPFairLLM's recipe as its default (issue 41, item 1): a minimal config resolves to the committed recipe,
data-dependent choices come from the schema and the DP tables (never a column's name), removed knobs exit 2.
No model, no training: configs, schemas and a fixed set of released marginals only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.config import load_dpfair_config
from dpsynth_core.tabular.pipeline import EXECUTION_ONLY
from dpsynth_core.tabular.run_schema import public_schema
from dpsynth_core.tabular.stages_dp import resolved_with_tables

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "configs"
# one dp_marginals release of 1,000 Adult training rows at the eps = 4 recipe's share (pairs with income and
# sex) and its noise sd: the released tables the proxy is chosen from
RELEASED = json.loads((CONFIGS / "dpfair_recipe_adult_marginals.json").read_text())


def _flat(mapping: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in mapping.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _resolved(path: Path) -> dict:
    cfg = load_dpfair_config(path)
    resolved = _flat(resolved_with_tables(cfg, public_schema(cfg), RELEASED["marginals"], RELEASED["sigma"]))
    return {k: v for k, v in resolved.items() if k != "recipe" and k.split(".")[0] not in EXECUTION_ONLY}


@pytest.mark.parametrize("epsilon", [1, 4])
def test_the_minimal_config_resolves_to_the_committed_recipe_field_by_field(epsilon):
    shipped = yaml.safe_load((REPO / "configs" / f"dpfair_eps{epsilon}_1000.yaml").read_text())
    # what a user names: schema and columns, data, epsilon, the sensitive attribute, the rows (and where to write)
    assert set(shipped) <= {"name", "output_dir", "recipe", "schema_path", "columns", "data", "privacy", "fairness",
                            "generation"}
    assert shipped["fairness"] == {"sensitive": "sex"} and shipped["generation"] == {"num_rows": 1000}
    minimal = _resolved(REPO / "configs" / f"dpfair_eps{epsilon}_1000.yaml")
    recipe = _resolved(CONFIGS / f"dpfair_recipe_eps{epsilon}_full.yaml")
    assert minimal.keys() == recipe.keys()
    assert {k: (minimal[k], recipe[k]) for k in minimal if minimal[k] != recipe[k]} == {}
    assert minimal["generation.calibrate.stratify"] == ["sex", "marital_status"]  # the proxy from the DP tables
    assert minimal["columns"][:2] == ["sex", "marital_status"]  # written first


@pytest.mark.parametrize("epsilon", [1, 4])
def test_a_config_without_recipe_resolves_exactly_as_recipe_fair_v1_and_none_opts_out(tmp_path, epsilon):
    from dpsynth_core.tabular.config import DpFairConfig

    shipped = yaml.safe_load((REPO / "configs" / f"dpfair_eps{epsilon}_1000.yaml").read_text())
    assert "recipe" not in shipped  # the shipped minimal configs rely on the default
    variants = {}
    for recipe in ("left out", "fair-v1", "none"):
        raw = dict(shipped) if recipe == "left out" else {**shipped, "recipe": recipe}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
        variants[recipe] = load_dpfair_config(tmp_path / "c.yaml").model_dump(mode="json")
    assert variants["left out"] == variants["fair-v1"] and variants["fair-v1"]["recipe"] == "fair-v1"
    bare = variants["none"]
    assert bare["recipe"] == "none" and bare != variants["fair-v1"]
    # recipe: none is the bare method: every key the config leaves out takes the field's own default
    defaults = DpFairConfig.model_validate({"recipe": "none", "privacy": {"epsilon": epsilon}}).model_dump(mode="json")
    for section in ("budget", "serialization", "training"):
        assert bare[section] == defaults[section], section
    assert not bare["generation"]["calibrate"]["enabled"] and not bare["generation"]["fairness"]["enabled"]
    assert bare["fairness"] == {**defaults["fairness"], "sensitive": "sex"}
    # a run saved before fair-v1 was the default wrote recipe: null, which meant the bare method
    null = load_dpfair_config(_written(tmp_path, {**shipped, "recipe": None})).model_dump(mode="json")
    assert null == bare
    with pytest.raises(ConfigError, match="'fair-v2' is not a recipe"):
        load_dpfair_config(_written(tmp_path, {**shipped, "recipe": "fair-v2"}))


def _written(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "written.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _renamed_schema(tmp_path: Path, names: dict[str, str]) -> Path:
    schema = yaml.safe_load((REPO / "configs" / "schemas" / "adult.yaml").read_text())
    for column in schema["columns"]:
        column["name"] = names[column["name"]]
    schema["sensitive"] = [names[s] for s in schema["sensitive"]]
    schema["target"] = names[schema["target"]]
    path = tmp_path / "renamed_schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    return path


def _renamed_marginals(marginals: dict, names: dict[str, str]) -> dict:
    out = {names[c]: entry for c, entry in marginals.items() if c != "pairs"}
    out["pairs"] = {"|".join(names[c] for c in key.split("|")): {**entry, "columns": [names[c] for c in entry["columns"]]}
                    for key, entry in marginals["pairs"].items()}
    return out


def test_renaming_every_adult_column_gives_the_same_recipe_renamed(tmp_path):
    schema = yaml.safe_load((REPO / "configs" / "schemas" / "adult.yaml").read_text())
    # new names that sort in the opposite order to the old ones: a choice by name or by sorted name would show
    old = [c["name"] for c in schema["columns"]]
    names = {name: f"q{99 - i:02d}_{len(old) - i}" for i, name in enumerate(sorted(old))}
    config = yaml.safe_load((REPO / "configs" / "dpfair_eps4_1000.yaml").read_text())
    renamed = {**config, "schema_path": str(_renamed_schema(tmp_path, names)),
               "columns": [names[c] for c in config["columns"]], "fairness": {"sensitive": names["sex"]}}
    (tmp_path / "renamed.yaml").write_text(yaml.safe_dump(renamed))

    original_cfg = load_dpfair_config(REPO / "configs" / "dpfair_eps4_1000.yaml")
    renamed_cfg = load_dpfair_config(tmp_path / "renamed.yaml")
    original = _flat(resolved_with_tables(original_cfg, public_schema(original_cfg), RELEASED["marginals"],
                                          RELEASED["sigma"]))
    got = _flat(resolved_with_tables(renamed_cfg, public_schema(renamed_cfg),
                                     _renamed_marginals(RELEASED["marginals"], names), RELEASED["sigma"]))

    def rename(value):
        if isinstance(value, list):
            return [rename(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value

    expected = {k: rename(v) for k, v in original.items() if k != "schema_path"}
    assert {k: v for k, v in got.items() if k != "schema_path"} == expected
    assert got["generation.calibrate.stratify"] == [names["sex"], names["marital_status"]]


def test_the_epsilon_dependent_settings_switch_between_the_two_measured_points(tmp_path):
    from dpsynth_core.tabular.recipe import LOW_EPSILON, recipe_settings

    low, high = recipe_settings(1.0), recipe_settings(4.0)
    assert (low["generation"]["fairness"]["rate_mix"], high["generation"]["fairness"]["rate_mix"]) == (0.4, 0.5)
    assert (low["budget"]["marginals"], high["budget"]["marginals"]) == (0.5, 0.2)
    assert recipe_settings(LOW_EPSILON) == high and recipe_settings(LOW_EPSILON * 0.99) == low
    # what a config says wins over the recipe, key by key
    raw = yaml.safe_load((REPO / "configs" / "dpfair_eps4_1000.yaml").read_text())
    raw["training"] = {"steps": 20}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_dpfair_config(tmp_path / "c.yaml")
    assert cfg.training.steps == 20 and cfg.training.learning_rate == 0.01 and cfg.generation.calibrate.enabled


def test_stratify_auto_takes_two_sensitive_attributes_and_no_proxy_or_the_attribute_alone():
    from dpsynth_core.tabular.strata import choose_strata

    marginals = RELEASED["marginals"]
    assert choose_strata(marginals, ["sex", "race"], ["marital_status"], RELEASED["sigma"]) == ("sex", "race")
    assert choose_strata({"pairs": {}}, ["sex"], ["marital_status"], RELEASED["sigma"]) == ("sex",)
    # pure noise (the table's cells all alike) is no proxy
    flat = {**marginals, "pairs": {"education|sex": {"columns": ["education", "sex"], "counts": [30.0] * 32}}}
    assert choose_strata(flat, ["sex"], ["education"], RELEASED["sigma"]) == ("sex",)


@pytest.mark.parametrize("section, key, value", [
    ("calibrate", "label_temperature", 1.0), ("calibrate", "pair_bins", 4), ("calibrate", "max_weight", 10.0),
    ("calibrate", "select", "pps"), ("fairness", "target_rates", {"Male": 0.2}),
])
def test_a_removed_knob_is_an_error_naming_it(tmp_path, section, key, value):
    raw = yaml.safe_load((REPO / "configs" / "dpfair_eps4_1000.yaml").read_text())
    raw["generation"][section] = {key: value}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=rf"generation\.{section}\.{key} was removed"):
        load_dpfair_config(tmp_path / "old.yaml")


def test_lambda_reweigh_is_removed_a_config_naming_it_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    raw = yaml.safe_load((REPO / "configs" / "dpfair_eps4_1000.yaml").read_text())
    raw["output_dir"] = str(tmp_path / "run")
    raw["fairness"] = {**raw["fairness"], "lambda_reweigh": 0.0}  # even at its old default (off)
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"fairness\.lambda_reweigh was removed"):
        load_dpfair_config(tmp_path / "old.yaml")
    assert _cli(monkeypatch, "run", "dpfair", "--config", str(tmp_path / "old.yaml")) == 2
    err = capsys.readouterr().err
    assert "fairness.lambda_reweigh was removed" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def _cli(monkeypatch, *args) -> int:
    from dpsynth.cli.main import app

    monkeypatch.setattr(sys, "argv", ["dpsynth", *args])
    try:
        app()
    except SystemExit as exc:  # an error's exit status; a command that succeeds returns
        return exc.code
    return 0


def test_config_resolve_prints_the_recipe_and_a_removed_knob_exits_2(tmp_path, monkeypatch, capsys):
    assert _cli(monkeypatch, "config", "resolve", "--config", str(REPO / "configs" / "dpfair_eps1_1000.yaml")) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["generation"]["fairness"]["rate_mix"] == 0.4 and resolved["budget"]["marginals"] == 0.5
    assert resolved["generation"]["calibrate"]["stratify"] == "auto" and "chosen by each run" in out
    from dpsynth.api import DPFairLLM

    assert DPFairLLM.from_yaml(REPO / "configs" / "dpfair_eps1_1000.yaml").resolved_config() == resolved  # the API
    raw = yaml.safe_load((REPO / "configs" / "dpfair_eps1_1000.yaml").read_text())
    raw["generation"]["calibrate"] = {"label_temperature": 1.0}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw))
    assert _cli(monkeypatch, "config", "resolve", "--config", str(tmp_path / "old.yaml")) == 2
    err = capsys.readouterr().err
    assert "generation.calibrate.label_temperature was removed" in err and "Traceback" not in err


def test_a_run_resolves_stratify_auto_from_its_released_tables(tmp_path, monkeypatch, capsys):
    """resolved_config.yaml / ``config resolve --run``: the run's own marginals and the sigma of its ledger."""
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.tabular.dp_domain import dp_marginals
    from dpsynth_core.tabular.stages_dp import MARGINALS_FILE, resolved_config

    config = REPO / "configs" / "dpfair_eps4_1000.yaml"
    cfg = load_dpfair_config(config)
    schema = public_schema(cfg)
    run = tmp_path / "run"
    run.mkdir()
    (run / "schema_resolved.json").write_text(schema.model_dump_json())
    # released tables of a made-up table where 'occupation' carries sex and marital status does not
    import pandas as pd

    rows = pd.DataFrame({c: [schema.column(c).categories[0] if schema.column(c).is_categorical else 40] * 400
                         for c in schema.names})
    rows["sex"] = ["Female", "Male"] * 200
    rows["occupation"] = ["Adm-clerical", "Craft-repair"] * 200
    ledger = PrivacyLedger.create(run, "made-up", 4.0, 1e-5)
    (run / MARGINALS_FILE).write_text(json.dumps(dp_marginals(rows, schema, epsilon=2.0, ledger=ledger, bins=20,
                                                              pairs_with=["income", "sex"])))
    resolved = resolved_config(cfg, run)
    assert resolved["generation"]["calibrate"]["stratify"] == ["sex", "occupation"]
    assert resolved["columns"][:2] == ["sex", "occupation"] and sorted(resolved["columns"]) == sorted(schema.names)
    assert _cli(monkeypatch, "config", "resolve", "--config", str(config), "--run", str(run)) == 0
    assert yaml.safe_load(capsys.readouterr().out)["generation"]["calibrate"]["stratify"] == ["sex", "occupation"]
