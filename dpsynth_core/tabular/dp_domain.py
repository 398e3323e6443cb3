"""DP estimation of what the public schema leaves open: numeric bounds, category lists, P(A, Y).

Every function here touches private data through one Gaussian mechanism and records it in the
ledger *before* returning (``ledger.check`` before reading the data, ``ledger.record`` after).

Neighbouring data sets differ by adding or removing one record (the same relation as Poisson
DP-SGD). One record adds 1 to exactly one cell of each histogram it is counted in, so each
histogram has L2 sensitivity 1 and ``k`` histograms are ``k`` compositions of the Gaussian
mechanism with ``noise_multiplier = sigma``.

Every histogram goes through the project's one Gaussian-histogram mechanism
(``privacy.gaussian_histogram``): noise from OS entropy (a config seed is public, and noise drawn
from it can be rebuilt and subtracted), counts released as integers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.gaussian_histogram import histogram_event, noisy_histogram
from dpsynth_core.privacy.reference_runs import is_infinite
from dpsynth_core.tabular.schema import ColumnSpec, TableSchema

NUM_CANDIDATE_BINS = 64
NO_NOISE_TABLES = "exact counts, no Gaussian noise (epsilon = inf reference run)"


def _mechanism(epsilon: float, ledger, histograms: int, stage: str):
    """(sigma, event) of ``histograms`` Gaussian releases, checked against the budget before the data is read.

    epsilon = inf (a reference run, ``not_private: true``): (0, None), exact counts, the stage marked
    "not private" and nothing recorded (no finite epsilon exists to record)."""
    if is_infinite(epsilon):
        ledger.mark_not_private(stage, NO_NOISE_TABLES)
        return 0.0, None
    sigma, event = histogram_event(epsilon, ledger.delta, histograms)
    ledger.check(stage, event)  # before touching the data
    return sigma, event


def _release(counts, sigma: float) -> np.ndarray:
    """The counts as released: rounded Gaussian noise added, or exact (sigma 0: a reference run)."""
    return noisy_histogram(counts, sigma, integer_counts=True) if sigma > 0 else np.asarray(counts, dtype=np.float64)


def _record(ledger, stage: str, event, details: dict) -> None:
    if event is not None:
        ledger.record(stage, event, details=details)


def _threshold(sigma: float) -> float:
    # A cell empty in the data passes with probability ~1e-3 per cell.
    return 3.0 * sigma


def estimate_domain(
    schema: TableSchema,
    df: pd.DataFrame,
    *,
    epsilon: float,
    ledger,
    stage: str = "dp_domain",
) -> TableSchema:
    """Resolve every ``domain: dp`` column of ``schema`` with noisy histograms over public candidates.

    Numeric columns: ``NUM_CANDIDATE_BINS`` equal-width bins over [candidate_min, candidate_max]; the
    bounds are the outer edges of the first/last bin whose noisy count clears 3 sigma. Categorical
    columns: the candidate categories whose noisy count clears 3 sigma (at least the noisy argmax).
    Returns the schema with those columns resolved; a schema with none is returned unchanged and
    costs nothing.
    """
    todo = [c for c in schema.columns if c.domain == "dp" and not c.resolved()]
    if not todo:
        return schema
    if epsilon <= 0:
        raise ConfigError(f"schema '{schema.name}': columns {[c.name for c in todo]} need DP estimation but epsilon is {epsilon}")
    sigma, event = _mechanism(epsilon, ledger, len(todo), stage)
    resolved: dict[str, ColumnSpec] = {}
    for col in todo:
        if col.name not in df.columns:
            raise ConfigError(f"schema '{schema.name}': column '{col.name}' missing from the data")
        if col.is_categorical:
            cands = list(col.candidate_categories or [])
            counts = df[col.name].astype(str).str.strip().value_counts().reindex(cands, fill_value=0).to_numpy(float)
            noisy = _release(counts, sigma)
            keep = [c for c, v in zip(cands, noisy) if v > _threshold(sigma)] or [cands[int(np.argmax(noisy))]]
            resolved[col.name] = col.model_copy(update={"categories": keep, "domain": "dp"})
        else:
            lo, hi = float(col.candidate_min), float(col.candidate_max)  # type: ignore[arg-type]
            edges = np.linspace(lo, hi, NUM_CANDIDATE_BINS + 1)
            vals = pd.to_numeric(df[col.name], errors="coerce").dropna().clip(lo, hi).to_numpy()
            counts, _ = np.histogram(vals, bins=edges)
            noisy = _release(counts, sigma)
            idx = np.nonzero(noisy > _threshold(sigma))[0]
            if len(idx) == 0:
                idx = np.array([int(np.argmax(noisy))])
            new_lo, new_hi = float(edges[idx[0]]), float(edges[idx[-1] + 1])
            if col.type == "integer":
                new_lo, new_hi = float(np.floor(new_lo)), float(np.ceil(new_hi))
            resolved[col.name] = col.model_copy(update={"min": new_lo, "max": new_hi})
    _record(ledger, stage, event, {"columns": [c.name for c in todo], "sigma": sigma, "mechanism": "gaussian histogram over public candidates"})
    return schema.model_copy(update={"columns": [resolved.get(c.name, c) for c in schema.columns]})


def dp_group_label_table(
    df: pd.DataFrame,
    schema: TableSchema,
    sensitive: str,
    *,
    epsilon: float,
    ledger,
    stage: str = "dp_fair_stats",
) -> dict[str, dict[str, float]]:
    """DP estimate of the contingency table counts[a][y] (sensitive value a, target label y)."""
    return dp_group_label_tables(df, schema, [sensitive], epsilon=epsilon, ledger=ledger, stage=stage)[sensitive]


def dp_group_label_tables(
    df: pd.DataFrame,
    schema: TableSchema,
    sensitive: list[str],
    *,
    epsilon: float,
    ledger,
    stage: str = "dp_fair_stats",
) -> dict[str, dict[str, dict[str, float]]]:
    """DP estimates of counts[attribute][a][y], one table per sensitive attribute.

    One Gaussian histogram over each public |A| x |Y| grid (L2 sensitivity 1 each: a record adds 1 to
    one cell of every table), K tables = K compositions of one event; negative noisy counts are
    clamped to a small positive floor (post-processing). Separate tables rather than one joint
    |A1| x ... x |Y| table: each marginal then carries one cell's noise, not the sum of many.
    """
    if schema.target is None:
        raise ConfigError(f"schema '{schema.name}': fairness statistics need a target column")
    if not sensitive:
        raise ConfigError(f"schema '{schema.name}': fairness statistics need a sensitive attribute")
    y_col = schema.column(schema.target)
    a_cols = [schema.column(a) for a in sensitive]
    sigma, event = _mechanism(epsilon, ledger, len(sensitive), stage)
    out = {}
    for a_col in a_cols:
        table = pd.crosstab(df[a_col.name].astype(str), df[schema.target].astype(str))
        table = table.reindex(index=a_col.categories, columns=y_col.categories, fill_value=0)
        noisy = np.maximum(_release(table.to_numpy(float), sigma), 0.5)
        out[a_col.name] = {a: {y: float(noisy[i, j]) for j, y in enumerate(y_col.categories)}
                           for i, a in enumerate(a_col.categories)}
    _record(ledger, stage, event, {"sensitive": list(sensitive), "target": schema.target, "sigma": sigma})
    return out


def dp_marginals(df: pd.DataFrame, schema: TableSchema, *, epsilon: float, ledger, bins: int = 8,
                 stage: str = "dp_marginals", pairs_with: str | Sequence[str] | None = None,
                 pair_bins: int | None = None) -> dict[str, dict]:
    """DP 1-way marginals of every column: ``{column: {"kind", "values" | "edges", "counts"}}``.

    One Gaussian histogram per column over public cells (a categorical column's categories, a numeric
    column's ``bins`` equal-width bins between its public or DP-released bounds): a record adds 1 to one
    cell of each, so L2 sensitivity 1 per histogram and K columns = K compositions of one event.
    ``pairs_with``: categorical columns (the target; a sensitive attribute) whose 2-way histogram with
    every other column is released too, under ``"pairs": {"<column>|<with>": {"columns", "counts"}}``
    (counts row-major, the column's cells x the ``with`` column's categories), each unordered pair once:
    one more composition of the same event per table. A numeric column's cells in a 2-way table are
    ``pair_bins`` equal-width bins (default ``bins``), stored under the entry's ``"edges"``: the same noise
    on a cell split again by the label or the group swamps fine bins (Adult, 1,000 rows, eps = 4: 20 age
    bins x 2 sexes hold ~16 women a cell against noise sd 17). Negative noisy counts are clamped to 0
    (post-processing); noise from OS entropy.
    """
    anchors = [pairs_with] if isinstance(pairs_with, str) else list(pairs_with or ())
    for name in anchors:
        if not schema.column(name).is_categorical:
            raise ConfigError(f"DP pair marginals: '{name}' must be a categorical column")
    pairs = marginal_pairs(schema, anchors)
    sigma, event = _mechanism(epsilon, ledger, len(schema.columns) + len(pairs), stage)
    codes: dict[str, tuple[np.ndarray, int]] = {}
    out: dict[str, dict] = {}
    for col in schema.columns:
        if col.is_categorical:
            cells = list(col.categories)
            code = pd.Categorical(df[col.name].astype(str), categories=cells).codes.astype(np.int64)
            entry = {"kind": "categorical", "values": cells}
            size = len(cells)
        else:
            edges, code = _binned(df[col.name], col, bins)
            entry = {"kind": "numeric", "edges": edges.tolist()}
            size = bins
        codes[col.name] = (code, size)
        counts = np.bincount(code[code >= 0], minlength=size).astype(float)
        entry["counts"] = np.maximum(_release(counts, sigma), 0.0).tolist()
        out[col.name] = entry
    if pairs:
        out["pairs"] = {}
    for name, anchor in pairs:
        (x, n_x), (y, n_y) = codes[name], codes[anchor]
        entry = {"columns": [name, anchor]}
        if not schema.column(name).is_categorical and pair_bins:
            edges, x = _binned(df[name], schema.column(name), pair_bins)
            n_x, entry["edges"] = pair_bins, edges.tolist()
        ok = (x >= 0) & (y >= 0)
        counts = np.bincount(x[ok] * n_y + y[ok], minlength=n_x * n_y).astype(float)
        entry["counts"] = np.maximum(_release(counts, sigma), 0.0).tolist()
        out["pairs"][f"{name}|{anchor}"] = entry
    _record(ledger, stage, event, {"columns": schema.names, "bins": bins, "sigma": sigma,
                                         **({"pairs_with": anchors, "pairs": len(pairs)} if pairs else {}),
                                         **({"pair_bins": pair_bins} if pairs and pair_bins else {})})
    return out


def marginal_pairs(schema: TableSchema, anchors: Sequence[str]) -> list[tuple[str, str]]:
    """The 2-way tables ``dp_marginals`` releases with ``pairs_with=anchors``: (column, anchor), each pair once."""
    pairs: list[tuple[str, str]] = []
    for i, anchor in enumerate(anchors):  # a pair of two anchors is released once, with the earlier one
        pairs += [(c.name, anchor) for c in schema.columns if c.name != anchor and c.name not in anchors[:i]]
    return pairs


def _binned(values: pd.Series, col, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """``bins`` equal-width edges over the column's public or DP bounds, and each value's bin."""
    edges = np.linspace(float(col.min), float(col.max), bins + 1)
    x = np.clip(values.to_numpy(float), edges[0], edges[-1])
    return edges, np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
