"""A classifier's fairness gaps on the real test rows, counted only over groups with enough rows.

Demographic-parity gap: max - min over groups of P(prediction = 1 | group). Equalized-odds gap: for each true label
y, max - min over groups of P(prediction = 1 | group, Y = y) (the true- and false-positive rates), the larger of the
two. Only groups with at least ``MIN_GROUP_ROWS`` test rows enter; the others are returned by name with their row
counts as "not enough data" (a rate from a handful of rows would decide the gap alone). A gap needs two such groups;
a rate cell with no rows (a counted group without any row of one label) has no rate and is left out of that label's
spread. Owner-side evaluation on real rows: aggregate figures for the data owner, not a release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from dpsynth_core.data.sample_sizes import MIN_GROUP_ROWS, NOT_ENOUGH_DATA
from dpsynth_core.errors import DataError


@dataclass(frozen=True)
class GroupGaps:
    dp: float | None  # None: fewer than two groups with enough rows
    eo: float | None
    rows: dict[str, int]  # the groups counted: their test rows
    not_enough_data: dict[str, int]  # the groups left out: their test rows
    min_rows: int = MIN_GROUP_ROWS

    def as_dict(self) -> dict:
        return {**asdict(self), "status": NOT_ENOUGH_DATA if self.dp is None else "ok"}


def _spread(rates: list[float]) -> float | None:
    return float(max(rates) - min(rates)) if len(rates) >= 2 else None


def group_gaps(truth: Sequence[int], predicted: Sequence[int], groups: Sequence,
               min_rows: int = MIN_GROUP_ROWS) -> GroupGaps:
    """The gaps of binary predictions ``predicted`` (0/1) against the true labels ``truth`` (0/1) over ``groups``
    (one group label per test row)."""
    y, hat = np.asarray(truth).astype(int), np.asarray(predicted).astype(int)
    group = pd.Series(np.asarray(groups)).astype(str).to_numpy()
    if not len(y) == len(hat) == len(group):
        raise DataError(f"group gaps: {len(y)} labels, {len(hat)} predictions and {len(group)} groups differ in length")
    if not set(np.unique(y)) | set(np.unique(hat)) <= {0, 1}:
        raise DataError("group gaps: labels and predictions must be 0 or 1 (a binary target)")
    counts = pd.Series(group).value_counts()
    counted = {str(g): int(n) for g, n in counts.items() if n >= min_rows}
    left_out = {str(g): int(n) for g, n in counts.items() if n < min_rows}
    dp_rates = [float(hat[group == g].mean()) for g in counted]
    eo_spreads = []
    for label in (0, 1):
        cells = [hat[(group == g) & (y == label)] for g in counted]
        eo_spreads.append(_spread([float(cell.mean()) for cell in cells if len(cell)]))
    eo = None if len(counted) < 2 or all(s is None for s in eo_spreads) else max(s for s in eo_spreads if s is not None)
    return GroupGaps(dp=_spread(dp_rates), eo=eo, rows=dict(sorted(counted.items())),
                     not_enough_data=dict(sorted(left_out.items())), min_rows=min_rows)
