"""Fairness regularizers for DP-SGD that close the group gap without flattening the label.

Notation: row i has sensitive value a_i, label y_i and n_i target tokens (the LM loss of a row is
the MEAN of its n_i token cross-entropies, ``dpsgd.data.per_example_loss``); p_i = p_theta(Y | row i
before the label) is the generator's distribution over the labels' first tokens (renormalised over
the labels); q(Y | x, a) is the data's label distribution in context (x, a). From a public or
DP-estimated |A| x |Y| table: r[a, y] = P(y | a), t[y] = P(y) (or a user-given target), and
w[a, y] = P(y) / P(y | a).

* **DP term (group shift)**  ``(lambda_dp / n_i) * sum_y (r[a_i, y] - t[y]) * log p_i(y)``.
  With the label token's own cross entropy (weight 1 / n_i in the row's mean) the gradient in the
  label logits is (p - q + lambda_dp c_a) / n_i, with c_a = r[a] - t (sum_y c_a[y] = 0), so the
  per-context optimum is  p*(y | x, a) = q(y | x, a) - lambda_dp (r[a, y] - t[y]):  a constant
  shift per group. Averaged over group a, P(Y | A = a) = (1 - lambda_dp) r[a] + lambda_dp t, so the
  demographic-parity gap is multiplied by (1 - lambda_dp) (lambda_dp = 1 closes it), while
  p*(y | x, a) - p*(y | x', a) = q(y | x, a) - q(y | x', a): the label keeps its dependence on the
  other features. (The 1 / n_i makes lambda mean exactly this whatever the row's token count.)
  log p is floored at log(1e-4), so the term is bounded and a context whose q is below the shift
  is left at the floor (there the group rate moves less than the formula says).
* **EO term (reweighing)**  ``(k_i / n_i) * (-log p_i(y_i))`` with k_i = max(-1, lambda_eo (w[a_i, y_i] - 1)):
  the label token's cross entropy reweighed by 1 + k >= 0 (Kamiran-Calders at lambda_eo = 1), whose
  optimum tilts each group's label odds by a constant factor, p*(y | x, a) proportional to
  (1 + k[a, y]) q(y | x, a) (again x keeps its effect); bounded below (the total weight of the
  label token never turns negative). It targets P(Y | A) independence, not the equalized-odds gap P(Y_hat | A, Y) itself;
  equalized odds is enforced at generation time (``generation.GapTracker``).

The old DP term, lambda * CE(t, p_i) for every row, had the optimum (q + n_i lambda t) / (1 + n_i lambda):
every context pulled to one global t, which erased P(Y | x) (TSTR F1 ~ 0 at epsilon = 4).

**Privacy argument.** Each term is a function of row i's own tokens and of constants (r, t, w)
that are either public or released by an accounted DP mechanism
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


LOG_FLOOR = -9.21  # log(1e-4): the DP term stops pushing a label's probability below this


@dataclass
class FairnessTargets:
    """Constants of the regularizers (public or DP-estimated, never raw private statistics)."""

    sensitive: str
    labels: list[str]
    target_y: dict[str, float]  # t: group-independent target P(Y)
    weights: dict[str, dict[str, float]]  # w[a][y] = P(y) / P(y | a)
    group_rates: dict[str, dict[str, float]] | None = None  # r[a][y] = P(y | a); None: t (no shift)

    @classmethod
    def from_counts(
        cls, counts: dict[str, dict[str, float]], sensitive: str, *, target_y: dict[str, float] | None = None, w_max: float = 5.0
    ) -> FairnessTargets:
        """Build t, r and w from a (DP-estimated or public) contingency table counts[a][y]."""
        groups = list(counts)
        labels = list(next(iter(counts.values())))
        total = sum(max(counts[a][y], 0.0) for a in groups for y in labels)
        p_y = {y: sum(max(counts[a][y], 0.0) for a in groups) / total for y in labels}
        weights, rates = {}, {}
        for a in groups:
            n_a = sum(max(v, 0.0) for v in counts[a].values())
            rates[a] = {y: (max(counts[a][y], 0.0) / n_a if n_a > 0 else p_y[y]) for y in labels}
            weights[a] = {y: float(min(w_max, p_y[y] / max(rates[a][y], 1e-6))) for y in labels}
        t = dict(target_y) if target_y else p_y
        if set(t) != set(labels) or abs(sum(t.values()) - 1.0) > 1e-6:
            raise ConfigError(f"fairness target_y must give a probability for each label {labels} summing to 1")
        return cls(sensitive=sensitive, labels=labels, target_y=t, weights=weights, group_rates=rates)

    def shift(self, group: str) -> dict[str, float]:
        """c[a] = r[a] - t: the per-group shift of the DP term (sums to 0 over the labels)."""
        if not self.group_rates or group not in self.group_rates:
            return {y: 0.0 for y in self.labels}
        return {y: self.group_rates[group][y] - self.target_y[y] for y in self.labels}


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
        # n_i: the tokens the row's LM loss averages over (labels != -100), see the module docstring
        n_tokens = (batch["labels"] != -100).sum(dim=1).clamp(min=1).tolist() if "labels" in batch else [1] * logits.shape[0]
        out = torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
        for i in range(logits.shape[0]):
            ids = input_ids[i, : int(mask[i].sum())].tolist()
            found = self.locate(ids)
            if found is None:
                continue
            y_pos, group, label = found
            logp = self.label_log_probs(logits, i, y_pos)
            term = logp.new_zeros(())
            if self.lambda_dp:
                shift = self.targets.shift(group)
                c = torch.tensor([shift[y] for y in self.labels], dtype=logp.dtype, device=logp.device)
                term = term + self.lambda_dp * (c * logp.clamp(min=LOG_FLOOR)).sum()
            if self.lambda_eo:
                k = max(-1.0, self.lambda_eo * (self.targets.weights[group][label] - 1.0))
                term = term - k * logp[self.labels.index(label)]
            out[i] = term / n_tokens[i]
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
