"""How every benchmark states what a printed figure rests on (issue 38: no figure without its sample size).

``note(n, runs, baseline)`` -> ``"(n = 32 requests; one run; baseline: the HF app)"``; benchmarks print it next to
each figure or under each table, so a reader never sees a number without its n, its repeats and, for a ratio or a
score with a trivial reference, what it is measured against.
"""

from __future__ import annotations


def runs_text(runs: int) -> str:
    """'one run' or 'N runs' (repeats of the whole measurement, e.g. seeds or alternating pairs)."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs}")
    return "one run" if runs == 1 else f"{runs} runs"


def note(n: str, runs: int = 1, baseline: str | None = None) -> str:
    parts = [f"n = {n}", runs_text(runs)] + ([f"baseline: {baseline}"] if baseline else [])
    return "(" + "; ".join(parts) + ")"
