"""Calibrate generated rows to the run's DP marginals (post-processing, no privacy cost).

A DP-SGD generator trained for a few noisy steps gets each column's distribution wrong in the
same way: it over-produces the values that were frequent in its training rows (Adult at eps = 4:
93 % men where the DP marginal says 68 %, 11 % high incomes where it says 24 %). The run has
already paid for DP 1-way marginals of every column (``dp_marginals.json``), so the generator
samples a larger pool and the pool is calibrated to them:

1. raking (iterative proportional fitting): weights w_i on the pool rows such that, for every
   column, the weighted share of each cell equals the DP marginal's share. Among all weightings
   with those margins raking is the one closest to uniform in KL, so the generator's dependencies
   between columns are kept as far as the margins allow. Weights are capped at ``max_weight`` x
   the mean so a handful of rare rows cannot stand for a whole cell.
2. optional DP 2-way (column, target) margins (``pairs_with_target``): the label's dependence on
   each feature, which a few DP-SGD steps barely teach the generator, comes from the DP release.
3. optional fairness cells: for a sensitive attribute A and the target Y, the joint (A, Y) is
   raked to P(A) x P(Y | A = a) with P(Y | A = a) = the target rate (default: the DP marginal
   P(Y) for every group), i.e. demographic parity in the released table.
4. ``n`` rows drawn from the pool with inclusion probabilities proportional to the weights
   (systematic PPS sampling in a random order: exactly ``n`` distinct rows), or, with
   ``select: balanced``, chosen greedily so the released rows' own margins track the targets
   (PPS adds sampling noise to the released margins; measured: docs/results/config_figures.md).
   ``balanced`` is the config default (``CalibrationSettings.select``).

Every input is a DP release or a generated row, and the sampling seed is a config seed: this is
post-processing of DP outputs. Cells of a margin no pool row falls in are dropped from it and the
rest renormalised (raking cannot create rows the generator never wrote); ``CalibrationResult``
reports how much target mass that was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpsynth_core.tabular.schema import TableSchema

__all__ = ["CalibrationResult", "Margin", "balanced_selection", "calibrate_rows", "column_margin", "fairness_margins",
           "margins_from_dp", "pair_column_margin", "pair_margins_from_dp", "rake", "systematic_pps"]


@dataclass
class Margin:
    """One target distribution over cells of the rows: ``cells(frame)`` gives each row's cell index."""

    name: str
    columns: tuple[str, ...]
    target: np.ndarray  # shares over the cells, sums to 1
    edges: dict[str, np.ndarray] = field(default_factory=dict)  # numeric columns: bin edges
    values: dict[str, list[str]] = field(default_factory=dict)  # categorical columns: cell order

    def cells(self, frame: pd.DataFrame) -> np.ndarray:
        """Cell index of each row (row-major over ``columns``); -1 where a value is outside the cells."""
        index = np.zeros(len(frame), dtype=np.int64)
        valid = np.ones(len(frame), dtype=bool)
        for col in self.columns:
            if col in self.edges:
                e = self.edges[col]
                x = pd.to_numeric(frame[col], errors="coerce").to_numpy(float)
                code = np.clip(np.searchsorted(e, x, side="right") - 1, 0, len(e) - 2)
                valid &= np.isfinite(x)
                size = len(e) - 1
            else:
                vals = self.values[col]
                code = pd.Categorical(frame[col].astype(str), categories=vals).codes.astype(np.int64)
                valid &= code >= 0
                size = len(vals)
            index = index * size + np.maximum(code, 0)
        return np.where(valid, index, -1)

    def shares(self, frame: pd.DataFrame, weights: np.ndarray | None = None) -> np.ndarray:
        c = self.cells(frame)
        w = np.ones(len(frame)) if weights is None else weights
        out = np.bincount(c[c >= 0], weights=w[c >= 0], minlength=len(self.target)).astype(float)
        return out / max(out.sum(), 1e-12)

    def tvd(self, frame: pd.DataFrame, weights: np.ndarray | None = None) -> float:
        return 0.5 * float(np.abs(self.shares(frame, weights) - self.target).sum())

    def shortfall(self, pool: pd.DataFrame, n: int) -> float:
        """Share of ``n`` released rows this margin asks for in cells where the pool has fewer rows than
        that: no weighting or selection can match the margin there, only a larger pool."""
        c = self.cells(pool)
        have = np.bincount(c[c >= 0], minlength=len(self.target))
        return float(np.maximum(n * self.target - have, 0.0).sum() / max(n, 1))


def _shares(counts) -> np.ndarray:
    """Noisy counts of a DP release as shares: clamped at 0, normalised (all zeros if nothing is left)."""
    c = np.maximum(np.asarray(counts, float), 0.0)
    return c / c.sum() if c.sum() > 0 else c


def column_margin(marginals: dict[str, dict], column: str) -> Margin:
    """One column's margin over the release's own cells (its categories, or its numeric bin edges)."""
    entry = marginals[column]
    kw = ({"edges": {column: np.asarray(entry["edges"], float)}} if entry["kind"] == "numeric"
          else {"values": {column: [str(v) for v in entry["values"]]}})
    return Margin(name=column, columns=(column,), target=_shares(entry["counts"]), **kw)


