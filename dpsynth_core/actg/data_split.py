"""Which records ACTG may read: a public held-out evaluation set and a secretly sampled private set.

* Held-out evaluation texts (owner-side, never released): the ``data.n_eval`` rows with the
  smallest content keys (``privacy.randomness.content_keyed_holdout``: a keyed hash of the text
  with the public ``data.seed``). A row's key depends on that row only, so adding or removing one
  record moves at most one other row between the held-out set and the private pool.
* Public labeled rows (``data.n_public``, default 0): the next ``n_public`` rows by content key.
  The data owner declares them public (like the paper's public labeled data): they train the
  supervised reward model (``actg.supervised``) and are removed from the private pool, so the
  guarantee covers the pool only and no DP mechanism ever reads them.
* Private pool: every other row.
* Private working set: each pool row kept independently with probability ``n_records / pool
  size``, from OS entropy (``bernoulli_subsample``); the whole pool if it has at most
  ``n_records`` rows. Poisson sampling never increases epsilon, so the ledger's guarantee holds
  for the user's file (its pool), not only for a drawn sample.

Each call draws a fresh private set; a resumed ``private`` stage may see a different one, which is
still valid: each DP mechanism is charged in full and each is DP with respect to the file.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from dpsynth_core.errors import DataError
from dpsynth_core.privacy.randomness import bernoulli_subsample, content_keyed_holdout


def load_frame(cfg):
    from dpsynth_core.data import load_biorxiv, load_records

    d = cfg.data
    if d.path is None:
        return load_biorxiv()
    return load_records(cfg.resolved(d.path), text_col=d.text_col, label_col=d.label_col)


class PrivateSplit(NamedTuple):
    private: pd.DataFrame  # the secret working set (its size is private)
    held_out: pd.DataFrame  # owner-side evaluation rows
    public_size: int  # what the accounting may state: min(n_records, pool size), never the drawn size


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
    if len(texts) <= d.n_eval + getattr(d, "n_public", 0):  # no row count in the message: the file's size is private
        raise DataError(f"{where}: not enough rows for data.n_eval held-out rows plus a private set")
    held, public = _held_and_public(texts, d)
    pool = np.setdiff1d(np.arange(len(texts)), np.concatenate([held, public]))
    private = pool[bernoulli_subsample(len(pool), d.n_records)]
    return PrivateSplit(frame.iloc[private].reset_index(drop=True), frame.iloc[held].reset_index(drop=True),
                        min(d.n_records, len(pool)))


def _held_and_public(texts: list[str], d) -> tuple:
    """Held-out rows (smallest content keys) and public labeled rows (the next ``n_public``)."""
    import numpy as np

    n_public = getattr(d, "n_public", 0)
    first = content_keyed_holdout(texts, d.n_eval + n_public, d.seed)
    held = content_keyed_holdout(texts, d.n_eval, d.seed)
    return held, np.setdiff1d(first, held)


def load_public_labeled(cfg) -> pd.DataFrame:
    """The public labeled rows (``data.n_public``), disjoint from the held-out set and the private
    pool; empty when ``n_public`` is 0. Only these may train the reward model."""
    d = cfg.data
    frame = load_frame(cfg)
    texts = frame[d.text_col].astype(str).tolist()
    if len(texts) <= d.n_eval + d.n_public:
        raise DataError(f"{d.path or 'biorxiv'}: not enough rows for data.n_eval + data.n_public plus a private set")
    _, public = _held_and_public(texts, d)
    return frame.iloc[public].reset_index(drop=True)
