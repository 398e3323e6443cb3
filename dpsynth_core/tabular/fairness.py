"""Fairness regularizers for DP-SGD that close the group gap without flattening the label.

Notation: row i has sensitive values a_i = (a_i^1, ..., a_i^K) (one per attribute in
``fairness.sensitive``), label y_i and n_i target tokens (the LM loss of a row is the MEAN of its n_i
token cross-entropies, ``dpsgd.data.per_example_loss``); p_i = p_theta(Y | row i before the label) is
the generator's distribution over the labels' first tokens (renormalised over the labels); q(Y | x, a)
is the data's label distribution in context (x, a). Per attribute k, from a public or DP-estimated
|A^k| x |Y| table: r_k[a, y] = P(y | A^k = a), t[y] = P(y) (or a user-given target). Row i's penalty
is the SUM over attributes of the terms below, each with its own weight (``lambda_*: {attribute: weight}``)
or one shared weight; every term is divided by n_i, so it acts on the label token's scale whatever the
row's token count.

* **DP term (group shift)**  ``(1 / n_i) sum_k lambda_dp^k sum_y (r_k[a_i^k, y] - t[y]) log p_i(y)``.
  With the label token's own cross entropy (weight 1 / n_i in the row's mean) the gradient in the
  label logits is (p - q + sum_k lambda_dp^k c_k[a^k]) / n_i, with c_k[a] = r_k[a] - t (summing to 0
  over the labels), so the per-context optimum is
  p*(y | x, a) = q(y | x, a) - sum_k lambda_dp^k (r_k[a^k, y] - t[y]): a constant shift per group.
  One attribute: P(Y | A = a) = (1 - lambda_dp) r[a] + lambda_dp t, so the demographic-parity gap is
  multiplied by (1 - lambda_dp) (lambda_dp = 1 closes it), while p*(y | x, a) - p*(y | x', a) =
  q(y | x, a) - q(y | x', a): the label keeps its dependence on the other features. Several
  attributes: attribute k's group rate becomes (1 - lambda_dp^k) r_k[v] + lambda_dp^k t minus the
  cross term sum_{j != k} lambda_dp^j sum_b (P(A^j = b | A^k = v) - P(A^j = b)) c_j[b], which is 0 when
  the attributes are independent (then each attribute's gap is multiplied by 1 - lambda_dp^k).
  log p is floored at log(1e-4), so the term is bounded and a context whose q is below the shift
  is left at the floor (there the group rate moves less than the formula says).
* **Equalized-odds term**  ``(1 / n_i) sum_k lambda_eo^k s_i^k`` with the per-example surrogate of
  ``tabular.fair_eo``: its mean gradient is that of R_k = 1/2 sum_y sum_a P(a | y)
  ||P(Y_hat | A^k = a, Y = y) - P(Y_hat | Y = y)||^2, the spread over groups of the generator's
  conditional prediction rates, whose minimum (0) is equalized odds. Its constants come from rows
  the model being trained generates (no privacy cost; see that module).

The old DP term, lambda * CE(t, p_i) for every row, had the optimum (q + n_i lambda t) / (1 + n_i lambda):
every context pulled to one global t, which erased P(Y | x) (TSTR F1 ~ 0 at epsilon = 4).

**Privacy argument.** Each term is a function of row i's own tokens and of constants (r, t, mu)
that are public, released by an accounted DP mechanism
(:func:`dpsynth_core.tabular.dp_domain.dp_group_label_tables`, Gaussian histograms recorded in the
ledger) or computed from rows the DP model generates; using them is post-processing. No term looks
at any other row of the batch (no batch group means), so the per-example loss l_i = LM_i + penalty_i
is a function of record i alone. DP-SGD clips the gradient of l_i to norm C before summing and adding
N(0, sigma^2 C^2): the sensitivity of the noisy sum to adding or removing one record is still C, so
the DP-SGD accountant (same q, sigma, T) is unchanged. Total cost = DP-SGD epsilon + the epsilon of
the (A, Y) tables, composed in the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.constrained import RowConstraint
from dpsynth_core.tabular.schema import TableSchema


LOG_FLOOR = -9.21  # log(1e-4): the DP term stops pushing a label's probability below this
TERMS = ("dp", "eo")


@dataclass
class FairnessTargets:
    """Constants of the regularizers for one sensitive attribute (public or DP-estimated)."""

    sensitive: str
    labels: list[str]
    target_y: dict[str, float]  # t: group-independent target P(Y)
    group_rates: dict[str, dict[str, float]] | None = None  # r[a][y] = P(y | a); None: t (no shift)
    label_prior: dict[str, float] | None = None  # P(Y) of the (DP) table, whatever target_y says
    counts: dict[str, dict[str, float]] | None = None  # the (DP) table itself: pooled with the run's other releases

    @classmethod
    def from_counts(
        cls, counts: dict[str, dict[str, float]], sensitive: str, *, target_y: dict[str, float] | None = None
    ) -> FairnessTargets:
        """Build t and r from a (DP-estimated or public) contingency table counts[a][y]."""
        groups = list(counts)
        labels = list(next(iter(counts.values())))
        total = sum(max(counts[a][y], 0.0) for a in groups for y in labels)
        p_y = {y: sum(max(counts[a][y], 0.0) for a in groups) / total for y in labels}
        rates = {}
        for a in groups:
            n_a = sum(max(v, 0.0) for v in counts[a].values())
            rates[a] = {y: (max(counts[a][y], 0.0) / n_a if n_a > 0 else p_y[y]) for y in labels}
        t = dict(target_y) if target_y else p_y
        if set(t) != set(labels) or abs(sum(t.values()) - 1.0) > 1e-6:
            raise ConfigError(f"fairness target_y must give a probability for each label {labels} summing to 1")
        return cls(sensitive=sensitive, labels=labels, target_y=t, group_rates=rates, label_prior=p_y,
                   counts={a: {y: float(counts[a][y]) for y in labels} for a in groups})

    def shift(self, group: str) -> dict[str, float]:
        """c[a] = r[a] - t: the per-group shift of the DP term (sums to 0 over the labels)."""
        if not self.group_rates or group not in self.group_rates:
            return {y: 0.0 for y in self.labels}
        return {y: self.group_rates[group][y] - self.target_y[y] for y in self.labels}

    def mixed_rates(self, positive: str, mix: float) -> dict[str, float]:
        """Per group a: (1 - mix) x t(pos) + mix x r[a](pos), from parity (0) to the table's own rates (1)."""
        rates = self.group_rates or {}
        return {a: (1 - mix) * self.target_y[positive] + mix * rates[a][positive] for a in rates}


