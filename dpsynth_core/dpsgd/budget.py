"""The privacy plan of a DP-SGD stage: unit count, delta, sampling rate, calibrated noise.

Everything here runs before any private text is read (only the number of privacy units is used,
which DP-SGD accounting treats as public), and ``ledger.check`` is called here, so a stage that
would exceed the budget fails before touching data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpsynth_core.dpsgd.config import DpSgdConfig, TrainExample
from dpsynth_core.dpsgd.sampling import PrivacyUnits
from dpsynth_core.errors import ConfigError


@dataclass(frozen=True)
class PrivacyPlan:
    noise_multiplier: float
    sampling_rate: float
    delta: float
    steps: int
    n_units: int
    user_level: bool
    target_epsilon: float
    accountant: str

    def event(self, steps: int | None = None):
        """The ledger event for ``steps`` steps (default: the planned number)."""
        from dpsynth_core.privacy import DpSgdEvent

        return DpSgdEvent(
            noise_multiplier=self.noise_multiplier,
            sampling_rate=self.sampling_rate,
            steps=self.steps if steps is None else int(steps),
        )

    def epsilon_after(self, steps: int) -> float:
        """Epsilon spent after ``steps`` steps (0 before the first)."""
        if steps <= 0:
            return 0.0
        from dpsynth_core.privacy import epsilon_dpsgd

        return float(
            epsilon_dpsgd(self.sampling_rate, self.noise_multiplier, int(steps), self.delta, accountant=self.accountant)
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def public_size(config: DpSgdConfig, n_units: int) -> int:
    """The data set size the accounting may state: the public expected size of a secret subsample
    when the config gives one, else the training set's own size."""
    return int(config.public_num_units or n_units)


def sampling_rate(config: DpSgdConfig, n_units: int) -> float:
    """Poisson rate q: expected batch over the public size (capped at 1)."""
    return min(1.0, config.expected_batch_size / public_size(config, n_units))


def resolve_delta(config: DpSgdConfig, n_units: int, ledger=None) -> float:
    if ledger is not None:
        delta = float(ledger.delta)
        if config.delta is not None and not math.isclose(config.delta, delta, rel_tol=1e-9):
            raise ConfigError(
                f"field 'delta': config says {config.delta} but the run's privacy ledger uses {delta}; "
                "drop 'delta' from the config or make them equal"
            )
    elif config.delta is not None:
        delta = float(config.delta)
    else:
        from dpsynth_core.privacy import default_delta

        delta = float(default_delta(max(n_units, 2)))
    from dpsynth_core.privacy import check_delta_for_size

    return float(check_delta_for_size(delta, n_units))


def plan_privacy(
    config: DpSgdConfig,
    examples: Sequence[TrainExample],
    *,
    ledger=None,
    stage: str = "dpsgd",
) -> PrivacyPlan:
    """Validate the budget-related config, calibrate sigma, and ``ledger.check`` the event."""
    units = PrivacyUnits.from_user_ids([e.user_id for e in examples])
    return plan_for_units(config, len(units), units.user_level, ledger=ledger, stage=stage)


def plan_for_units(config: DpSgdConfig, n: int, user_level: bool, *, ledger=None, stage: str = "dpsgd") -> PrivacyPlan:
    """``plan_privacy`` from the number of privacy units alone (what the run loop plans with before the stage runs)."""
    if n == 0:
        raise ConfigError("no training examples: the training data is empty")
    unit_name = "users" if user_level else "examples"
    n_public = public_size(config, n)
    if config.expected_batch_size > n_public:
        raise ConfigError(
            f"field 'expected_batch_size': {config.expected_batch_size} is larger than the number of "
            f"training {unit_name}" + ("" if config.public_num_units else f" ({n})")
        )
    delta = resolve_delta(config, n_public, ledger)
    from dpsynth_core.dpsgd.lora_targets import validate_target_modules

    validate_target_modules(config)
    q = sampling_rate(config, n)
    from dpsynth_core.privacy import calibrate_noise_multiplier

    sigma = float(calibrate_noise_multiplier(config.epsilon, delta, q, config.steps, accountant=config.accountant))
    plan = PrivacyPlan(
        noise_multiplier=sigma,
        sampling_rate=q,
        delta=delta,
        steps=config.steps,
        n_units=n,
        user_level=user_level,
        target_epsilon=config.epsilon,
        accountant=config.accountant,
    )
    if ledger is not None:
        plan = fit_to_ledger(plan, ledger, fill=config.fill_budget)
        ledger.check(stage, plan.event())  # raises BudgetExceededError before any data is read
    return plan


