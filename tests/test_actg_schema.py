"""Attribute schema: loading, validation errors, the bioRxiv schema vs the oracle labels, and
schema design from public descriptions only."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dpsynth_core.actg.schema import AttributeSchema, builtin_schema, load_schema, schema_from_dict
from dpsynth_core.actg.schema_design import (
    RETRY_SUFFIX,
    build_schema_prompt,
    design_schema,
    parse_schema_answer,
)
from dpsynth_core.errors import ConfigError, DataError, DpsynthError

GOOD = {"name": "toy", "fields": [
    {"name": "topic", "description": "Topic", "options": ["Neuroscience", "Ecology", "Other"]},
    {"name": "organism", "options": ["Human", "Mouse/Rat"]},
]}


def _write(tmp_path, raw, name="schema.yaml"):
    import yaml

    path = tmp_path / name
    path.write_text(json.dumps(raw) if name.endswith(".json") else yaml.safe_dump(raw))
    return path


def test_load_yaml_and_json_roundtrip(tmp_path):
    s = load_schema(_write(tmp_path, GOOD))
    assert s.field_names == ["topic", "organism"]
    assert s.options("organism") == ["Human", "Mouse/Rat"]
    assert s.categories()["topic"][-1] == "Other"
    s2 = load_schema(s.save(tmp_path / "copy.json"))
    assert s2 == s
    s3 = load_schema(s.save(tmp_path / "copy.yaml"))
    assert s3 == s


def test_compact_form():
    s = schema_from_dict({"fields": {"a": ["x", "y"], "b": {"description": "B", "options": ["u", "v"]}}})
    assert s.field_names == ["a", "b"] and s.field("b").description == "B"


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r["fields"].append(dict(r["fields"][0])), "duplicate field 'topic'"),
    (lambda r: r["fields"][1].update(options=[]), "options must not be empty"),
    (lambda r: r["fields"][1].update(options=["Human", "human"]), "duplicate option"),
    (lambda r: r["fields"][1].update(options=["Human", "  "]), "option 1 is empty"),
    (lambda r: r["fields"][0].update(name="1bad name"), "bad field name"),
    (lambda r: r["fields"][0].update(colour="red"), "colour"),
    (lambda r: r.update(fields=[]), "at least one field"),
])
def test_validation_errors_name_file_and_field(tmp_path, mutate, expected):
    raw = json.loads(json.dumps(GOOD))
    mutate(raw)
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError) as info:
        load_schema(path)
    msg = str(info.value)
    assert str(path) in msg and expected in msg
    assert isinstance(info.value, DpsynthError)


def test_error_names_field_by_name(tmp_path):
    raw = json.loads(json.dumps(GOOD))
    raw["fields"][1]["options"] = []
    with pytest.raises(ConfigError, match=r"fields\.organism\.options"):
        load_schema(_write(tmp_path, raw))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_schema(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("fields: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_schema(bad)
    with pytest.raises(ConfigError, match="expected a mapping"):
        schema_from_dict(["a"])


def test_validate_table_names_column_and_row_not_value():
    s = schema_from_dict(GOOD)
    frame = pd.DataFrame({"topic": ["Ecology", "SECRET-VALUE"], "organism": ["Human", "Human"]})
    with pytest.raises(DataError) as info:
        s.validate_table(frame, source="attrs.csv")
    assert "column 'topic', row 1" in str(info.value) and "SECRET" not in str(info.value)
    with pytest.raises(DataError, match="missing attribute column"):
        s.validate_table(frame[["topic"]])
    assert s.validate_row({"topic": "Other", "organism": "Human", "extra": 1}) == {"topic": "Other", "organism": "Human"}
    with pytest.raises(DataError, match="'organism'"):
        s.validate_row({"topic": "Other", "organism": "SECRET"})
    assert s.format_attributes({"topic": "Ecology", "organism": "Human"}) == "- Topic: Ecology\n- organism: Human"


def test_biorxiv_schema_matches_oracle_labels(biorxiv_csv):
    s = builtin_schema("biorxiv")
    from_data = pd.read_csv(biorxiv_csv, usecols=["schema"])["schema"].map(json.loads)
    assert s.num_fields == 8
    labels = pd.DataFrame(from_data.tolist())
    assert sorted(labels.columns) == sorted(s.field_names)
    for f in s.fields:  # the option vocabulary is exactly the labels' vocabulary
        assert set(labels[f.name]) == set(f.options), f.name
    assert [len(f.options) for f in s.fields] == [25, 17, 8, 12, 9, 10, 6, 8]
    s.validate_table(labels, source="biorxiv")


# -- schema design ----------------------------------------------------------------------------
DATA_DESC = "Abstracts of biology preprints."
WORK_DESC = "Train a classifier of the subject category."


class RecordingLLM:
    """A scripted backend that records every prompt it receives (the thing under test is the prompt)."""

    def __init__(self, answers):
        self.answers, self.prompts = list(answers), []

    def generate(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.answers.pop(0)


def test_design_prompt_is_built_from_descriptions_only(biorxiv_csv):
    answer = "Here you go:\n```yaml\n" + AttributeSchema.model_validate(GOOD).to_yaml() + "```"
    llm = RecordingLLM(["fields: nonsense", answer])
    schema = design_schema(llm, DATA_DESC, WORK_DESC, num_fields=2)
    assert schema.field_names == ["topic", "organism"]
    base = build_schema_prompt(DATA_DESC, WORK_DESC, num_fields=2)
    assert llm.prompts[0] == base
    assert llm.prompts[1].startswith(base) and "could not be used" in llm.prompts[1]
    # Strip the fixed template: what is left of each prompt is exactly the two descriptions
    # (and, on retry, the error about the LLM's own answer).
    residue = base.replace(DATA_DESC, "<D>").replace(WORK_DESC, "<W>")
    other = build_schema_prompt("QQDATAQQ", "QQWORKQQ", num_fields=2)
    assert residue == other.replace("QQDATAQQ", "<D>").replace("QQWORKQQ", "<W>")
    assert DATA_DESC in base and WORK_DESC in base
    # No private record text can reach the prompt: no abstract sentence appears in any prompt.
    abstracts = pd.read_csv(biorxiv_csv, usecols=["abstract"], nrows=200)["abstract"]
    for prompt in llm.prompts:
        assert not any(a[:60] in prompt for a in abstracts)
    assert build_schema_prompt("other data", WORK_DESC, num_fields=2) != base


def test_design_gives_up_with_clear_error():
    llm = RecordingLLM(["not yaml: [", "fields: {a: []}", "{}"])
    with pytest.raises(ConfigError, match="no valid schema after 3 attempts"):
        design_schema(llm, DATA_DESC, WORK_DESC, max_attempts=3)
    assert len(llm.prompts) == 3 and RETRY_SUFFIX.split(":")[0].strip() in llm.prompts[2]
    with pytest.raises(ConfigError, match="non-empty"):
        build_schema_prompt("  ", WORK_DESC)


def test_parse_json_answer_and_wrapped():
    s = parse_schema_answer(json.dumps({"schema": GOOD}))
    assert s.num_fields == 2


def test_design_with_real_tiny_model_fails_cleanly():
    """A random-weight model cannot write a schema: the helper must end with ConfigError."""
    from dpsynth_core.actg.schema_design import LocalLMBackend

    backend = LocalLMBackend("tiny-llama", max_new_tokens=24)
    with pytest.raises(ConfigError, match="no valid schema"):
        design_schema(backend, DATA_DESC, WORK_DESC, max_attempts=2)
