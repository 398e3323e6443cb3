"""Privacy: the guarantee the ledger states (ε, δ, m·δ, the unit), where ε went, the audit, in plain words."""

from __future__ import annotations

import math

from dpsynth_core.report.bands import privacy_grade
from dpsynth_core.report.inputs import RunFacts
from dpsynth_core.report.model import NOT_PRIVATE, Figure, Section, Table, fmt
from dpsynth_core.report.svg import stacked_bar

SELECTION_STAGE = "hyperparameter_selection"  # the DP sweep's event (tuning.release; not imported: same row)


def privacy_unit(ledger: dict) -> str:
    """``user`` when a DP-SGD event was user-level (``dpsynth train`` with ``data.user_col``), else ``record``."""
    users = any((e.get("details") or {}).get("user_level") for e in ledger["entries"])
    return "user" if users else "record"


def badge(facts: RunFacts) -> dict:
    """What the badge at the top of the report says (also in report.json)."""
    led = facts.ledger
    return {"private": led["private"], "epsilon": None if not led["private"] else led["total_epsilon"],
            "delta": led["delta"], "public_size": led.get("public_size"), "m_times_delta": led.get("m_times_delta"),
            "unit": privacy_unit(led), "epsilon_budget": led["epsilon_budget"],
            "selection": bool(led["entries"]) and led["entries"][0]["stage"] == SELECTION_STAGE,
            "not_private_reasons": [f"{m['stage']}: {m['reason']}" for m in led.get("not_private") or []]}


def statement(facts: RunFacts) -> str:
    """The plain-language guarantee, generated from the ledger (TF-Privacy's compute_dp_sgd_privacy_statement
    is the model: what is protected, by how much, and what the number means)."""
    b, led = badge(facts), facts.ledger
    if not b["private"]:
        return ("This run is NOT differentially private: " + "; ".join(b["not_private_reasons"]) +
                ". Nothing it produced may be published as DP data.")
    eps, delta, unit = b["epsilon"], b["delta"], b["unit"]
    spent = [e for e in led["entries"] if e["epsilon"] > 0]
    text = (f"Adding or removing any single {unit} of the private data changes the probability of any output of "
            f"this run by at most a factor e^ε = {math.exp(min(eps, 700)):.3g} (ε = {eps:.3f}), plus at most "
            f"δ = {delta:.3g}.")
    if b["public_size"]:
        text += (f" With m = {b['public_size']:,} {unit}s in the working set, m·δ = {b['m_times_delta']:.3g}: roughly "
                 f"the expected number of {unit}s a δ-event could expose.")
    if b["selection"]:
        text += (f" ε = {eps:.3f} is the cost of the DP hyperparameter sweep that selected this run "
                 f"(Papernot & Steinke), not only of the run itself.")
    elif spent:
        names = ", ".join(f"{e['stage']} ({e['kind']}, ε alone {e['epsilon']:.3f})" for e in spent)
        text += f" ε was spent by {names}, composed into the total by {led.get('composition_method') or 'the ledger'}."
    text += " Every other stage only post-processed DP outputs and spent nothing."
    return text


def _ledger_table(led: dict) -> Table:
    rows = []
    for e in led["entries"]:
        params = ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in (e.get("params") or {}).items())
        params = params if len(params) <= 240 else params[:240] + " … (ledger.json has all)"
        rows.append([str(e["id"]), e["stage"], e["kind"], params or "-", f"{e['epsilon']:.4f}",
                     f"{e['total_epsilon_after']:.4f}"])
    return Table("Ledger (every mechanism that touched private data, and every zero-cost stage)",
                 ["#", "stage", "kind", "parameters", "ε alone", "total after"], rows, css_class="ledger")


def _audit(facts: RunFacts, figures: list[Figure]) -> bool:
    """The empirical audits beside the claim (the DP-SGD model's, the release's); True when one refutes it."""
    failed = False
    for label, a in (("empirical audit", facts.audit), ("release audit (synthetic data only)", facts.release_audit)):
        if not a:
            continue
        reached = f", {a['reached']} reached the mechanism" if "reached" in a else ""
        figures.append(Figure(f"{label}: ε lower bound (95 %)", a.get("epsilon_lower_bound"),
                              f"{a.get('canaries', 'n/a')} canaries{reached}, {a.get('correct', 'n/a')}/"
                              f"{a.get('guesses', 'n/a')} guesses right",
                              reference=a.get("claimed_epsilon"), reference_label="claimed ε",
                              flag=f"audit {a.get('status', 'n/a')}"))
        failed = failed or a.get("status") == "failed"
    return failed


def privacy_section(facts: RunFacts) -> Section:
    b, led = badge(facts), facts.ledger
    m = b["public_size"]
    n = f"m = {m:,} {b['unit']}s (public working-set size)" if m else "working-set size not declared"
    figures = [Figure("ε (composed)", b["epsilon"] if b["private"] else "∞ (not private)", n,
                      reference=led["epsilon_budget"], reference_label="budget"),
               Figure("δ", led["delta"], n), Figure("m·δ", b["m_times_delta"], n)]
    failed = _audit(facts, figures)
    spent = [(f"{e['stage']} ({e['kind']})", e["epsilon"]) for e in led["entries"] if e["epsilon"] > 0]
    charts = [stacked_bar("Where ε went: each stage's ε alone (composition is not additive: the composed total "
                          f"is {led['total_epsilon']:.4f})", spent)] if spent else []
    notes = [statement(facts)]
    if b["selection"]:
        notes.append(f"Selection ε of the DP sweep: {led['entries'][0]['epsilon']:.4f} (the first ledger entry).")
    if not b["private"]:
        return Section("privacy", "Privacy", NOT_PRIVATE, "do not publish this run as DP; run again with a finite ε",
                       figures, [_ledger_table(led)], charts, notes)
    if failed:
        return Section("privacy", "Privacy", "F", "do not publish: the audit refutes the claim", figures,
                       [_ledger_table(led)], charts, notes)
    grade = privacy_grade(b["epsilon"], b["m_times_delta"])
    if b["m_times_delta"] is not None and b["m_times_delta"] > 0.01:
        action = "lower δ (m·δ is above 0.01)"
    elif grade == "D":
        action = "lower ε (above 10 the guarantee says little)"
    elif grade == "C":
        action = "consider a lower ε"
    else:
        action = "publish release/ with its cards"
    return Section("privacy", "Privacy", grade, action, figures, [_ledger_table(led)], charts, notes)
