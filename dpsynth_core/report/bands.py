"""The grade bands of docs/report.md, in one place (fixed before any evaluation figure was looked at)."""

from __future__ import annotations

GRADES = ("A", "B", "C", "D")


def lower(grade: str, steps: int = 1) -> str:
    """One band lower (D stays D); statuses and F are left as they are."""
    if grade not in GRADES:
        return grade
    return GRADES[min(len(GRADES) - 1, GRADES.index(grade) + steps)]


def at_most(value: float, a: float, b: float, c: float) -> str:
    """Smaller is better: A <= a, B <= b, C <= c, else D."""
    return "A" if value <= a else "B" if value <= b else "C" if value <= c else "D"


def at_least(value: float, a: float, b: float, c: float) -> str:
    """Larger is better: A >= a, B >= b, C >= c, else D."""
    return "A" if value >= a else "B" if value >= b else "C" if value >= c else "D"


def privacy_grade(epsilon: float, m_times_delta: float | None) -> str:
    grade = "A" if epsilon <= 1 else "B" if epsilon <= 4 else "C" if epsilon <= 10 else "D"
    return lower(grade) if m_times_delta is not None and m_times_delta > 0.01 else grade


def mauve_grade(mauve: float) -> str:
    return at_least(mauve, 0.90, 0.70, 0.40)


def djs_grade(djs_1way_mean: float) -> str:
    return at_most(djs_1way_mean, 0.05, 0.10, 0.20)


def tvd_grade(tvd_1way_mean: float) -> str:
    return at_most(tvd_1way_mean, 0.05, 0.10, 0.20)


def utility_grade(synthetic: float, baseline: float, real: float | None) -> tuple[str, float]:
    """(grade, lift): lift over the trivial baseline relative to the real-data reference when there is one
    above the baseline, else the plain difference (graded C at best: nothing says how close to real it is)."""
    if synthetic <= baseline:
        return "D", synthetic - baseline
    if real is not None and real > baseline:
        lift = (synthetic - baseline) / (real - baseline)
        return ("A" if lift >= 0.8 else "B" if lift >= 0.5 else "C"), lift
    return "C", synthetic - baseline


def fairness_grade(max_dp_gap: float) -> str:
    return at_most(max_dp_gap, 0.05, 0.10, 0.20)


def disclosure_grade(mia_auc: float, copies_more_than_holdout: bool, max_aia_advantage: float | None) -> str:
    grade = at_most(mia_auc, 0.55, 0.60, 0.70)
    if copies_more_than_holdout:
        grade = lower(grade)
    if max_aia_advantage is not None and max_aia_advantage > 0.05:
        grade = lower(grade)
    return grade
