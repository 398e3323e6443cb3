"""Which records PE / WASP may read: a public held-out set and a secretly sampled private set.

* Held-out test set (owner-side evaluation, never released): per class, the ``num_test / C`` rows
  with the smallest content keys (``privacy.randomness.content_keyed_holdout``: a keyed hash of
  the row itself with the public ``data.seed``). A row's key does not depend on other rows, so
  adding or removing one record moves at most one other row in or out of the private pool.
* Private pool: every other row whose label is one of the public ``data.classes``.
* Private working set (``randomness.working_set``): each pool row kept independently, from OS
  entropy, with the public probability ``data.sample_fraction``; without one, the whole pool when
  it has at most ``num_private`` rows, ``num_private / pool size`` on the bundled bioRxiv corpus,
  and a refusal otherwise (docs/privacy.md). A seeded permutation (public seed) would make
  neighbouring files give unrelated subsets.

The size of the drawn set varies (about ``num_private``); it is not logged, and the ledger's delta
uses the configured ``num_private`` (only the opt-in, non-DP ``private_only`` baseline reports it).
"""

from __future__ import annotations

import numpy as np

from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.pe.runner import PrivateData
from dpsynth_core.privacy.randomness import content_rank_keys, working_set


PARTY_COL = "__party__"


def load_frame(cfg: PEConfig):
    """The whole private file (or bioRxiv, or every party's file) and a name for it in messages."""
    d = cfg.data
    if d.source == "biorxiv":
        from dpsynth_core.data import load_biorxiv

        return load_biorxiv(), "bioRxiv"
    from dpsynth_core.data import load_records

    if d.party_paths:  # federated: one file per party, each row keeps its party index
        import pandas as pd

        frames = [load_records(p, text_col=d.text_col, label_col=d.label_col).assign(**{PARTY_COL: j})
                  for j, p in enumerate(d.party_paths)]
        return pd.concat(frames, ignore_index=True), "data.party_paths"
    return load_records(d.path, text_col=d.text_col, label_col=d.label_col), str(d.path)


def split_data(cfg: PEConfig) -> tuple[PrivateData, list[str], list[str], list[str]]:
    """(private, test_texts, test_labels, classes); see the module docstring."""
    d = cfg.data
    frame, where = load_frame(cfg)
    for col in (d.text_col, d.label_col):
        if col not in frame.columns:
            raise DataError(f"{where}: column '{col}' not found")
    if not d.classes:  # the config validator requires them; never fall back to label counts
        raise ConfigError("data.classes is required (public label names)")
    classes = list(d.classes)
    labels = frame[d.label_col].astype(str).to_numpy()
    raw_texts = frame[d.text_col].astype(str).to_numpy()
    if not set(classes) <= set(labels):  # which class, or how many rows, would describe the private file
        raise DataError(f"{where}: column '{d.label_col}': a name in data.classes has no row (names and counts "
                        "are not shown: they describe the private file)")

    keys = content_rank_keys([f"{y}\x00{t}" for y, t in zip(labels, raw_texts)], d.seed)
    per_test = np.bincount(np.arange(d.num_test) % len(classes), minlength=len(classes))
    test_idx: list[int] = []
    for c, n in zip(classes, per_test):
        rows = np.flatnonzero(labels == c)
        if len(rows) <= n:  # the pool must keep rows of every class; neither the class nor a count in the message
            raise DataError(f"{where}: column '{d.label_col}': a class of data.classes has too few rows for its share "
                            "of data.num_test plus one private row (names and counts are not shown: they describe "
                            "the private file)")
        test_idx += rows[np.argsort(keys[rows], kind="stable")[:n]].tolist()
    in_pool = np.isin(labels, classes)
    in_pool[test_idx] = False
    pool = np.flatnonzero(in_pool)
    chosen = pool[working_set(len(pool), d.num_private, d.sample_fraction, public_corpus=d.source == "biorxiv",
                              field="data.n_records")]

    texts = [t[: d.max_chars] for t in raw_texts]
    parties = frame[PARTY_COL].to_numpy()[chosen].tolist() if PARTY_COL in frame.columns else None
    private = PrivateData([texts[i] for i in chosen], [str(labels[i]) for i in chosen], parties)
    return private, [texts[i] for i in test_idx], [str(labels[i]) for i in test_idx], classes
