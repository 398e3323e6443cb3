"""Privacy events: what one stage did to the private data, in numbers the ledger can compose.

Each event is a frozen pydantic model with a ``kind`` tag; ``to_dp_event()`` gives the matching
dp_accounting ``DpEvent`` and ``epsilon(delta)`` the event's cost if it were the only one.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dpsynth_core.privacy.accountants import dpsgd_dp_event, epsilon_dpsgd
from dpsynth_core.privacy.gaussian import gaussian_epsilon
from dpsynth_core.privacy.zcdp import zcdp_to_epsilon


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def params(self) -> dict[str, Any]:
        """The event's parameters (without ``kind``), as stored in the ledger."""
        return self.model_dump(exclude={"kind"})

    def to_dp_event(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def epsilon(self, delta: float) -> float:  # pragma: no cover - overridden
        """Epsilon at ``delta`` of this event alone."""
        raise NotImplementedError


class DpSgdEvent(_Event):
    """DP-SGD: ``steps`` Poisson-subsampled Gaussian steps; noise_multiplier = sigma / clip norm."""

    kind: Literal["dpsgd"] = "dpsgd"
    noise_multiplier: float = Field(gt=0)
    sampling_rate: float = Field(gt=0, le=1)
    steps: int = Field(ge=1)

    def to_dp_event(self):
        return dpsgd_dp_event(self.sampling_rate, self.noise_multiplier, self.steps)

    def epsilon(self, delta: float) -> float:
        return epsilon_dpsgd(self.sampling_rate, self.noise_multiplier, self.steps, delta, "pld")


class GaussianEvent(_Event):
    """Plain Gaussian mechanism (no subsampling) released ``compositions`` times;
    noise_multiplier = sigma / L2 sensitivity (e.g. PE / WASP voting histograms)."""

    kind: Literal["gaussian"] = "gaussian"
    noise_multiplier: float = Field(gt=0)
    compositions: int = Field(default=1, ge=1)

    def to_dp_event(self):
        import dp_accounting

        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(self.noise_multiplier), self.compositions
        )

    def epsilon(self, delta: float) -> float:
        return gaussian_epsilon(self.noise_multiplier, self.compositions, delta)

    @property
    def rho(self) -> float:
        """The exact zCDP parameter: T / (2 s^2)."""
        return self.compositions / (2.0 * self.noise_multiplier**2)


class ZCdpEvent(_Event):
    """A rho-zCDP mechanism (e.g. AIM). Not PLD-representable: the ledger bounds it (see ledger)."""

    kind: Literal["zcdp"] = "zcdp"
    rho: float = Field(gt=0)

    def to_dp_event(self):
        import dp_accounting

        return dp_accounting.ZCDpEvent(self.rho)

    def epsilon(self, delta: float) -> float:
        return zcdp_to_epsilon(self.rho, delta)


class PostProcessingEvent(_Event):
    """A stage that saw no private data (only DP outputs): zero cost."""

    kind: Literal["post_processing"] = "post_processing"

    def to_dp_event(self):
        import dp_accounting

        return dp_accounting.NoOpDpEvent()

    def epsilon(self, delta: float) -> float:
        return 0.0


_BaseEvent = Annotated[Union[DpSgdEvent, GaussianEvent, ZCdpEvent], Field(discriminator="kind")]
_SELECTION_SHAPES = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}


def rdp_orders() -> tuple[float, ...]:
    """The RDP orders every composition uses: dp_accounting's default orders plus a geometric grid for
    zCDP / Gaussian optima in between."""
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    extra = [float(x) for x in np.round(np.geomspace(1.02, 200.0, 80), 4)]
    return tuple(sorted(set(float(o) for o in DEFAULT_RDP_ORDERS) | set(extra)))


def rdp_curve(events, orders) -> np.ndarray:
    """RDP epsilon at each order of ``events`` composed (RDP adds per order)."""
    from dp_accounting.rdp import RdpAccountant

    total = np.zeros(len(orders), dtype=np.float64)
    for event in events:
        if isinstance(event, SelectionEvent):
            total += event.rdp_curve(orders)
        elif not isinstance(event, PostProcessingEvent):
            accountant = RdpAccountant(list(orders))
            accountant.compose(event.to_dp_event())
            total += np.asarray(accountant.rdp, dtype=np.float64)
    return total


class SelectionEvent(_Event):
    """DP hyperparameter selection (Papernot & Steinke, ICLR 2022): K ~ D(mean) independent trials,
    each drawing a configuration at random from ``candidates`` (each candidate = the events one
    trial spends), and only the best trial released.

    A trial with a random configuration is a mixture of mechanisms; Renyi divergence is jointly
    quasi-convex, so the trial's RDP curve is at most the pointwise max over the candidates'
    curves. The repeat-and-select bound (their Thms 2 and 6) is dp_accounting's. RDP only: the
    ledger composes a selection with other events in RDP.
    """

    kind: Literal["dp_selection"] = "dp_selection"
    candidates: tuple[tuple[_BaseEvent, ...], ...] = Field(min_length=1)
    mean_trials: float = Field(ge=1.0)
    distribution: Literal["poisson", "geometric", "logarithmic"] = "poisson"

    def rdp_curve(self, orders) -> np.ndarray:
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        inner = np.max(np.stack([rdp_curve(c, orders) for c in self.candidates]), axis=0)
        # private helper of dp_accounting: the published repeat-and-select transform
        return np.asarray(
            rdp._compute_rdp_repeat_and_select(
                np.asarray(orders), inner, self.mean_trials, _SELECTION_SHAPES[self.distribution]
            ),
            dtype=np.float64,
        )

    def to_dp_event(self):
        raise NotImplementedError("a selection over several candidates has no single DpEvent; use rdp_curve")

    def epsilon(self, delta: float) -> float:
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        orders = rdp_orders()
        eps, _ = rdp.compute_epsilon(orders, self.rdp_curve(orders), delta)
        return float(eps)


PrivacyEvent = Annotated[
    Union[DpSgdEvent, GaussianEvent, ZCdpEvent, PostProcessingEvent, SelectionEvent], Field(discriminator="kind")
]
_EVENT_ADAPTER = TypeAdapter(PrivacyEvent)
EVENT_KINDS = ("dpsgd", "gaussian", "zcdp", "post_processing", "dp_selection")


def event_from_dict(kind: str, params: dict[str, Any]):
    """Rebuild an event from its stored ``kind`` and ``params``."""
    return _EVENT_ADAPTER.validate_python({"kind": kind, **params})
