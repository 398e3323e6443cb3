"""``generation.calibrate.stratify: auto``: which columns generation fixes per row, chosen from DP outputs.

The enforced sensitive attribute(s) are stratified on; with one, so is its strongest proxy: the
categorical column (not the target, not a sensitive attribute of the schema) most associated with it in
the run's released DP (column, A) 2-way tables (``pairs_with_sensitive``). Reading released tables is
post-processing: no further budget, nothing private. Ties go to the earlier column of the run, so the
choice depends on the tables and the schema's column order only, never on a column's name.

The association is a Cramer's V that knows the noise (sigma from the ledger): each cell's squared residual
is weighted by its variance, expected count + sigma^2, and the statistic's value under independence is
taken off. Plain Cramer's V grows with the noise in every cell, so a column with many sparse cells wins:
on simulated Adult releases it picked occupation over marital status about half the time
(docs/results/dpfair_strata.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

AUTO = "auto"


def noise_aware_cramers_v(counts: np.ndarray, sigma: float, *, debias: bool = True) -> float:
    """Cramer's V of a released 2-way table with noise sd ``sigma`` per cell, each cell's squared residual
    weighted by its variance (expected count + sigma^2) rather than its expected count alone, and (``debias``)
    the statistic's expectation under independence, (r - 1)(c - 1), taken off; >= 0."""
    table = np.maximum(np.asarray(counts, float), 0.0)
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    n = table.sum()
    if n <= 0 or min(table.shape) < 2:
        return 0.0
    expected = np.outer(table.sum(1), table.sum(0)) / n
    chi2 = float(((table - expected) ** 2 / (expected + sigma ** 2)).sum())
    chi2 -= (table.shape[0] - 1) * (table.shape[1] - 1) if debias else 0
    return float(np.sqrt(max(chi2, 0.0) / n / (min(table.shape) - 1)))


def pair_table(marginals: dict, column: str, attribute: str) -> np.ndarray | None:
    """The released (column, attribute) table as a column x attribute array, or None if not released."""
    pairs = marginals.get("pairs") or {}
    for key, transpose in ((f"{column}|{attribute}", False), (f"{attribute}|{column}", True)):
        entry = pairs.get(key)
        if entry is not None and "edges" not in entry:
            first, second = (len(marginals[c].get("values") or []) for c in entry["columns"])
            table = np.asarray(entry["counts"], float).reshape(first, second)
            return table.T if transpose else table
    return None


def choose_strata(marginals: dict, attributes: Sequence[str], candidates: Sequence[str], sigma: float) -> tuple[str, ...]:
    """The stratified columns: the first two enforced attributes, or one and its strongest proxy among
    ``candidates`` (categorical columns in the run's order) by :func:`noise_corrected_cramers_v`."""
    if len(attributes) != 1:
        return tuple(attributes[:2])
    attribute = attributes[0]
    scores = []
    for column in candidates:
        table = pair_table(marginals, column, attribute)
        if table is not None:
            scores.append((noise_aware_cramers_v(table, sigma), column))
    best = max(scores, key=lambda s: s[0], default=(0.0, None))  # max keeps the first of equal scores
    return (attribute, best[1]) if best[0] > 0 else (attribute,)