def margins_from_dp(marginals: dict[str, dict], schema: TableSchema) -> list[Margin]:
    """One margin per column of ``dp_marginals.json`` (noisy counts, already clamped at 0)."""
    margins = [column_margin(marginals, col.name) for col in schema.columns if col.name in marginals]
    return [m for m in margins if m.target.any()]


def pair_margins_from_dp(marginals: dict[str, dict], schema: TableSchema, skip: tuple[str, ...] = ()) -> list[Margin]:
    """One margin per DP 2-way (column, target) histogram of ``dp_marginals.json`` (``"pairs"``), except
    the columns in ``skip`` (a sensitive attribute whose (A, Y) cells are raked to parity instead)."""
    out = []
    for name, entry in (marginals.get("pairs") or {}).items():
        col, y = entry["columns"]
        target = _shares(entry["counts"])
        if col in skip or not target.any():
            continue
        values = {y: [str(v) for v in marginals[y]["values"]]}
        first = pair_column_margin(marginals, entry)
        out.append(Margin(name=name, columns=(col, y), target=target, edges=first.edges,
                          values={**values, **first.values}))
    return out


def pair_column_margin(marginals: dict[str, dict], entry: dict) -> Margin:
    """A margin over the cells of a 2-way table's first column, for its ``cells``: the table's own numeric
    bins when it has them (``dp_marginals(pair_bins=...)``), else the column's 1-way cells (and target)."""
    col = entry["columns"][0]
    if "edges" in entry:
        edges = np.asarray(entry["edges"], float)
        return Margin(name=col, columns=(col,), target=np.zeros(len(edges) - 1), edges={col: edges})
    return column_margin(marginals, col)


def fairness_margins(marginals: dict[str, dict], attributes: list[str], target: str,
                     rates: dict[str, dict[str, float] | None] | None = None, positive: str | None = None) -> list[Margin]:
    """(A, Y) margins for demographic parity: P(A = a) from its DP marginal times P(Y | A = a) =
    ``rates[A][a]`` for the positive label when given, else the DP marginal P(Y) for every group."""
    ty = marginals[target]
    labels = [str(v) for v in ty["values"]]
    p_y = _shares(ty["counts"])
    out = []
    for a in attributes:
        ta = marginals[a]
        groups = [str(v) for v in ta["values"]]
        p_a = _shares(ta["counts"])
        joint = np.outer(p_a, p_y)
        given = (rates or {}).get(a) or {}
        if given and positive is not None and len(labels) == 2:
            pos = labels.index(positive)
            for i, g in enumerate(groups):
                if g in given:
                    joint[i, pos], joint[i, 1 - pos] = p_a[i] * given[g], p_a[i] * (1 - given[g])
        out.append(Margin(name=f"{a}|{target}", columns=(a, target), target=(joint / joint.sum()).ravel(),
                          values={a: groups, target: labels}))
    return out


def _reachable_targets(margins: list[Margin], cells: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, float]]:
    """Each margin's target on the cells some pool row falls in (renormalised), and the mass left out."""
    targets, dropped = [], {}
    for m, c in zip(margins, cells):
        covered = np.bincount(c[c >= 0], minlength=len(m.target)) > 0
        dropped[m.name] = float(m.target[~covered].sum())
        t = np.where(covered, m.target, 0.0)
        targets.append(t / t.sum() if t.sum() > 0 else t)
    return targets, dropped


def rake(frame: pd.DataFrame, margins: list[Margin], *, max_weight: float = 20.0, iterations: int = 200,
         tol: float = 1e-6) -> tuple[np.ndarray, dict[str, float]]:
    """Raking weights (mean 1) and, per margin, the target mass left out (cells with no pool row)."""
    n = len(frame)
    w = np.ones(n)
    if n == 0 or not margins:
        return w, {}
    cells = [m.cells(frame) for m in margins]
    targets, dropped = _reachable_targets(margins, cells)
    for _ in range(iterations):
        worst = 0.0
        for c, t in zip(cells, targets):
            ok = c >= 0
            have = np.bincount(c[ok], weights=w[ok], minlength=len(t))
            share = have / max(have.sum(), 1e-12)
            worst = max(worst, 0.5 * float(np.abs(share - t).sum()))
            factor = np.divide(t, share, out=np.ones_like(t), where=share > 0)
            w[ok] *= factor[c[ok]]
            w = _cap(w, max_weight)
        if worst < tol:
            break
    return w, dropped


def _cap(w: np.ndarray, max_weight: float) -> np.ndarray:
    """``w`` rescaled to mean 1 and held within [1 / max_weight, max_weight] of its mean."""
    for _ in range(100):  # clipping moves the mean: repeat until the bounds hold after rescaling
        w = w / w.mean()
        if w.max() <= max_weight * (1 + 1e-9) and w.min() >= (1 - 1e-9) / max_weight:
            break
        w = np.clip(w, 1.0 / max_weight, max_weight)
    return w


