"""What a report section is made of: figures (each with its sample size and baseline), tables, charts, a grade
and one recommended action. Sections build these; ``render`` turns them into HTML, ``to_dict`` into JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

NOT_APPLICABLE = "not applicable"
NOT_COMPUTED = "not computed"
NOT_PRIVATE = "not private"


@dataclass
class Figure:
    """One number as the report prints it: never without ``n`` (its sample size)."""

    label: str
    value: float | str | None
    n: str
    baseline: float | None = None
    baseline_label: str = ""
    reference: float | None = None
    reference_label: str = ""
    flag: str = ""  # e.g. "no better than the trivial baseline"

    def __post_init__(self) -> None:
        if not self.n:
            raise ValueError(f"figure {self.label!r} has no sample size")  # docs/report.md: none without one


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    css_class: str = ""


@dataclass
class Section:
    key: str
    title: str
    grade: str  # "A".."D", "F", or a status: NOT_APPLICABLE, NOT_COMPUTED, NOT_PRIVATE
    action: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # inline SVG, HTML only
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"title": self.title, "grade": self.grade, "action": self.action,
                "figures": [asdict(f) for f in self.figures],
                "tables": [{"title": t.title, "columns": t.columns, "rows": t.rows} for t in self.tables],
                "notes": self.notes}


def not_applicable(key: str, title: str, why: str) -> Section:
    return Section(key, title, NOT_APPLICABLE, "none", notes=[why])


def not_computed(key: str, title: str, why: str, action: str = "none") -> Section:
    return Section(key, title, NOT_COMPUTED, action, notes=[why])


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}g}" if abs(x) >= 1e4 or (x != 0 and abs(x) < 1e-3) else f"{x:.{digits}f}"
