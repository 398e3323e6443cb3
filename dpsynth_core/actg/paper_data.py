"""The two files of the bundled ``configs/actg_paper*.yaml``, made from the shared bioRxiv corpus.

    python scripts/make_actg_paper_data.py     # -> data/actg_paper/public_labeled.csv, private.csv

ACTG's supervised reward is trained on labeled rows the data owner declares public
(``data.public_path``), never on rows of the private file. For the paper's setting, the shared
corpus (``biorxiv/biorxiv_1500.csv`` in the data directory) is cut once, by a fixed rule, into
``public_labeled.csv`` (300 rows: the smallest keyed hashes of their DOIs) and ``private.csv``
(every other row), the configs' ``data.public_path`` and ``data.path``. No text is in both files.
The corpus is public, so a fixed rule is fine here; with real private data the public file must
come from elsewhere. Neither file is committed (``data/`` is git-ignored): run the script first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpsynth_core.runs.files import atomic_write_text

PAPER_DATA_DIR = Path("data") / "actg_paper"
PUBLIC_FILE, PRIVATE_FILE = "public_labeled.csv", "private.csv"
PUBLIC_ROWS = 300
_SPLIT_KEY = 35  # the hash key of the fixed rule (public: anyone can rebuild both files)


def write_paper_split(out_dir: Path = PAPER_DATA_DIR, public_rows: int = PUBLIC_ROWS) -> tuple[Path, Path]:
    """Write the declared-public and the private file; returns their paths (public, private)."""
    from dpsynth_core.data import load_biorxiv
    from dpsynth_core.privacy.randomness import content_rank_keys

    corpus = load_biorxiv()
    order = np.argsort(content_rank_keys(corpus["doi"].astype(str).tolist(), _SPLIT_KEY), kind="stable")
    public = corpus.iloc[np.sort(order[:public_rows])]
    private = corpus.iloc[np.sort(order[public_rows:])]
    public = public[~public["abstract"].isin(set(private["abstract"]))]  # a repeated text stays private only
    out_dir = Path(out_dir)
    paths = out_dir / PUBLIC_FILE, out_dir / PRIVATE_FILE
    for path, frame in zip(paths, (public, private)):
        atomic_write_text(path, frame.to_csv(index=False))
    return paths
