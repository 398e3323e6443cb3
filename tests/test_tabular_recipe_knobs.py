"""DPFairLLM's knobs (issue 41, item 1): the recipe names no data set's column, and the guide's one table of
knobs names every key a config can set and nothing else (no removed knob). Configs and text only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from dpsynth_core.tabular.config import DpFairConfig
from dpsynth_core.tabular.recipe import recipe_settings

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "guides" / "dpfair.md"
# data.path is read as data.source by a before-validator (DataSettings._path_is_your_file), not a field
SPELLINGS_BEFORE_VALIDATION = {"data.path"}


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[set[str], bool]]:
    """Every field of ``model``, nested: (its dotted spellings, name and alias; whether it is a leaf)."""
    out: list[tuple[set[str], bool]] = []
    for name, field in model.model_fields.items():
        section = isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        out.append(({prefix + name, prefix + (field.alias or name)}, not section))
        if section:
            out += _fields(field.annotation, f"{prefix}{name}.")
    return out


def _leaves(mapping: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in mapping.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def _column_names() -> set[str]:
    """The columns of every shipped table schema (the text schemas hold ``fields``, not columns)."""
    schemas = [yaml.safe_load(path.read_text()) for path in (REPO / "configs" / "schemas").glob("*.yaml")]
    return {column["name"] for schema in schemas for column in schema.get("columns", [])}


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0, 10.0])
def test_the_recipe_names_no_column_of_any_data_set(epsilon):
    settings = _leaves(recipe_settings(epsilon))
    leaves = {k for spellings, leaf in _fields(DpFairConfig) if leaf for k in spellings}
    # every setting is a config key (a {column: weight} map would show here as an unknown key)
    assert [k for k in settings if k not in leaves] == []
    values = {v for value in settings.values() for v in (value if isinstance(value, list) else [value])}
    columns = _column_names()
    assert {"sex", "marital_status", "income"} <= columns  # the schemas were read
    assert values & columns == set()


def _table_keys(text: str) -> list[str]:
    """The keys the guide's knob table names (``.x`` after a dotted key: a sibling of that key)."""
    lines = text[text.index("| key | `recipe: none`"):].splitlines()[2:]
    named = []
    for line in lines:
        if not line.startswith("|"):
            break
        parent = ""
        for key in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if key.startswith("."):
                key = parent + key
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            named.append(key)
    return named


def test_the_guides_table_names_every_knob_and_only_knobs_that_exist():
    named = _table_keys(GUIDE.read_text())
    fields = _fields(DpFairConfig)
    keys = {k for spellings, _ in fields for k in spellings} | SPELLINGS_BEFORE_VALIDATION
    assert len(named) > 40
    # nothing removed or misspelt (lambda_reweigh, target_rates, select, ... would fail here)
    assert [k for k in named if k not in keys] == []
    # every key a config can set is in the table, itself or through its section (training.lora)
    covered = lambda key: any(key == n or key.startswith(n + ".") for n in named)  # noqa: E731
    assert sorted(min(spellings) for spellings, leaf in fields if leaf and not any(map(covered, spellings))) == []
