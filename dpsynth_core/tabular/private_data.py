"""The private table of a tabular run: read from its source, a secret working subset, validated.

Every process that needs the private rows (the driver's DP stages, the Ray worker that trains,
the owner-side evaluation) calls :func:`load_private` with the public config and the run
directory: nothing private travels through task arguments, the object store or configs.

The working set (``randomness.working_set``). Each row is kept independently, from OS entropy, with
the public probability ``data.sample_fraction``; without one, the whole file when it has at most
``data.train_rows = m`` rows, m / n on the bundled Adult file (a published size), and a refusal
otherwise: a rate set by the private file's size would cost more than the ledger states
(docs/privacy.md). A seeded ``sample`` would make neighbouring files give unrelated subsets.

Resume. The subset is drawn once, at the first stage, and its row indices are kept in owner-only
run state (``owner_only/private_subset.json``, mode 0600) with a fingerprint of the file, so a
resumed run (or a later stage in another process) trains on the same rows that its earlier DP
stages measured. These indices are secret randomness -- publishing them would reveal who was left
out -- and are never part of a release. If the state is lost after a DP stage ran, or the file
changed, the run refuses to continue instead of silently drawing another subset.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.tabular.config import TableRunConfig
from dpsynth_core.tabular.schema import TableSchema

OWNER_DIR = "owner_only"
SUBSET_FILE = "private_subset.json"


def source_name(cfg: TableRunConfig) -> str:
    return cfg.data.source if cfg.data.source != "adult" else "adult (train)"


def _read_file(cfg: TableRunConfig) -> pd.DataFrame:
    if cfg.data.source == "adult":
        from dpsynth_core.data import load_adult

        return load_adult("train").reset_index(drop=True)
    from dpsynth_core.data import load_records

    return load_records(cfg.data.source).reset_index(drop=True)


def _holdout_index(frame: pd.DataFrame, cfg: TableRunConfig) -> np.ndarray:
    """Rows held out as the test set (``data.holdout_rows``): content-keyed, so a row's side depends on
    that row alone and neighbouring files keep neighbouring private pools."""
    from dpsynth_core.privacy.randomness import content_keyed_holdout

    contents = frame.astype(str).agg("\x1f".join, axis=1).tolist()
    return content_keyed_holdout(contents, min(int(cfg.data.holdout_rows or 0), len(frame) - 1), cfg.data.seed)


def read_source(cfg: TableRunConfig) -> pd.DataFrame:
    """The private file as read from its source (index = 0-based data row), without the held-out
    test rows when ``data.holdout_rows`` splits a single file."""
    frame = _read_file(cfg)
    if cfg.data.holdout_rows:
        frame = frame.drop(index=frame.index[_holdout_index(frame, cfg)])
    return frame


def load_test(cfg: TableRunConfig) -> pd.DataFrame:
    """The real test table for the owner-side evaluation (a seeded subsample: not a release)."""
    if cfg.data.source == "adult":
        from dpsynth_core.data import load_adult

        test = load_adult("test")
    else:
        from dpsynth_core.data import load_records

        if cfg.data.holdout_rows:
            frame = _read_file(cfg)
            test = frame.iloc[_holdout_index(frame, cfg)]
        elif not cfg.data.test_path:
            raise ConfigError("field 'data.test_path': needed when data.source is a file "
                              "(or set data.holdout_rows to hold out part of the file)")
        else:
            test = load_records(cfg.data.test_path)
    if cfg.data.test_rows and cfg.data.test_rows < len(test):
        test = test.sample(cfg.data.test_rows, random_state=cfg.data.seed + 1)
    return test.reset_index(drop=True)


def expected_rows(cfg: TableRunConfig, n: int) -> int:
    """m, the working set's size as the accounting and the ledger state it (never the drawn size):
    ``train_rows`` (at most the bundled Adult file's published size), else the whole file, whose
    size DP-SGD's sampling rate q = B / n states anyway."""
    if not cfg.data.train_rows:
        return n
    return min(cfg.data.train_rows, n) if cfg.data.source == "adult" else cfg.data.train_rows


def public_size(cfg: TableRunConfig) -> int:
    """The working set's size as the accounting may state it (m, not the drawn size)."""
    return expected_rows(cfg, len(read_source(cfg)))


def resolve_delta(cfg: TableRunConfig, n: int) -> float:
    """delta from the config (else min(1e-5, m^-1.1)), checked to be below 1/m (m: ``expected_rows``)."""
    from dpsynth_core.privacy import check_delta_for_size, default_delta

    m = expected_rows(cfg, n)
    return check_delta_for_size(cfg.delta if cfg.delta is not None else default_delta(m), m, "privacy.delta")


def _fingerprint(frame: pd.DataFrame) -> str:
    digest = hashlib.sha256(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return digest.hexdigest()


def subset_state(root: Path) -> Path:
    return Path(root) / OWNER_DIR / SUBSET_FILE


def draw_subset(cfg: TableRunConfig, root: Path, frame: pd.DataFrame) -> np.ndarray:
    """Draw the secret working subset and keep it in owner-only state (first stage only)."""
    from dpsynth_core.privacy.randomness import working_set

    keep = working_set(len(frame), cfg.data.train_rows or len(frame), cfg.data.sample_fraction,
                       public_corpus=cfg.data.source == "adult", field="data.n_records")
    state = subset_state(root)
    state.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state.parent, 0o700)
    atomic_write_text(state, json.dumps({"fingerprint": _fingerprint(frame), "rows": keep.tolist()}))
    os.chmod(state, 0o600)
    return keep


def stored_subset(root: Path, frame: pd.DataFrame) -> np.ndarray:
    """The subset drawn at the run's first stage; refuse if it is lost or the file changed."""
    state = subset_state(root)
    if not state.is_file():
        raise ConfigError(f"{root}: the secret private subset of this run ({OWNER_DIR}/{SUBSET_FILE}) is missing, "
                          "so its DP stages cannot be continued on the same rows; re-run with --fresh")
    saved = json.loads(state.read_text())
    if saved["fingerprint"] != _fingerprint(frame):
        raise DataError(f"{root}: the private data file changed since this run started; re-run with --fresh")
    return np.asarray(saved["rows"], dtype=int)


def private_rows(cfg: TableRunConfig, root: Path, *, first_stage: bool = False) -> pd.DataFrame:
    """The run's working set as read (not validated; index = 0-based file row).

    ``first_stage``: draw the subset if this run has none yet (only the first DP stage may).
    """
    frame = read_source(cfg)
    if first_stage and not subset_state(root).is_file():
        rows = draw_subset(cfg, root, frame)
    else:
        rows = stored_subset(root, frame)
    return frame.iloc[rows]


def load_private(cfg: TableRunConfig, root: Path, schema: TableSchema) -> pd.DataFrame:
    """The run's working set validated against ``schema`` (a resolved one); errors name file rows."""
    return schema.validate_frame(private_rows(cfg, root), source_name(cfg))


def privacy_plan(cfg: TableRunConfig, schema: TableSchema):
    """The run loop's pre-flight of a tabular run: :func:`preflight`, then the ledger's public settings."""
    from dpsynth_core.runs.contract import PrivacyPlan

    rows, _ = preflight(cfg, schema)
    return PrivacyPlan(cfg.name, cfg.epsilon, cfg.delta, expected_rows(cfg, rows))


def preflight(cfg: TableRunConfig, schema: TableSchema) -> tuple[int, float]:
    """Before the run directory exists: the whole file against the public schema, and delta.

    Returns (rows in the file, delta). The row count stays in this process (never logged).
    """
    frame = read_source(cfg)
    if len(frame) < 2:
        raise DataError(f"{source_name(cfg)}: too few rows for a private table")
    schema.preflight(frame, source_name(cfg))
    return len(frame), resolve_delta(cfg, len(frame))