def calibrated_to_reservation(plan: PrivacyPlan, reserved) -> PrivacyPlan:
    """The stage's plan with the noise of the event the run loop reserved for it (``run_loop.reserve``); its
    sampling rate and steps must be the reserved ones, else the stage would spend what was not reserved."""
    import dataclasses

    if (reserved.kind != "dpsgd" or reserved.steps != plan.steps
            or not math.isclose(reserved.sampling_rate, plan.sampling_rate, rel_tol=1e-12)):
        raise ConfigError(f"the DP-SGD stage plans {plan.event()}, not the reserved {reserved}: refusing to train")
    return dataclasses.replace(plan, noise_multiplier=float(reserved.noise_multiplier))


def fit_to_ledger(plan: PrivacyPlan, ledger, rel_tol: float = 1e-3, fill: bool = False) -> PrivacyPlan:
    """Adjust the noise so that the stage, composed with what the ledger already holds, fits the budget.

    Composition at one delta is not additive: AIM's zCDP at eps1 plus DP-SGD at eps2 can compose to
    more than eps1 + eps2 at the same delta. Rather than refuse a split such as 1.3 / 2.7 of 4, the
    noise multiplier is raised (bisection on the ledger's own composition) until the projected total
    fits the budget. A stage whose own target does not fit what is left even by plain addition is
    left to ``ledger.check`` to refuse.

    Composition is also often *sub*-additive (PLD of several Gaussians), so a last stage calibrated
    to "what is left" leaves budget unspent. With ``fill`` the noise is lowered until the projected
    total reaches the budget (within ``rel_tol``, never above it): searched on the ledger's faster upper
    bound, then checked, and finished if needed, on its exact composition. Without it the noise never goes
    below the stage's own calibration.
    """
    import dataclasses
    import functools

    from dpsynth_core.privacy.accountants import bisect_noise_multiplier

    budget = ledger.epsilon_budget * (1.0 - rel_tol)

    def at(sigma: float) -> PrivacyPlan:
        return dataclasses.replace(plan, noise_multiplier=sigma)

    @functools.lru_cache(maxsize=None)  # each call composes the whole ledger (PLD: ~1 s)
    def projected(sigma: float) -> float:
        return ledger.projected_epsilon(at(sigma).event())

    @functools.lru_cache(maxsize=None)
    def upper_bound(sigma: float) -> float:  # a few times faster; checked with ``projected`` before use
        return ledger.projected_epsilon(at(sigma).event(), upper_bound=True)

    floor, sigma0 = budget * (1.0 - 2 * rel_tol), plan.noise_multiplier
    if fill and (upper_bound(sigma0) < floor or projected(sigma0) < floor):  # budget left unspent: lower the noise
        sigma = _filled_noise(upper_bound, sigma0, budget, floor) if upper_bound(sigma0) <= budget else None
        if sigma is not None and projected(sigma) < floor:  # the bound was loose here: finish on the exact figure
            sigma = _filled_noise(projected, sigma, budget, floor)
        if sigma is None or projected(sigma) > budget:  # rounding put the bound below the exact figure
            sigma = _filled_noise(projected, sigma0, budget, floor) if projected(sigma0) <= budget else None
        if sigma is None:  # noise this small is not a real plan: keep the stage's own calibration
            return plan
        return dataclasses.replace(at(sigma), target_epsilon=at(sigma).epsilon_after(plan.steps))
    if projected(sigma0) <= ledger.epsilon_budget:
        return plan
    if ledger.total_epsilon() + plan.target_epsilon > ledger.epsilon_budget * (1.0 + 1e-9):
        return plan  # asks for more than is left: a config error, refused, not silently noisier

    lo, hi = plan.noise_multiplier, plan.noise_multiplier * 2.0
    while projected(hi) > budget:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:  # the other stages already use up the budget: let ledger.check refuse
            return plan
    return at(bisect_noise_multiplier(projected, lo, hi, budget))


def _filled_noise(eps_of, sigma: float, budget: float, floor: float) -> float | None:
    """A noise multiplier below ``sigma`` with ``floor <= eps_of <= budget`` (or the closest from below the
    budget), given ``eps_of(sigma) <= budget``; None when it would have to go below 1e-3."""
    from dpsynth_core.privacy.accountants import interpolate_noise_multiplier

    lo, hi = sigma * 0.9, sigma
    while eps_of(lo) <= budget:
        lo, hi = lo * 0.5, lo
        if lo < 1e-3:
            return None
    return interpolate_noise_multiplier(eps_of, lo, hi, budget, floor=floor)
