"""The attribute schema: K categorical fields, each with an enumerated list of options.

A schema is *public* information: it is written by a person or proposed by an LLM from a
description of the data and of the downstream workload (``schema_design``), never read off the
private records. Every later stage (extraction, AIM, the generator's prompts, IFAcc) uses the
option lists from here, so no category is ever learnt from private data for free.

    schema = load_schema("configs/schemas/biorxiv.yaml")
    schema.field_names            # ["primary_research_area", ...]
    schema.options("sample_size") # ["Not Specified / Not Applicable", ...]
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from dpsynth_core.config import format_validation_error
from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.runs.files import atomic_write_text

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
MAX_OPTION_CHARS = 200


class AttributeField(BaseModel):
    """One categorical attribute: a snake_case ``name``, a human ``description`` and its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    options: list[str]

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _NAME_RE.match(name):
            raise ValueError(
                f"bad field name {name!r}: use letters, digits and '_' and start with a letter"
            )
        return name

    @field_validator("options")
    @classmethod
    def _check_options(cls, options: list[str]) -> list[str]:
        if len(options) == 0:
            raise ValueError("options must not be empty")
        cleaned = []
        for i, opt in enumerate(options):
            if not isinstance(opt, str) or not opt.strip():
                raise ValueError(f"option {i} is empty")
            if len(opt) > MAX_OPTION_CHARS:
                raise ValueError(f"option {i} is longer than {MAX_OPTION_CHARS} characters")
            cleaned.append(opt.strip())
        seen: set[str] = set()
        for opt in cleaned:
            key = opt.casefold()
            if key in seen:
                raise ValueError(f"duplicate option {opt!r}")
            seen.add(key)
        return cleaned


class AttributeSchema(BaseModel):
    """An ordered list of :class:`AttributeField` (the K attributes of ACTG)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "schema"
    description: str = ""
    fields: list[AttributeField]

    @model_validator(mode="after")
    def _check_fields(self) -> "AttributeSchema":
        if not self.fields:
            raise ValueError("a schema needs at least one field")
        seen: set[str] = set()
        for f in self.fields:
            if f.name in seen:
                raise ValueError(f"duplicate field {f.name!r}")
            seen.add(f.name)
        return self

    # -- lookups ---------------------------------------------------------------------------
    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def num_fields(self) -> int:
        return len(self.fields)

    def field(self, name: str) -> AttributeField:
        for f in self.fields:
            if f.name == name:
                return f
        raise ConfigError(f"schema '{self.name}' has no field '{name}' (fields: {self.field_names})")

    def options(self, name: str) -> list[str]:
        return list(self.field(name).options)

    def categories(self) -> dict[str, list[str]]:
        """``{field: options}``: the public domain of every attribute (for AIM and d_JS)."""
        return {f.name: list(f.options) for f in self.fields}

    # -- validation of attribute rows ------------------------------------------------------
    def validate_row(self, row: dict[str, Any], *, where: str = "row") -> dict[str, str]:
        """Return ``row`` restricted to the schema's fields; DataError (naming the field, never
        the value) if a field is missing or holds a value that is not one of its options."""
        out = {}
        for f in self.fields:
            if f.name not in row:
                raise DataError(f"{where}: missing attribute '{f.name}'")
            value = row[f.name]
            if value not in f.options:
                raise DataError(f"{where}: attribute '{f.name}' is not one of its {len(f.options)} options")
            out[f.name] = value
        return out

    def validate_table(self, frame, *, source: str = "table") -> None:
        """Check a DataFrame of attributes: every field a column, every value an option.
        Errors name the source, the column and the row, never the value."""
        missing = [n for n in self.field_names if n not in frame.columns]
        if missing:
            raise DataError(f"{source}: missing attribute column(s) {missing}")
        for f in self.fields:
            allowed = set(f.options)
            bad = ~frame[f.name].isin(allowed)
            if bad.any():
                row = int(bad.to_numpy().nonzero()[0][0])
                raise DataError(
                    f"{source}: column '{f.name}', row {row}: value is not one of the "
                    f"{len(f.options)} schema options ({int(bad.sum())} such rows)"
                )

    # -- rendering ---------------------------------------------------------------------------
    def format_attributes(self, row: dict[str, str]) -> str:
        """One attribute per line, ``- description: value``: the conditioning text for prompts."""
        lines = []
        for f in self.fields:
            label = f.description or f.name.replace("_", " ")
            lines.append(f"- {label}: {row[f.name]}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=100)

    def save(self, path: str | Path) -> Path:
        """Write YAML (or JSON if the suffix is .json) atomically."""
        path = Path(path)
        text = json.dumps(self.to_dict(), indent=2) if path.suffix == ".json" else self.to_yaml()
        atomic_write_text(path, text)
        return path


def schema_from_dict(raw: Any, *, source: str = "schema") -> AttributeSchema:
    """Validate a parsed mapping into a schema; ConfigError names ``source`` and the field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'fields' list, got {type(raw).__name__}")
    raw = dict(raw)
    # Also accept the compact form {fields: {name: [options]}} or {fields: {name: {description, options}}}.
    fields = raw.get("fields")
    if isinstance(fields, dict):
        expanded = []
        for name, spec in fields.items():
            if isinstance(spec, list):
                expanded.append({"name": name, "options": spec})
            elif isinstance(spec, dict):
                expanded.append({"name": name, **spec})
            else:
                raise ConfigError(f"{source}: field '{name}': expected a list of options or a mapping")
        raw["fields"] = expanded
    try:
        return AttributeSchema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe_errors(exc, raw)}") from None


def _describe_errors(exc: ValidationError, raw: dict) -> str:
    """Like format_validation_error, but names the field by its ``name`` instead of its index."""
    msg = format_validation_error(exc)
    fields = raw.get("fields")
    if isinstance(fields, list):
        def repl(m: re.Match) -> str:
            i = int(m.group(1))
            if i < len(fields) and isinstance(fields[i], dict) and "name" in fields[i]:
                return f"fields.{fields[i]['name']}"
            return m.group(0)
        msg = re.sub(r"fields\.(\d+)", repl, msg)
    return msg


def load_schema(path: str | Path) -> AttributeSchema:
    """Load a schema from YAML or JSON; ConfigError names the file and the offending field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: schema file not found")
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    return schema_from_dict(raw, source=str(path))


BUILTIN_SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "configs" / "schemas"


def builtin_schema(name: str = "biorxiv") -> AttributeSchema:
    """A schema shipped in ``configs/schemas/<name>.yaml``."""
    return load_schema(BUILTIN_SCHEMAS_DIR / f"{name}.yaml")
