"""An equalized-odds regularizer for DP-SGD whose constants come from rows the model generates.

Notation: a row has sensitive value a, true label y, and the generator's label distribution
p(. | row before the label) = p (a vector over the K labels; the "prediction" Y_hat ~ p). For a set of
rows, G[a, y] = mean of p over the rows with A = a, Y = y (P(Y_hat = k | A = a, Y = y) for each k) and
G_bar[y] = sum_a P(a | y) G[a, y] (the same mean over every row with Y = y). The regularizer is

    R = 1/2 * sum_y sum_a P(a | y) * || G[a, y] - G_bar[y] ||^2

the P(a | y)-weighted variance over groups of the conditional prediction rates, for each y.

* R = 0 exactly when P(Y_hat | A = a, Y = y) is the same for every group a (with rows) and every y:
  equalized odds of the generator's own classifier; R > 0 otherwise.
* Bounded: two probability vectors are at most sqrt(2) apart, so R <= |Y| (binary: R <= 1/2 after
  the two labels' equal contributions; :func:`eo_objective` computes it).
* Its gradient, with mu[a, y] = G[a, y] - G_bar[y] (the G_bar terms cancel as sum_a P(a | y) mu = 0):
      dR = (1 / N) * sum_i (mu[a_i, y_i] / P(y_i)) . dp_i
  a sum of PER-ROW terms. So the per-example surrogate  s_i = (mu[a_i, y_i] / P(y_i)) . p_i  with mu held
  constant has, averaged over the rows, exactly the gradient of R (``test_tabular_fair_eo``).

**Which rows, and why (privacy).** mu needs group means of the model's predictions: over the private
rows that is a statistic of the whole batch, so a per-example loss using it would let one record
move every other record's term (unbounded sensitivity), and releasing it would cost budget. Here mu
is computed on ``rows`` rows the CURRENT model generates (``refresh`` is called by the DP-SGD engine
before a step, every ``refresh_every`` steps): a function of the DP model alone (DP-SGD's accountant
covers every intermediate model, as each step's update is released) and of a public sampling seed,
so post-processing, no privacy cost and nothing in the ledger. The surrogate then acts per example on the private rows,
s_i depends on record i and on constants only, and DP-SGD clips the gradient of (LM_i + penalty_i)
to C as for any per-example loss, so the accountant is unchanged. P(y) is the label marginal of the
DP (A, Y) table (already in the ledger), floored at ``MIN_LABEL_PRIOR`` so the weight is bounded.
What the term equalises is the rates under the generator's own joint distribution, which DP-SGD
pulls towards the data's; mu is at most ``refresh_every`` steps stale.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MIN_LABEL_PRIOR = 0.05  # P(y) floor in the surrogate's weight 1 / P(y): the term stays bounded
MIN_CELL_ROWS = 2  # a (group, label) cell with fewer generated rows gets mu = 0 (no estimate)


def eo_duals(probs: torch.Tensor, groups: Sequence[str], labels: Sequence[int], *, min_rows: int = 1
             ) -> dict[tuple[str, int], torch.Tensor]:
    """mu[(a, y)] = G[a, y] - G_bar[y] (a vector over the K labels) for the cells with >= min_rows rows."""
    probs = probs.detach().float()
    y_t = torch.as_tensor(list(labels))
    mu = {}
    for y in sorted(set(labels)):
        rows_y = y_t == y
        g_bar = probs[rows_y].mean(0)
        for a in sorted(set(g for g, yy in zip(groups, labels) if yy == y)):
            cell = rows_y & torch.as_tensor([g == a for g in groups])
            if int(cell.sum()) >= min_rows:
                mu[(a, y)] = probs[cell].mean(0) - g_bar
    return mu


def eo_objective(probs: torch.Tensor, groups: Sequence[str], labels: Sequence[int]) -> torch.Tensor:
    """R on a set of rows (differentiable in ``probs`` [N, K]): 0 iff every group's P(Y_hat | A, Y) is equal."""
    y_t = torch.as_tensor(list(labels))
    total = probs.new_zeros(())
    for y in sorted(set(labels)):
        rows_y = y_t == y
        n_y = int(rows_y.sum())
        g_bar = probs[rows_y].mean(0)
        for a in sorted(set(g for g, yy in zip(groups, labels) if yy == y)):
            cell = rows_y & torch.as_tensor([g == a for g in groups])
            total = total + 0.5 * (int(cell.sum()) / n_y) * ((probs[cell].mean(0) - g_bar) ** 2).sum()
    return total


def eo_gap(probs: torch.Tensor, groups: Sequence[str], labels: Sequence[int]) -> float:
    """The largest spread over groups of P(Y_hat = k | A, Y = y), over y and k (fairlearn's EO difference, soft)."""
    y_t = torch.as_tensor(list(labels))
    gap = 0.0
    for y in sorted(set(labels)):
        rates = [probs[(y_t == y) & torch.as_tensor([g == a for g in groups])].mean(0)
                 for a in sorted(set(g for g, yy in zip(groups, labels) if yy == y))]
        if len(rates) > 1:
            stacked = torch.stack(rates)
            gap = max(gap, float((stacked.max(0).values - stacked.min(0).values).max()))
    return gap


