"""The privacy ledger as a human table (``PrivacyLedger.render``, ``dpsynth ledger show``): one row per
event, then the marks, the reservations of running stages and the composed total against the budget."""

from __future__ import annotations

from typing import Any

from dpsynth_core.privacy.composition import compose_with_details


def render_ledger(ledger, timestamps: bool = True) -> str:
    """``ledger`` (a ``PrivacyLedger``) as text; ``timestamps=False`` leaves the time column out."""
    import io

    from rich.console import Console
    from rich.table import Table

    entries = ledger.entries()
    total, method, _ = compose_with_details([e.event() for e in entries], ledger.delta)
    table = Table(title=f"privacy ledger: {ledger.dataset} (delta={ledger.delta:.3g})")
    columns = (("#", "right"), ("stage", "left"), ("kind", "left"), ("params", "left"),
               ("eps alone", "right"), ("total after", "right")) + ((("time (UTC)", "left"),) if timestamps else ())
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for e in entries:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in e.params.items()) or "-"
        time = (e.timestamp.replace("+00:00", ""),) if timestamps else ()
        table.add_row(str(e.id), e.stage, e.kind, params, f"{e.epsilon:.4f}", f"{e.total_epsilon_after:.4f}", *time)
    buf = io.StringIO()
    console = Console(file=buf, width=120, color_system=None, force_terminal=False)
    console.print(table)
    naive = sum(e.epsilon for e in entries)
    for mark in ledger.not_private_reasons():
        console.print(f"NOT PRIVATE ({mark['stage']}): {mark['reason']}", markup=False)
    for held in ledger.reservations():
        console.print(f"budget reserved by a running stage: {held.describe()}", markup=False)
    console.print(
        ("NOT PRIVATE, " if not ledger.is_private else "") + f"composed: epsilon={total:.4f} at delta={ledger.delta:.3g} (bound: {method}); "
        f"budget {ledger.epsilon_budget:g}, remaining {max(0.0, ledger.epsilon_budget - total):.4f}; "
        f"naive sum of eps {naive:.4f}"
    )
    m = ledger.public_size
    if m:
        console.print(f"m * delta = {m * ledger.delta:.3g} (m = {m}, the public working-set size; keep it well below 1)")
    return buf.getvalue()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
