"""Privacy of hyperparameter tuning (Ray-free; the Tune runner lives in ``ray_jobs/sweep.py``).

Choosing hyperparameters by looking at results computed on private data leaks privacy, even
when every trial is DP: the best-of-K selection is itself a function of the data. A sweep is
therefore allowed in two cases only:

* ``data: public`` -- trials read a public or proxy data set; tuning costs the private data
  nothing (the chosen configuration is then run once on the private data, accounted as usual).
* ``data: private`` with ``selection: random_trials`` -- DP hyperparameter selection of
  Papernot & Steinke (ICLR 2022): the number of trials K is random (Poisson with mean mu, or a
  truncated negative binomial), each trial draws its hyperparameters independently at random
  (no adaptive search: ASHA/Optuna are refused here), and only the best trial's output is
  released. If one trial (with its random hyperparameters) is (lambda, eps(lambda))-RDP, the
  whole procedure is RDP with the bound of their Theorems 2 and 6, computed here with
  dp_accounting. A trial with random hyperparameters is a mixture of mechanisms; Renyi
  divergence is jointly quasi-convex, so its RDP curve is bounded by the pointwise max over
  the candidates' curves.

What the theorem assumes, and where it is enforced:

* the trials are ranked by a score that is DP or computed without private data
  (``tuning.metrics``); a MAUVE against private texts is neither;
* K and the trials' hyperparameters are drawn from OS entropy (``draw_num_trials``,
  ``tuning.space.draw_configurations``), i.i.d. and independent of the data and of the config
  seed; K is never written anywhere released;
* the per-trial bound holds over the whole declared space, computed before launch
  (``tuning.plan.bound_sweep``), and the sweep is refused when it exceeds the budget;
* only the best trial is released, its ledger holding the selection event
  (``tuning.release``).

Anything else (private data, no DP selection) is refused before a trial starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig
from dpsynth_core.errors import ConfigError



class TuningPrivacy(StrictConfig):
    """How a sweep protects the private data."""

    data: Literal["public", "private"]
    selection: Literal["none", "random_trials"] = "none"
    mean_trials: float = Field(4.0, ge=1.0, description="Mean number of trials (mu).")
    distribution: Literal["poisson", "geometric", "logarithmic"] = "poisson"
    epsilon_budget: float | None = Field(None, gt=0, description="Budget of the whole DP sweep.")

    @model_validator(mode="after")
    def _consistent(self):
        if self.data == "private" and self.selection == "random_trials" and self.epsilon_budget is None:
            raise ValueError("a DP sweep on private data needs 'epsilon_budget'")
        return self

    @property
    def shape(self) -> float:
        return {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}[self.distribution]


def check_sweep_allowed(privacy: TuningPrivacy, search: str, scheduler: str, pipeline: str, metric: str) -> None:
    """Refuse a sweep that would leak the private data through the choice of hyperparameters."""
    from dpsynth_core.tuning.metrics import check_private_ranking_metric

    if privacy.data == "public":
        return
    if privacy.selection != "random_trials":
        raise ConfigError(
            "refusing a hyperparameter sweep on private data without DP selection: either tune on a "
            "public/proxy data set (privacy.data: public) or use privacy.selection: random_trials "
            "(Papernot & Steinke 2022), whose cost is recorded in the ledger"
        )
    if search != "random" or scheduler != "fifo":
        raise ConfigError(
            f"DP hyperparameter selection needs independent random trials run to completion: "
            f"search '{search}' / scheduler '{scheduler}' adapt to private results; use search: random, scheduler: fifo"
        )
    check_private_ranking_metric(pipeline, metric)


def draw_num_trials(privacy: TuningPrivacy, rng: np.random.Generator | None = None) -> int:
    """Draw K from OS entropy (``rng`` is for tests only). K is part of the mechanism's secret
    randomness: a K drawn from the public config seed would let an adversary know how many
    trials competed. Poisson may give 0 trials: then nothing is released."""
    from dpsynth_core.privacy.randomness import secure_rng

    rng = rng if rng is not None else secure_rng()
    mu = privacy.mean_trials
    if privacy.distribution == "poisson":
        return int(rng.poisson(mu))
    if privacy.distribution == "geometric":
        return int(rng.geometric(1.0 / mu))
    # logarithmic with mean mu: solve for p by bisection, then sample
    lo, hi = 1e-12, 1 - 1e-12
    for _ in range(200):
        p = (lo + hi) / 2
        mean = -p / ((1 - p) * math.log(1 - p))
        lo, hi = (p, hi) if mean < mu else (lo, p)
    return int(rng.logseries(p))


def selection_event(trial_events: Sequence[Sequence], privacy: TuningPrivacy):
    """The ledger event of a DP sweep: one candidate per distinct trial configuration."""
    from dpsynth_core.privacy import SelectionEvent

    if not trial_events:
        raise ValueError("no trial events")
    distinct = []
    for events in trial_events:
        key = tuple(e for e in events if e.kind != "post_processing")
        if key not in distinct:
            distinct.append(key)
    return SelectionEvent(candidates=tuple(distinct), mean_trials=privacy.mean_trials, distribution=privacy.distribution)


def repeat_and_select_epsilon(trial_events: Sequence[Sequence], privacy: TuningPrivacy, delta: float) -> float:
    """(eps at delta) of releasing the best of K random trials (see ``SelectionEvent``)."""
    return selection_event(trial_events, privacy).epsilon(delta)


def single_trial_epsilon(events: Sequence, delta: float) -> float:
    """RDP epsilon of one trial alone (for comparison with the tuning cost)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from dpsynth_core.privacy.events import rdp_curve, rdp_orders

    orders = rdp_orders()
    eps, _ = rdp.compute_epsilon(orders, rdp_curve(events, orders), delta)
    return float(eps)
