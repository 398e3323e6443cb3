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

from typing import NamedTuple

import pandas as pd

from dpsynth_core.errors import DataError
from dpsynth_core.privacy.randomness import content_keyed_holdout, working_set


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
