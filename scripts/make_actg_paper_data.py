"""Make the two data files of configs/actg_paper*.yaml from the shared bioRxiv corpus.

    python scripts/make_actg_paper_data.py [OUT_DIR]   # default data/actg_paper (git-ignored)

Writes public_labeled.csv (300 rows declared public: they train ACTG's supervised reward) and
private.csv (the other rows: the private file), disjoint. See dpsynth_core/actg/paper_data.py.
"""

import sys
from pathlib import Path

from dpsynth_core.actg.paper_data import PAPER_DATA_DIR, write_paper_split

if __name__ == "__main__":
    public, private = write_paper_split(Path(sys.argv[1]) if len(sys.argv) > 1 else PAPER_DATA_DIR)
    print(f"declared public (data.public_path): {public}\nprivate (data.path): {private}")