def dump_targets(targets: Sequence[FairnessTargets]) -> str:
    """``fair_targets.json``: one entry per sensitive attribute."""
    return json.dumps({"attributes": [asdict(t) for t in targets]}, indent=2)


def load_targets(text: str) -> list[FairnessTargets]:
    """Read ``fair_targets.json`` (also the one-attribute form written before several were allowed, and the
    reweighing weights that files written before lambda_reweigh's removal hold, now unused)."""
    raw = json.loads(text)
    return [FairnessTargets(**{k: v for k, v in t.items() if k != "weights"})
            for t in (raw["attributes"] if "attributes" in raw else [raw])]


def _per_attribute(weight: float | dict[str, float], attributes: list[str], name: str) -> dict[str, float]:
    out = {a: float(weight.get(a, 0.0)) if isinstance(weight, dict) else float(weight) for a in attributes}
    if any(v < 0 for v in out.values()):
        raise ConfigError(f"fairness weight lambda_{name} must be >= 0")
    return out


class FairnessPenalty:
    """``per_example_penalty(logits, batch) -> Tensor[B]`` for ``train_dp_lora``.

    Locates, in each row's target tokens, the target column's value and each sensitive column's value
    (by their forced name tokens, see ``serialize``), then applies the terms above, summed over the
    attributes. ``lambda_*``: one weight for every attribute or ``{attribute: weight}``. With an
    equalized-odds weight, ``eo`` (a :class:`~dpsynth_core.tabular.fair_eo.GeneratedRowsEO`) holds its
    constants, and ``refresh`` (called by the DP-SGD engine before each step) renews them.
    """

    def __init__(self, constraint: RowConstraint, schema: TableSchema, targets: FairnessTargets | Sequence[FairnessTargets],
                 lambda_dp: float | dict[str, float] = 0.0, lambda_eo: float | dict[str, float] = 0.0, *, eo=None):
        if schema.target is None:
            raise ConfigError(f"schema '{schema.name}': the fairness penalty needs a target column")
        self.targets = {t.sensitive: t for t in ([targets] if isinstance(targets, FairnessTargets) else targets)}
        self.attributes = list(self.targets)
        for a in self.attributes:
            if a not in schema.names:
                raise ConfigError(f"schema '{schema.name}': unknown sensitive column '{a}'")
        self.c, self.schema = constraint, schema
        self.lam = {name: _per_attribute(w, self.attributes, name)
                    for name, w in zip(TERMS, (lambda_dp, lambda_eo))}
        if any(self.lam["eo"].values()) and eo is None:
            raise ConfigError("the equalized-odds term needs its generated-rows constants (tabular.fair_eo.GeneratedRowsEO)")
        self.eo = eo
        self.labels = list(schema.column(schema.target).categories or [])
        firsts = [constraint.cat_ids[schema.target][y][0] for y in self.labels]
        if len(set(firsts)) != len(firsts):
            raise ConfigError(f"target '{schema.target}': labels must start with distinct tokens for the fairness penalty")
        self.label_first = torch.tensor(firsts)
        # The name tokens after the separator mark (" income", ":"), so a value whose last
        # punctuation BPE merged with the mark (e.g. "),") does not hide the next column; and the
        # first-position form ("income", ":").
        self._patterns = {
            name: [p for p in (constraint.forced(1, name)[1:], constraint.forced(0, name)) if p]
            for name in (schema.target, *self.attributes)
        }

    def refresh(self, model, tokenizer, step: int) -> None:
        """Before DP-SGD step ``step``: renew the equalized-odds constants from generated rows."""
        if self.eo is not None and any(self.lam["eo"].values()):
            self.eo.refresh(model, tokenizer, step)

    def _value_start(self, ids: list[int], name: str) -> int | None:
        """Index of the first value token of column ``name`` in ``ids`` (None if absent)."""
        for pat in self._patterns[name]:
            k = len(pat)
            for j in range(len(ids) - k, -1, -1):
                if ids[j : j + k] == pat:
                    return j + k
        return None

    def _group(self, ids: list[int], attribute: str) -> str | None:
        start = self._value_start(ids, attribute)
        if start is None:
            return None
        # longest match: a category whose ids are a prefix of another's must not shadow it
        matches = [(len(seq), a) for a, seq in self.c.cat_ids[attribute].items() if ids[start : start + len(seq)] == seq]
        return max(matches)[1] if matches else None

    def locate(self, ids: list[int]) -> tuple[int, dict[str, str], str] | None:
        """(position of the label's first token, {attribute: group}, label y) for one row, or None."""
        y_pos = self._value_start(ids, self.schema.target)
        if y_pos is None or y_pos >= len(ids):
            return None
        groups = {a: self._group(ids, a) for a in self.attributes}
        label = next((y for y in self.labels if ids[y_pos] == self.c.cat_ids[self.schema.target][y][0]), None)
        if label is None or any(g is None for g in groups.values()):
            return None
        return y_pos, groups, label  # type: ignore[return-value]

    def label_log_probs(self, logits: torch.Tensor, row: int, y_pos: int) -> torch.Tensor:
        """log p_theta(label first token) at the label position, renormalised over the labels."""
        lf = self.label_first.to(logits.device)
        return torch.log_softmax(logits[row, y_pos - 1, lf].float(), dim=-1)

    def row_term(self, logp: torch.Tensor, groups: dict[str, str], label: str) -> torch.Tensor:
        """The penalty of one row times n_i (``logp``: its label log-probabilities)."""
        term = logp.new_zeros(())
        for a in self.attributes:
            group, lam = groups[a], {name: self.lam[name][a] for name in TERMS}
            if lam["dp"]:
                shift = self.targets[a].shift(group)
                c = torch.tensor([shift[y] for y in self.labels], dtype=logp.dtype, device=logp.device)
                term = term + lam["dp"] * (c * logp.clamp(min=LOG_FLOOR)).sum()
            if lam["eo"]:
                term = term + lam["eo"] * self.eo.term(a, group, label, logp.exp())
        return term

    def __call__(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        input_ids, mask = batch["input_ids"], batch["attention_mask"]
        # n_i: the tokens the row's LM loss averages over (labels != -100), see the module docstring
        n_tokens = (batch["labels"] != -100).sum(dim=1).clamp(min=1).tolist() if "labels" in batch else [1] * logits.shape[0]
        out = torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
        for i in range(logits.shape[0]):
            found = self.locate(input_ids[i, : int(mask[i].sum())].tolist())
            if found is None:
                continue
            y_pos, groups, label = found
            out[i] = self.row_term(self.label_log_probs(logits, i, y_pos), groups, label) / n_tokens[i]
        return out


def group_rates(penalty: FairnessPenalty, model, batches: Sequence[dict], attribute: str | None = None) -> dict[str, float]:
    """Mean generator P(Y = positive | row before the label) per group of ``attribute`` (default: the
    first) over ``batches`` (no grad). Used by tests and diagnostics to measure the DP gap."""
    attribute = attribute or penalty.attributes[0]
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
                y_pos, groups, _ = found
                p = penalty.label_log_probs(logits, i, y_pos).exp()[pos].item()
                sums.setdefault(groups[attribute], []).append(p)
    return {a: sum(v) / len(v) for a, v in sums.items()}
