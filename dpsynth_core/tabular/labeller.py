"""Label generated rows from the run's DP (column, target) tables (post-processing, no privacy cost).

Why: a generator DP-SGD trained for a few steps writes plausible *features* but barely ties the label
to them: on Adult, relabelling the generated rows with a classifier fit on the real rows lifted TSTR F1
to about what that labeller reaches on real rows, far above the generator's own labels
(docs/results/config_figures.md). The run has already released each column's 2-way table with the target (``calibrate.pairs_with_target``), so the
label can come from them:

* score: the naive-Bayes log-odds of the positive label, log P(pos) / P(neg) + sum over columns of
  log P(x_c | pos) / P(x_c | neg), every term from a noisy DP table (+1 per cell: a noisy zero must not
  veto a row). Tables of ``skip`` columns (the sensitive attributes, with fairness on) are left out, so
  the score does not read A directly. ``prior_rows`` > 0 adds that many pseudo-rows to every cell, in
  the label's shares: a cell whose counts are about the noise's size then says little either way, where
  the raw ratio of two noisy counts could swing the score by several units (Adult, 1,000 rows, eps = 4:
  ~12 high-income rows per age bin against noise sd 17).
* labels: the ``rate`` share of rows with the highest score are positive, within each group when
  ``groups`` are given (equal label rates per group: demographic parity in the released labels), so
  the label share is the DP P(Y = pos) (or the fairness target) instead of the naive Bayes' own,
  which is badly calibrated on generated rows (labels sampled from it scored worst of all, same page).

Inputs are DP releases and generated rows only. Binary targets only (a ranking needs one positive).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.calibrate import pair_column_margin

__all__ = ["naive_bayes_log_odds", "rank_labels", "relabel_from_dp_tables"]


def _binary_labels(marginals: dict, target: str) -> list[str]:
    labels = [str(v) for v in marginals[target]["values"]]
    if len(labels) != 2:
        raise ConfigError(f"labels from the DP tables need a binary target; '{target}' has {len(labels)} classes")
    return labels


def naive_bayes_log_odds(frame: pd.DataFrame, marginals: dict, target: str, positive: str,
                         skip: tuple[str, ...] = (), prior_rows: float = 0.0) -> np.ndarray:
    """Per row, log P(Y = pos | x) / P(Y = neg | x) under naive Bayes from ``dp_marginals.json``;
    ``prior_rows`` pseudo-rows per cell of each table, split in the label's shares."""
    labels = _binary_labels(marginals, target)
    pos = labels.index(positive)
    p_y = np.maximum(np.asarray(marginals[target]["counts"], float), 0.0) + 1.0
    out = np.full(len(frame), np.log(p_y[pos] / p_y[1 - pos]))
    prior = prior_rows * p_y / p_y.sum()  # a cell of pseudo-rows leaves the label's odds where they are
    for entry in (marginals.get("pairs") or {}).values():
        column, y = entry["columns"]
        if y != target or column in skip:
            continue
        given_y = np.maximum(np.asarray(entry["counts"], float), 0.0).reshape(-1, 2) + 1.0 + prior
        given_y = given_y / given_y.sum(0, keepdims=True)  # P(x_c | y)
        code = pair_column_margin(marginals, entry).cells(frame)
        ok = code >= 0
        out[ok] += np.log(given_y[code[ok], pos] / given_y[code[ok], 1 - pos])
    return out


def rank_labels(scores: np.ndarray, rate: float | dict[str, float], groups: np.ndarray | None = None,
                weights: np.ndarray | None = None) -> np.ndarray:
    """True for the highest-scoring rows of each group (one group if ``groups`` is None) up to ``rate`` of
    the group: round(rate x n) rows, or with ``weights`` the rows whose cumulative weight stays within
    rate x the group's weight (the cut where the weighted group reaches the rate). ``rate`` per group
    value when a dict (a group it does not name gets its mean)."""
    keys = np.zeros(len(scores), dtype=object) if groups is None else np.asarray(groups, dtype=object)
    positive = np.zeros(len(scores), dtype=bool)
    for key in pd.unique(keys):
        idx = np.flatnonzero(keys == key)
        r = rate.get(str(key), float(np.mean(list(rate.values())))) if isinstance(rate, dict) else rate
        r = min(max(r, 0.0), 1.0)
        order = idx[np.argsort(-scores[idx], kind="stable")]
        if weights is None:
            take = int(round(r * len(idx)))
        else:  # the first rows whose weight reaches r of the group's, the boundary row where it is nearer
            cum = np.cumsum(weights[order])
            goal = r * cum[-1]
            take = int(np.searchsorted(cum, goal, side="left"))
            if take < len(order) and cum[take] - goal < goal - (cum[take - 1] if take else 0.0):
                take += 1
        positive[order[:take]] = True
    return positive


def relabel_from_dp_tables(frame: pd.DataFrame, marginals: dict, target: str, positive: str, *,
                           skip: tuple[str, ...] = (), group_by: tuple[str, ...] = (),
                           rates: dict[str, float] | None = None, temperature: float = 0.0,
                           seed: int = 0, weights: np.ndarray | None = None, prior_rows: float = 0.0) -> pd.DataFrame:
    """``frame`` with its target column replaced (see the module docstring). ``group_by``: columns whose
    value combinations are ranked separately; ``rates``: the positive share per value of a single
    ``group_by`` column (default for every group: the DP marginal P(Y = pos)). ``temperature`` > 0 ranks
    score + temperature x logistic noise instead (the same rates, a weaker tie of label to features: less
    for a downstream model to learn about the sensitive attribute's proxies); ``seed``: that noise
    (post-processing of DP outputs, so a config seed). ``weights``: each group's cut is taken on the rows
    weighted so (raking weights to the DP feature tables: the cut where the data's rows of the group would
    reach the rate, not the generator's). ``prior_rows``: :func:`naive_bayes_log_odds`'s."""
    labels = _binary_labels(marginals, target)
    counts = np.maximum(np.asarray(marginals[target]["counts"], float), 0.0)
    overall = float(counts[labels.index(positive)] / counts.sum()) if counts.sum() > 0 else 0.5
    scores = naive_bayes_log_odds(frame, marginals, target, positive, skip, prior_rows)
    if temperature > 0:
        scores = scores + temperature * np.random.default_rng(seed).logistic(size=len(scores))
    groups = None
    if group_by:
        groups = frame[list(group_by)].astype(str).agg("\x1f".join, axis=1).to_numpy()
    rate: float | dict[str, float] = rates if (rates and len(group_by) == 1) else overall
    is_pos = rank_labels(scores, rate, groups, weights)
    out = frame.copy()
    out[target] = np.where(is_pos, positive, labels[1 - labels.index(positive)])
    return out
