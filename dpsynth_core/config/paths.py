"""Input paths in a config file are looked up next to the config file first.

``data.path: my_corpus.csv`` in ``~/project/wasp.yaml`` reads ``~/project/my_corpus.csv`` whatever the
current directory. A relative input path that does not exist next to the config keeps its old
meaning (the current directory, then the data directory or this repository, as each loader did
before), so the bundled configs (``schema_path: configs/schemas/adult.yaml``) work from the
repository root and from any copy of a config.

Run directories (``output_dir``) are not rewritten: a relative run directory stays relative to the
current directory, and a submitted job refuses it (it would be written into the job's temporary
copy of the project, see ``runs.storage.require_durable_run_dir``).
"""

from __future__ import annotations

from pathlib import Path

# keys (at any depth) that name an input file or folder
INPUT_PATH_KEYS = frozenset({"path", "test_path", "public_path", "party_paths", "schema_path", "prompts"})


def _next_to_config(value, config_dir: Path):
    if isinstance(value, list):
        return [_next_to_config(v, config_dir) for v in value]
    if not isinstance(value, str) or not value or "://" in value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return value
    candidate = config_dir / path
    return str(candidate) if candidate.exists() else value


def resolve_input_paths(raw, config_dir: Path):
    """A copy of the parsed config ``raw`` with relative input paths that exist next to the config
    file made absolute (``config_dir`` = the config file's directory)."""
    config_dir = Path(config_dir).resolve()
    if isinstance(raw, dict):
        return {k: _next_to_config(v, config_dir) if k in INPUT_PATH_KEYS and not isinstance(v, dict)
                else resolve_input_paths(v, config_dir) for k, v in raw.items()}
    if isinstance(raw, list):
        return [resolve_input_paths(v, config_dir) for v in raw]
    return raw
