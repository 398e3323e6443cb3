"""Fairness regularizers for DP-SGD that keep per-record influence bounded.

Notation: row i has sensitive value a_i and label y_i; p_i = p_theta(Y | tokens of row i before
the label) is the generator's distribution over the label's first tokens (renormalised over the
labels), read off the logits that predict the label's first token.

Two per-example terms, weights lambda1 (demographic parity) and lambda2 (equalized odds):

* **DP term**  ``lambda1 * CE(t, p_i) = -lambda1 * sum_y t_y log p_i(y)`` pulls every row's
  P(Y | A, row) toward one group-independent target distribution t (the public or DP-estimated
  P(Y), or a user-given target). With the likelihood term the per-context optimum is the mixture
  p* = (P_data(Y|x) + lambda1 t) / (1 + lambda1), so the generator's group rates
  P(Y=1 | A=a) move toward t and the demographic-parity gap shrinks by 1 / (1 + lambda1).
* **EO term**  ``lambda2 * (w[a_i, y_i] - 1) * (-log p_i(y_i))``: Kamiran-Calders reweighing of the
  label token with w[a, y] = P(y) / P(y | a) (from the public or DP-estimated |A| x |Y| table). The
  weighted data have Y independent of A, so the label's dependence on A given the other features
  is weakened, which is what the equalized-odds gap of a downstream classifier measures. w is
  clipped to [0, w_max] so each term stays bounded.

**Privacy argument.** Each term is a function of row i's own tokens and of constants (t, w) that
are either public or released by an accounted DP mechanism
(:func:`dpsynth_core.tabular.dp_domain.dp_group_label_table`, a Gaussian histogram recorded in the
ledger); using a DP release is post-processing. No term looks at any other row of the batch (no
batch group means), so the per-example loss l_i = LM_i + penalty_i is a function of record i
alone. DP-SGD clips the gradient of l_i to norm C before summing and adding N(0, sigma^2 C^2):
the sensitivity of the noisy sum to adding or removing one record is still C, so the DP-SGD
accountant (same q, sigma, T) is unchanged. Total cost = DP-SGD epsilon + the epsilon of the
(A, Y) table, composed in the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.constrained import RowConstraint
from dpsynth_core.tabular.schema import TableSchema


@dataclass
class FairnessTargets:
    """Constants of the regularizers (public or DP-estimated, never raw private statistics)."""

    sensitive: str
    labels: list[str]
    target_y: dict[str, float]  # t: group-independent target P(Y)
    weights: dict[str, dict[str, float]]  # w[a][y] = P(y) / P(y | a)

    @classmethod
    def from_counts(
        cls, counts: dict[str, dict[str, float]], sensitive: str, *, target_y: dict[str, float] | None = None, w_max: float = 5.0
    ) -> FairnessTargets:
        """Build t and w from a (DP-estimated or public) contingency table counts[a][y]."""
        groups = list(counts)
        labels = list(next(iter(counts.values())))
        total = sum(counts[a][y] for a in groups for y in labels)
        p_y = {y: sum(counts[a][y] for a in groups) / total for y in labels}
        weights = {}
        for a in groups:
            n_a = sum(counts[a].values())
            weights[a] = {y: float(min(w_max, p_y[y] / max(counts[a][y] / n_a, 1e-6))) for y in labels}
        t = dict(target_y) if target_y else p_y
        if set(t) != set(labels) or abs(sum(t.values()) - 1.0) > 1e-6:
            raise ConfigError(f"fairness target_y must give a probability for each label {labels} summing to 1")
        return cls(sensitive=sensitive, labels=labels, target_y=t, weights=weights)


class FairnessPenalty:
    """``per_example_penalty(logits, batch) -> Tensor[B]`` for ``train_dp_lora``.

    Locates, in each row's target tokens, the target column's value and the sensitive column's value
    (by their forced name tokens, see ``serialize``), then applies the two terms above.
    """

    def __init__(self, constraint: RowConstraint, schema: TableSchema, targets: FairnessTargets, lambda_dp: float, lambda_eo: float):
        if schema.target is None:
            raise ConfigError(f"schema '{schema.name}': the fairness penalty needs a target column")
        if targets.sensitive not in schema.names:
            raise ConfigError(f"schema '{schema.name}': unknown sensitive column '{targets.sensitive}'")
        if lambda_dp < 0 or lambda_eo < 0:
            raise ConfigError("fairness weights lambda_dp / lambda_eo must be >= 0")
        self.c, self.schema, self.targets = constraint, schema, targets
        self.lambda_dp, self.lambda_eo = float(lambda_dp), float(lambda_eo)
        self.labels = list(schema.column(schema.target).categories or [])
        firsts = [constraint.cat_ids[schema.target][y][0] for y in self.labels]
        if len(set(firsts)) != len(firsts):
            raise ConfigError(f"target '{schema.target}': labels must start with distinct tokens for the fairness penalty")
        self.label_first = torch.tensor(firsts)
        self.t = torch.tensor([targets.target_y[y] for y in self.labels], dtype=torch.float32)
        self.groups = list(schema.column(targets.sensitive).categories or [])
        # The name tokens after the separator mark (" income", ":"), so a value whose last
        # punctuation BPE merged with the mark (e.g. "),") does not hide the next column; and the
        # first-position form ("income", ":").
        self._patterns = {
            name: [p for p in (constraint.forced(1, name)[1:], constraint.forced(0, name)) if p]
            for name in (schema.target, targets.sensitive)
        }

    def _value_start(self, ids: list[int], name: str) -> int | None:
        """Index of the first value token of column ``name`` in ``ids`` (None if absent)."""
        for pat in self._patterns[name]:
            k = len(pat)
            for j in range(len(ids) - k, -1, -1):
                if ids[j : j + k] == pat:
                    return j + k
        return None

    def locate(self, ids: list[int]) -> tuple[int, str, str] | None:
        """(position of the label's first token, group a, label y) for one row, or None."""
        y_pos = self._value_start(ids, self.schema.target)
        a_pos = self._value_start(ids, self.targets.sensitive)
        if y_pos is None or a_pos is None or y_pos >= len(ids):
            return None
        # longest match: a category whose ids are a prefix of another's must not shadow it
        matches = [(len(seq), a) for a, seq in self.c.cat_ids[self.targets.sensitive].items() if ids[a_pos : a_pos + len(seq)] == seq]
        group = max(matches)[1] if matches else None
        label = next((y for y in self.labels if ids[y_pos] == self.c.cat_ids[self.schema.target][y][0]), None)
        if group is None or label is None:
            return None
        return y_pos, group, label

    def label_log_probs(self, logits: torch.Tensor, row: int, y_pos: int) -> torch.Tensor:
        """log p_theta(label first token) at the label position, renormalised over the labels."""
        lf = self.label_first.to(logits.device)
        return torch.log_softmax(logits[row, y_pos - 1, lf].float(), dim=-1)

    def __call__(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        input_ids, mask = batch["input_ids"], batch["attention_mask"]
        out = torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
        for i in range(logits.shape[0]):
            ids = input_ids[i, : int(mask[i].sum())].tolist()
            found = self.locate(ids)
            if found is None:
                continue
            y_pos, group, label = found
            logp = self.label_log_probs(logits, i, y_pos)
            term = -self.lambda_dp * (self.t.to(logp.device) * logp).sum()
            w = self.targets.weights[group][label]
            term = term - self.lambda_eo * (w - 1.0) * logp[self.labels.index(label)]
            out[i] = term
        return out


def group_rates(penalty: FairnessPenalty, model, batches: Sequence[dict]) -> dict[str, float]:
    """Mean generator P(Y = positive | row before the label) per group over ``batches`` (no grad).

    Used by tests and diagnostics to measure the generator's demographic-parity gap.
    """
    pos = penalty.labels.index(penalty.schema.positive())
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            for i in range(logits.shape[0]):
                ids = batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
                found = penalty.locate(ids)
                if found is None:
                    continue
                y_pos, group, _ = found
                p = penalty.label_log_probs(logits, i, y_pos).exp()[pos].item()
                sums.setdefault(group, []).append(p)
    return {a: sum(v) / len(v) for a, v in sums.items()}