def eo_surrogate(probs: torch.Tensor, mu: torch.Tensor, label_prior: torch.Tensor) -> torch.Tensor:
    """Per-row s_i = (mu_i / P(y_i)) . p_i with mu_i, P(y_i) constants: mean_i ds_i = dR (see the module docstring)."""
    return (mu.detach() / label_prior.clamp(min=MIN_LABEL_PRIOR)[:, None] * probs).sum(-1)


class GeneratedRowsEO:
    """The dual constants mu of one or more sensitive attributes, refreshed from rows the model generates.

    ``refresh(model, tokenizer, step)`` (called by the DP-SGD engine before each step) samples ``rows``
    rows under constrained decoding every ``refresh_every`` steps and recomputes mu per attribute.
    """

    def __init__(self, constraint, attributes: Sequence[str], label_prior: dict[str, float], *,
                 rows: int = 32, refresh_every: int = 5, seed: int = 0):
        self.c, self.attributes = constraint, list(attributes)
        schema = constraint.serializer.schema
        self.target = schema.target
        self.labels = list(schema.column(self.target).categories or [])
        self.label_first = [constraint.cat_ids[self.target][y][0] for y in self.labels]
        self.prior = torch.tensor([max(label_prior.get(y, 0.0), MIN_LABEL_PRIOR) for y in self.labels])
        self.rows, self.refresh_every, self.seed = rows, refresh_every, seed
        self.mu: dict[str, dict[tuple[str, int], torch.Tensor]] = {a: {} for a in self.attributes}
        self.refreshed_at: list[int] = []
        self.history: list[dict] = []

    def set_from_rows(self, probs: torch.Tensor, groups: dict[str, list[str]], labels: list[int]) -> None:
        for a in self.attributes:
            self.mu[a] = eo_duals(probs, groups[a], labels, min_rows=MIN_CELL_ROWS)

    def term(self, attribute: str, group: str, label: str, probs: torch.Tensor) -> torch.Tensor:
        """s_i for one row (``probs``: its label distribution, differentiable)."""
        mu = self.mu[attribute].get((group, self.labels.index(label)))
        if mu is None:
            return probs.new_zeros(())
        return (mu.to(probs.device, probs.dtype) / self.prior[self.labels.index(label)] * probs).sum()

    def refresh(self, model, tokenizer, step: int) -> None:
        if step % self.refresh_every:
            return
        probs, groups, labels = self.sample(model, tokenizer, step)
        if len(labels):
            self.set_from_rows(probs, groups, labels)
        self.refreshed_at.append(step)
        # the generator's own soft EO gap per attribute on these rows (generated, so loggable)
        self.history.append({"step": step, "rows": len(labels),
                             **{f"eo_gap_{a}": eo_gap(probs, groups[a], labels) if labels else None for a in self.attributes}})

    def sample(self, model, tokenizer, step: int) -> tuple[torch.Tensor, dict[str, list[str]], list[int]]:
        """``rows`` rows from the current model: label distributions, groups per attribute, sampled labels."""
        from transformers import LogitsProcessorList

        from dpsynth_core.engines import SamplingParams
        from dpsynth_core.engines.hf_engine import HFEngine
        from dpsynth_core.tabular.constrained import ConstrainedRowProcessor

        ser = self.c.serializer
        orders = [ser.order_for_row() if ser.random_order else ser.names for _ in range(self.rows)]
        was_training, side = model.training, tokenizer.padding_side
        tokenizer.padding_side = "left"
        model.eval()
        try:
            proc = ConstrainedRowProcessor(self.c, orders, record_logits_for=[self.target])
            params = SamplingParams(max_new_tokens=max(self.c.max_row_tokens(o) for o in orders),
                                    temperature=1.0, top_p=1.0, seed=(self.seed * 100003 + step) % 2**63)
            # sampling from the DP model is post-processing: a public seed; the global RNG is left as it was
            with torch.random.fork_rng(devices=[]):
                texts = HFEngine.from_loaded(model, tokenizer).generate_processed(
                    [ser.prompt(o) for o in orders], params, LogitsProcessorList([proc]))
        finally:
            tokenizer.padding_side = side
            model.train(was_training)
        probs, groups, labels = [], {a: [] for a in self.attributes}, []
        for text, state, order in zip(texts, proc.states, orders):
            logits = state.value_start_logits.get(self.target)
            try:
                row = ser.parse(text, order)
            except Exception:  # noqa: BLE001 - an unparsable generated row is skipped
                continue
            if logits is None:
                continue
            probs.append(torch.softmax(logits[self.label_first].float(), -1))
            labels.append(self.labels.index(row[self.target]))
            for a in self.attributes:
                groups[a].append(str(row[a]))
        return (torch.stack(probs) if probs else torch.zeros(0, len(self.labels))), groups, labels
