"""Which party holds each private record in federated WASP / Aug-PE.

* Party files (``data.party_paths``): each party's records come from its own file.
* One file split non-IID (the paper's setting): per class, party proportions p_c ~ Dirichlet(alpha 1_L)
  and each record of class c goes to party j with probability p_c[j]; alpha = 1 by default, smaller is
  more skewed. ``round_robin`` (record i to party i mod L) is the i.i.d. split, for comparison.

The released (summed) vote does not depend on the assignment: the parties' histograms add up to the
central one and the noise shares to N(0, sigma^2). The split still touches private labels, so it is
drawn from OS entropy (``secure_rng``), never from a config seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from dpsynth_core.errors import ConfigError

PartySplit = Literal["dirichlet", "round_robin"]


def dirichlet_parties(labels: Sequence[str], parties: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Party index of each record (see the module docstring)."""
    if parties < 1 or alpha <= 0:
        raise ConfigError("federated split: parties >= 1 and dirichlet_alpha > 0")
    labels_arr = np.asarray(labels, dtype=object)
    out = np.zeros(len(labels_arr), dtype=np.int64)
    for c in dict.fromkeys(labels_arr.tolist()):  # classes in first-seen order
        idx = np.flatnonzero(labels_arr == c)
        p = rng.dirichlet(np.full(parties, float(alpha)))
        out[idx] = rng.choice(parties, size=len(idx), p=p)
    return out


def assign_parties(labels: Sequence[str], parties: int, split: PartySplit, alpha: float,
                   rng: np.random.Generator) -> np.ndarray:
    if split == "round_robin":
        return np.arange(len(labels)) % parties
    if split == "dirichlet":
        return dirichlet_parties(labels, parties, alpha, rng)
    raise ConfigError(f"federated split: unknown split {split!r}")
