"""`dpsynth privacy epsilon|calibrate|zcdp`: accountants and noise calibration from the shell."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager

import typer

app = typer.Typer(help="Privacy accounting: epsilon of a DP-SGD run, noise calibration.", no_args_is_help=True)

_ACCOUNTANT_HELP = "pld (Google dp-accounting, tightest), rdp, prv (Microsoft), or all."
MAX_STEPS = 10_000_000  # beyond any training run; the tight accountants take minutes there
_TIME_LIMIT = typer.Option(20.0, "--time-limit", min=0.1, max=3600,
                           help="Give up after this many seconds (PLD/PRV over very many steps are slow).")


class _TimedOut(BaseException):
    """Raised by the alarm; a BaseException so that no library's `except Exception` swallows it."""


@contextmanager
def deadline(seconds: float):
    """Raise _TimedOut in this (main) thread after ``seconds``: an accountant answers or gives up."""
    def expire(signum, frame):
        raise _TimedOut

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _check_steps(steps: int) -> None:
    from dpsynth_core.privacy import PrivacyParameterError

    if not 1 <= steps <= MAX_STEPS:
        raise PrivacyParameterError(f"--steps must be in [1, {MAX_STEPS:,}], got {steps}")


def _gave_up(seconds: float, accountant: str, steps: int) -> str:
    return (f"gave up after {seconds:g} s ({accountant} accountant, {steps} steps): try --accountant rdp "
            "(fast, a valid upper bound), fewer steps, or a larger --time-limit")


@app.command()
def epsilon(
    sampling_rate: float = typer.Option(..., "--sampling-rate", "-q", help="Poisson sampling rate q in (0, 1]."),
    noise_multiplier: float = typer.Option(..., "--noise-multiplier", "-s", help="sigma / clipping norm (> 0)."),
    steps: int = typer.Option(..., "--steps", "-T", help="Number of DP-SGD steps (>= 1)."),
    delta: float = typer.Option(..., "--delta", help="Target delta in (0, 1)."),
    accountant: str = typer.Option("all", "--accountant", "-a", help=_ACCOUNTANT_HELP),
    time_limit: float = _TIME_LIMIT,
) -> None:
    """Epsilon of DP-SGD (Poisson-subsampled Gaussian) by each accountant.

    Example: dpsynth privacy epsilon -q 0.01 -s 1.0 -T 1000 --delta 1e-5"""
    from rich.console import Console
    from rich.table import Table

    from dpsynth_core.privacy import ACCOUNTANTS, PrivacyParameterError, epsilon_dpsgd
    from dpsynth_core.privacy.accountants import WEAK_PRIVACY_EPSILON

    names = ACCOUNTANTS if accountant == "all" else (accountant,)
    if accountant != "all" and accountant not in ACCOUNTANTS:
        raise PrivacyParameterError(f"--accountant must be one of pld, rdp, prv, all; got {accountant!r}")
    _check_steps(steps)
    console = Console()
    console.print(
        f"DP-SGD (Poisson-subsampled Gaussian): sampling_rate={sampling_rate:g}, "
        f"noise_multiplier={noise_multiplier:g}, steps={steps}, delta={delta:g}"
    )
    table = Table()
    table.add_column("accountant")
    table.add_column("epsilon", justify="right")
    table.add_column("time (s)", justify="right")
    weak = False
    for name in names:
        start = time.perf_counter()
        try:
            with deadline(time_limit):
                eps = epsilon_dpsgd(sampling_rate, noise_multiplier, steps, delta, name)
        except _TimedOut:
            table.add_row(name, "gave up", f"> {time_limit:g}")
            continue
        weak = weak or eps > WEAK_PRIVACY_EPSILON
        table.add_row(name, f"{eps:.4f}", f"{time.perf_counter() - start:.2f}")
    console.print(table)
    if weak:
        console.print(f"epsilon above {WEAK_PRIVACY_EPSILON:g}: no meaningful privacy; every accountant reports the RDP bound")


@app.command()
def calibrate(
    epsilon: float = typer.Option(..., "--epsilon", "-e", help="Target epsilon (> 0)."),
    delta: float = typer.Option(..., "--delta", help="Target delta in (0, 1)."),
    sampling_rate: float = typer.Option(..., "--sampling-rate", "-q", help="Poisson sampling rate q in (0, 1]."),
    steps: int = typer.Option(..., "--steps", "-T", help="Number of DP-SGD steps (>= 1)."),
    accountant: str = typer.Option("pld", "--accountant", "-a", help="pld, rdp or prv."),
    time_limit: float = _TIME_LIMIT,
) -> None:
    """Smallest noise multiplier giving (epsilon, delta)-DP for DP-SGD, and the epsilon it achieves.

    Example: dpsynth privacy calibrate --epsilon 4 --delta 1e-5 -q 0.01 -T 1000"""
    from dpsynth_core.privacy import PrivacyParameterError, calibrate_noise_multiplier, epsilon_dpsgd

    _check_steps(steps)
    start = time.perf_counter()
    try:
        with deadline(time_limit):
            sigma = calibrate_noise_multiplier(epsilon, delta, sampling_rate, steps, accountant)
            achieved = epsilon_dpsgd(sampling_rate, sigma, steps, delta, accountant)
    except _TimedOut:
        raise PrivacyParameterError(_gave_up(time_limit, accountant, steps)) from None
    typer.echo(f"noise_multiplier: {sigma:.4f}")
    typer.echo(
        f"achieved epsilon: {achieved:.4f} (target {epsilon:g}, delta={delta:g}, q={sampling_rate:g}, "
        f"steps={steps}, accountant={accountant}; {time.perf_counter() - start:.1f} s)"
    )


@app.command()
def zcdp(
    delta: float = typer.Option(..., "--delta", help="Target delta in (0, 1)."),
    rho: float = typer.Option(None, "--rho", help="zCDP rho to convert to epsilon."),
    epsilon: float = typer.Option(None, "--epsilon", "-e", help="Epsilon to convert to the largest rho."),
) -> None:
    """Convert rho-zCDP <-> (epsilon, delta)-DP (Canonne-Kamath-Steinke 2020, as AIM uses)."""
    from dpsynth_core.privacy import PrivacyParameterError, epsilon_to_zcdp, zcdp_to_epsilon

    if (rho is None) == (epsilon is None):
        raise PrivacyParameterError("give exactly one of --rho or --epsilon")
    if rho is not None:
        typer.echo(f"rho={rho:g} -> epsilon={zcdp_to_epsilon(rho, delta):.4f} at delta={delta:g}")
    else:
        typer.echo(f"epsilon={epsilon:g}, delta={delta:g} -> rho={epsilon_to_zcdp(epsilon, delta):.6g}")