def systematic_pps(weights: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct indices with inclusion probability proportional to ``weights`` (capped at 1):
    systematic sampling over a random order of the rows."""
    m = len(weights)
    if n >= m:
        return np.arange(m)
    pi = np.zeros(m)
    certain = np.zeros(m, dtype=bool)
    for _ in range(m):  # rows whose share would exceed 1 are taken for sure; the rest share the remainder
        rest = ~certain
        pi[rest] = (n - certain.sum()) * weights[rest] / weights[rest].sum()
        over = rest & (pi >= 1.0)
        if not over.any():
            break
        certain |= over
        pi[certain] = 1.0
    order = rng.permutation(m)
    cum = np.cumsum(pi[order])
    points = rng.uniform() + np.arange(n)
    picked = order[np.minimum(np.searchsorted(cum, points, side="right"), m - 1)]
    return np.sort(np.unique(picked))


def balanced_selection(frame: pd.DataFrame, margins: list[Margin], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct rows chosen greedily so that every margin's counts track ``k x target`` as the
    selection grows (k = 1..n): each step takes the row whose cells have the largest summed deficit.
    The released rows' margins then sit close to the targets instead of carrying PPS's sampling
    noise; ties are broken at random."""
    m = len(frame)
    if n >= m:
        return np.arange(m)
    cells = [mg.cells(frame) for mg in margins]
    targets, _ = _reachable_targets(margins, cells)
    counts = [np.zeros(len(t)) for t in targets]
    score_floor = rng.uniform(0.0, 1e-6, m)  # tie-break
    taken = np.zeros(m, dtype=bool)
    picked = np.empty(n, dtype=np.int64)
    for k in range(n):
        score = score_floor.copy()
        for c, t, cnt in zip(cells, targets, counts):
            deficit = (k + 1) * t - cnt
            score += np.where(c >= 0, deficit[np.maximum(c, 0)], 0.0)
        score[taken] = -np.inf
        i = int(np.argmax(score))
        taken[i], picked[k] = True, i
        for c, cnt in zip(cells, counts):
            if c[i] >= 0:
                cnt[c[i]] += 1
    return np.sort(picked)


@dataclass
class CalibrationResult:
    frame: pd.DataFrame
    pool_rows: int
    tvd_pool: dict[str, float]  # per margin: the pool as generated vs the target
    tvd_weighted: dict[str, float]  # the raked pool
    tvd_released: dict[str, float]  # the n released rows
    dropped_mass: dict[str, float]
    max_weight: float
    shortfall: dict[str, float] = field(default_factory=dict)  # per margin: Margin.shortfall of the pool

    def worst_shortfall(self) -> tuple[str | None, float]:
        """The margin the pool is furthest from being able to supply, and that share of the release."""
        if not self.shortfall:
            return None, 0.0
        name = max(self.shortfall, key=self.shortfall.get)
        return name, self.shortfall[name]

    def summary(self) -> dict:
        mean = lambda d: float(np.mean(list(d.values()))) if d else 0.0  # noqa: E731
        worst, share = self.worst_shortfall()
        return {"pool_rows": self.pool_rows, "rows": len(self.frame), "tvd_to_dp_pool": mean(self.tvd_pool),
                "tvd_to_dp_weighted": mean(self.tvd_weighted), "tvd_to_dp_released": mean(self.tvd_released),
                "dropped_target_mass_max": max(self.dropped_mass.values(), default=0.0),
                "largest_weight": self.max_weight, "pool_shortfall_max": share, "pool_shortfall_margin": worst}


def calibrate_rows(pool: pd.DataFrame, margins: list[Margin], n: int, *, seed: int, max_weight: float = 20.0,
                   select: str = "pps") -> CalibrationResult:
    """Rake ``pool`` to ``margins`` and draw ``n`` rows from it (see the module docstring);
    ``select``: ``pps`` (by the raking weights) or ``balanced`` (:func:`balanced_selection`)."""
    if select not in ("pps", "balanced"):
        raise ValueError(f"calibrate: select must be 'pps' or 'balanced', not {select!r}")
    weights, dropped = rake(pool, margins, max_weight=max_weight)
    rng = np.random.default_rng(seed)  # post-processing: which generated rows are released
    if not len(pool):
        picked = np.arange(0)
    elif select == "balanced":
        picked = balanced_selection(pool, margins, n, rng)
    else:
        picked = systematic_pps(weights, n, rng)
    released = pool.iloc[picked].sample(frac=1.0, random_state=seed).reset_index(drop=True)
    return CalibrationResult(
        frame=released, pool_rows=len(pool),
        tvd_pool={m.name: m.tvd(pool) for m in margins}, tvd_weighted={m.name: m.tvd(pool, weights) for m in margins},
        tvd_released={m.name: m.tvd(released) for m in margins}, dropped_mass=dropped,
        max_weight=float(weights.max()) if len(weights) else 0.0,
        shortfall={m.name: m.shortfall(pool, n) for m in margins})
