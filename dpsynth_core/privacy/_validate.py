"""Argument checks shared by the privacy modules: one clear message per bad value."""

from __future__ import annotations

import math

from dpsynth_core.errors import ConfigError


class PrivacyParameterError(ConfigError, ValueError):
    """A privacy parameter (epsilon, delta, sigma, q, steps, rho) is out of its valid range.

    Subclasses both ``ConfigError`` (so the CLI prints one red line) and ``ValueError``
    (so numeric callers can catch the usual exception).
    """


def _finite(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise PrivacyParameterError(f"{name} must be finite, got {value}")
    return value


def check_delta(delta: float) -> float:
    """delta must lie strictly between 0 and 1."""
    delta = _finite("delta", delta)
    if not 0.0 < delta < 1.0:
        raise PrivacyParameterError(f"delta must be in (0, 1), got {delta}")
    return delta


def check_positive(name: str, value: float) -> float:
    """A strictly positive finite number (noise multiplier, epsilon, rho)."""
    value = _finite(name, value)
    if value <= 0.0:
        raise PrivacyParameterError(f"{name} must be > 0, got {value}")
    return value


def check_sampling_rate(q: float) -> float:
    """Poisson sampling rate in (0, 1]."""
    q = _finite("sampling_rate", q)
    if not 0.0 < q <= 1.0:
        raise PrivacyParameterError(f"sampling_rate must be in (0, 1], got {q}")
    return q


def check_count(name: str, value: int) -> int:
    """A whole number >= 1 (steps, compositions)."""
    if isinstance(value, bool) or not float(value).is_integer():
        raise PrivacyParameterError(f"{name} must be a whole number >= 1, got {value!r}")
    value = int(value)
    if value < 1:
        raise PrivacyParameterError(f"{name} must be >= 1, got {value}")
    return value


def check_delta_for_size(delta: float, n: int, field: str = "delta") -> float:
    """delta must be below 1/n: a larger delta allows a mechanism that releases a whole record.

    The message does not state n (under add/remove adjacency the size of the private file is
    itself private information).
    """
    delta = check_delta(delta)
    if n >= 1 and delta >= 1.0 / n:
        raise PrivacyParameterError(
            f"field '{field}': delta = {delta:g} is not below 1/n for this private data set "
            "(a delta that large permits releasing a record in the clear); leave it unset for the default min(1e-5, n^-1.1)"
        )
    return delta


def default_delta(m: int) -> float:
    """The default delta for a public working-set size ``m`` (records, or users): min(1e-5, m^-1.1).

    m * delta, roughly the expected number of records a delta-event could expose, then stays below
    m^-0.1 and below 1e-5 * m (the old 1/(m ln m) left m * delta = 1/ln m, 0.15 at m = 1,000)."""
    if isinstance(m, bool) or not float(m).is_integer() or m < 2:
        raise ConfigError(f"default_delta needs a data set size m >= 2, got {m!r}")
    return min(1e-5, float(m) ** -1.1)
