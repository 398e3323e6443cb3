"""The accountants' shortcuts give dp_accounting's figures exactly: the shared one-step PLD, the weak-privacy
check on a few RDP orders, and the bisection that skips midpoints it already knows the answer to."""

from __future__ import annotations

import math

import pytest

from dpsynth_core.privacy import accountants


@pytest.mark.parametrize("q,sigma,steps", [(0.25, 0.71, 1), (0.25, 0.71, 3), (0.01, 1.0, 40)])
def test_pld_epsilon_is_the_pld_accountants_float(q, sigma, steps):
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    accountant.compose(accountants.dpsgd_dp_event(q, sigma, steps))
    assert accountants._pld_epsilon(q, sigma, steps, 1e-5, 1e-3) == accountant.get_epsilon(1e-5)


def test_weak_privacy_check_decides_as_the_full_rdp_curve():
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    assert set(accountants._WEAK_CHECK_ORDERS) <= set(DEFAULT_RDP_ORDERS)  # a subset: its minimum is never lower
    # both sides of WEAK_PRIVACY_EPSILON, and the weak case the shortcut cannot settle alone
    for q, sigma, steps in [(0.01, 1.0, 100), (0.1, 0.3, 10), (0.01, 0.02, 1000), (1.0, 0.1, 1)]:
        full = accountants._rdp_epsilon(q, sigma, steps, 1e-5)
        assert accountants._is_weak_privacy(q, sigma, steps, 1e-5) == (full > accountants.WEAK_PRIVACY_EPSILON)
    weak = accountants._is_weak_privacy
    assert weak(0.01, 0.02, 1000, 1e-5) and not weak(0.01, 1.0, 100, 1e-5)


def _counted(eps_of):
    calls: dict[float, float] = {}

    def wrapped(sigma: float) -> float:
        if sigma not in calls:
            calls[sigma] = eps_of(sigma)
        return calls[sigma]

    return wrapped, calls


@pytest.mark.parametrize("shape", ["power", "exponential", "flattening"])
@pytest.mark.parametrize("where", [0.01, 0.3, 0.97])
def test_bisection_returns_the_plain_bisections_sigma_in_fewer_calls(shape, where):
    """flattening: a composed total that tends to the other stages' epsilon (the ledger fit's case)."""
    eps_of = {"power": lambda s: 2.0 * s**-3, "exponential": lambda s: 20.0 * math.exp(-2.5 * s),
              "flattening": lambda s: 1.3 + 3.0 * s**-2}[shape]
    lo, hi = 0.7, 1.4
    target = eps_of(lo * (hi / lo) ** where)
    plain, plain_calls = _counted(eps_of)
    fast, fast_calls = _counted(eps_of)
    expected = accountants._plain_bisection(plain, lo, hi, target)
    assert accountants.bisect_noise_multiplier(fast, lo, hi, target) == expected
    assert eps_of(expected) <= target and len(plain_calls) >= 11
    assert len(fast_calls) <= 2 + 8  # the two ends (cached by callers) and at most 8 new calls


def test_bisection_falls_back_to_plain_where_eps_is_not_monotone(monkeypatch):
    """eps over the target in a narrow band just above the crossing: the midpoint the shortcut settles without a
    call lies in the band, its final check fails, and the plain bisection's sigma (one it evaluated) is returned."""
    smooth = lambda s: 2.0 * s**-3  # noqa: E731
    target = smooth(1.1)
    bumpy = lambda s: target * 1.01 if 1.10017 < s < 1.1003 else smooth(s)  # noqa: E731
    plain = accountants._plain_bisection
    fallbacks = []
    monkeypatch.setattr(accountants, "_plain_bisection", lambda *args: fallbacks.append(args) or plain(*args))
    sigma = accountants.bisect_noise_multiplier(bumpy, 0.7, 1.4, target)
    assert fallbacks and sigma == plain(bumpy, 0.7, 1.4, target) and bumpy(sigma) <= target
