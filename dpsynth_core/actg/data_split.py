"""Which records ACTG may read: a public held-out evaluation set and a secretly sampled private set.

* Held-out evaluation texts (owner-side, never released): the ``data.n_eval`` rows with the
  smallest content keys (``privacy.randomness.content_keyed_holdout``: a keyed hash of the text
  with the public ``data.seed``). A row's key depends on that row only, so adding or removing one
  record moves at most one other row between the held-out set and the private pool.
* Public labeled rows: a separate file, ``data.public_path``, that the data owner declares public
  (like the paper's public labeled data); they train the supervised reward model
  (``actg.supervised``). Rows are never carved out of the private file: such rows would be
  private (which rows are carved follows from the public config, and one added record shifts
  them). The private file is refused if it shares a record with the public one.
* Private pool: every row of ``data.path`` that is not held out.
* Private working set (``randomness.working_set``): each pool row kept independently, from OS
  entropy, with the public probability ``data.sample_fraction``; without one, the whole pool when
  it has at most ``n_records`` rows, ``n_records / pool size`` on the bundled bioRxiv corpus (a
  published size), and a refusal otherwise (a rate set by the private file's size would cost more
  than the ledger states). The accounting states ``n_records``, never the drawn size.

Each call draws a fresh private set; a resumed ``private`` stage may see a different one, which is
still valid: each DP mechanism is charged in full and each is DP with respect to the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NamedTuple

import pandas as pd
from pydantic import Field, model_validator

from dpsynth_core.config.record_level import RecordLevelData
from dpsynth_core.config import RECORDS_CAP, TEXT_CHARS_CAP, cap
from dpsynth_core.errors import DataError
from dpsynth_core.privacy.randomness import content_keyed_holdout, working_set


class DataSettings(RecordLevelData):
    """The private corpus. ``path: null`` = the bioRxiv set from ``data_dir()``."""

    path: Path | None = None
    text_col: str = "abstract"
    label_col: str | None = "category"  # null: a corpus without labels (ACTG's attributes come from the schema)
    n_records: Annotated[int, RECORDS_CAP] = Field(300, ge=4)     # public expected size m of the private working set
    # public share of the pool's rows drawn into the working set (secret Bernoulli draws); needed when
    # data.path has more rows than n_records (a rate n_records / rows would depend on the file's size)
    sample_fraction: float | None = Field(None, gt=0, le=1)
    n_eval: Annotated[int, cap(100_000, 'held-out texts embedded for evaluation')] = Field(200, ge=2)        # held-out real texts for evaluation (owner-side, disjoint)
    max_chars: Annotated[int, TEXT_CHARS_CAP] = Field(1500, ge=50)   # training targets are cut here (the model sees max_seq_len anyway)
    seed: int = 0                         # held-out split only (public); never the private selection
    # a separate file the owner declares public and labeled (same columns), disjoint from `path`: trains the reward
    public_path: Path | None = None
    n_public: Annotated[int, RECORDS_CAP] = Field(0, ge=0)        # rows of public_path to use (0: all)
    text_description: str = "bioRxiv preprint abstract"

    @model_validator(mode="after")
    def _public_rows_from_a_public_file(self) -> DataSettings:
        if self.n_public and self.public_path is None:  # the old meaning: rows carved out of the private file
            raise ValueError("data.n_public without data.public_path: rows taken from the private file are private "
                             "(anyone with the config can tell which were taken); give a separate file declared "
                             "public in data.public_path")
        return self



def load_frame(cfg):
    from dpsynth_core.data import load_biorxiv, load_records

    d = cfg.data
    if d.path is None:
        return load_biorxiv()
    return load_records(cfg.resolved(d.path), text_col=d.text_col, label_col=d.label_col)


class PrivateSplit(NamedTuple):
    private: pd.DataFrame  # the secret working set (its size is private)
    held_out: pd.DataFrame  # owner-side evaluation rows
    public_size: int  # what the accounting may state: n_records, never the drawn size


def load_private_split(cfg) -> PrivateSplit:
    """The private working set, the held-out evaluation frame (disjoint) and the set's public
    expected size; see the module docstring."""
    import numpy as np

    d = cfg.data
    where = d.path or "biorxiv"
    frame = load_frame(cfg)
    if d.text_col not in frame.columns:
        raise DataError(f"{where}: column '{d.text_col}' not found (data.text_col)")
    texts = frame[d.text_col].astype(str).tolist()
    if len(texts) <= d.n_eval:  # no row count in the message: the file's size is private
        raise DataError(f"{where}: not enough rows for data.n_eval held-out rows plus a private set")
    if d.public_path is not None:
        _check_disjoint(load_public_labeled(cfg)[d.text_col].astype(str).tolist(), set(texts), d)
    held = content_keyed_holdout(texts, d.n_eval, d.seed)
    pool = np.setdiff1d(np.arange(len(texts)), held)
    private = pool[working_set(len(pool), d.n_records, d.sample_fraction, public_corpus=d.path is None,
                               field="data.n_records")]
    return PrivateSplit(frame.iloc[private].reset_index(drop=True), frame.iloc[held].reset_index(drop=True),
                        d.n_records)


def _check_disjoint(public_texts: list[str], private_texts: set[str], d) -> None:
    """A declared-public file must hold no record of the private file (its rows train the reward
    without noise). The error names the public file's row, never a text or a count."""
    for row, text in enumerate(public_texts, start=1):
        if text in private_texts:
            raise DataError(f"{d.public_path}: column '{d.text_col}', row {row}: this record is also in data.path; "
                            "a file declared public (data.public_path) must be disjoint from the private file")


def load_public_labeled(cfg) -> pd.DataFrame:
    """The rows of the declared-public file ``data.public_path`` (the first ``n_public`` when set);
    empty without one. Only these may train the reward model."""
    from dpsynth_core.data import load_records

    d = cfg.data
    if d.public_path is None:
        return pd.DataFrame()
    frame = load_records(cfg.resolved(d.public_path), text_col=d.text_col, label_col=d.label_col)
    return frame.head(d.n_public) if d.n_public else frame
