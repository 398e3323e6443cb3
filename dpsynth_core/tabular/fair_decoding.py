"""Decoding-time fairness: tilt the label's logits per group towards one target rate.

The seed's "adjust sampling probabilities": when a row reaches its target value, the positive
label's first-token logit is shifted by delta[a], where a is the sensitive value this row already
emitted. A shift of the logit multiplies the label's odds by exp(delta[a]) for every row of group a,
so P(Y | x, a) keeps its ordering in x while the group's rate moves. delta is a controller:
after each batch, delta[a] += step * (logit(target) - logit(rate of group a in that batch)), with
target = ``target_rates[a]`` when given, else the rate of all rows generated so far (the generator's
own overall rate: the tilt equalises the groups without moving the marginal much).

Several sensitive attributes: one controller per attribute, and the row's shift is the sum of
its groups' deltas (``tilt_processor``).

It runs beside the rejection sampler (``generation._accept``): the tilt makes fair rows likely, so
fewer are rejected. It reads only generated tokens: post-processing, no privacy cost.
"""

from __future__ import annotations

import math

import torch
from transformers import LogitsProcessor

from dpsynth_core.tabular.constrained import ConstrainedRowProcessor, RowConstraint
from dpsynth_core.tabular.schema import TableSchema

MAX_TILT = 8.0  # |delta| cap: the controller cannot drive a label's probability to 0 or 1


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


class LabelTilt:
    """Per-group logit shifts of the positive label, updated from the rows generated so far."""

    def __init__(self, constraint: RowConstraint, schema: TableSchema, sensitive: str,
                 target_rates: dict[str, float] | None = None, step: float = 0.5):
        self.c, self.schema, self.sensitive = constraint, schema, sensitive
        self.target_rates, self.step = target_rates, step
        self.groups = list(schema.column(sensitive).categories or [])
        self.pos_first = constraint.cat_ids[schema.target][schema.positive()][0]
        self.delta = {a: 0.0 for a in self.groups}
        self._window: dict[str, list[int]] = {}
        self._all = [0, 0]  # positives, rows
        self._patterns = [p for p in (constraint.forced(1, sensitive)[1:], constraint.forced(0, sensitive)) if p]

    def group_of(self, ids: list[int]) -> str | None:
        """The sensitive value among generated ``ids`` (longest category after its name), or None."""
        for pat in self._patterns:
            k = len(pat)
            for j in range(len(ids) - k, -1, -1):
                if ids[j : j + k] == pat:
                    start = j + k
                    hits = [(len(seq), a) for a, seq in self.c.cat_ids[self.sensitive].items() if ids[start : start + len(seq)] == seq]
                    return max(hits)[1] if hits else None
        return None

    def observe(self, group: str, positive: bool) -> None:
        w = self._window.setdefault(group, [0, 0])
        w[0] += int(positive)
        w[1] += 1
        self._all[0] += int(positive)
        self._all[1] += 1

    def update(self) -> None:
        """One controller step from the rows observed since the last update."""
        overall = (self._all[0] + 0.5) / (self._all[1] + 1)
        for a, (pos, n) in self._window.items():
            target = (self.target_rates or {}).get(a, overall)
            rate = (pos + 0.5) / (n + 1)
            self.delta[a] = max(-MAX_TILT, min(MAX_TILT, self.delta[a] + self.step * (_logit(target) - _logit(rate))))
        self._window = {}

    def shift_for(self, generated: list[int]) -> float:
        """delta of the group this row emitted (0 before the sensitive value is out)."""
        group = self.group_of(generated)
        return self.delta.get(group, 0.0) if group is not None else 0.0

    def processor(self, rows: ConstrainedRowProcessor) -> LogitsProcessor:
        """A processor to run after ``rows`` (it reads that processor's decoding states)."""
        return tilt_processor([self], rows)


def tilt_processor(tilts: list[LabelTilt], rows: ConstrainedRowProcessor) -> LogitsProcessor:
    """One processor for several sensitive attributes: the label's logit moves by the SUM of each
    attribute's delta for the row's groups, so the odds are multiplied by prod_k exp(delta_k[a_k]);
    each attribute's controller keeps steering its own group rates (``update`` per tilt)."""
    return _TiltProcessor(tilts, rows)


class _TiltProcessor(LogitsProcessor):
    def __init__(self, tilts: list[LabelTilt], rows: ConstrainedRowProcessor):
        self.tilts, self.rows = tilts, rows
        self.target = tilts[0].schema.target
        self.pos_first = tilts[0].pos_first

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        start = self.rows._prompt_len or input_ids.shape[1]
        for i, st in enumerate(self.rows.states):
            if st.in_value and st.column == self.target and st.node is None and st.text == "":
                generated = input_ids[i, start:].tolist()
                shift = sum(t.shift_for(generated) for t in self.tilts)
                if shift:
                    scores[i, self.pos_first] = scores[i, self.pos_first] + shift
        return scores
