"""A report a data owner can read: ``write_report(run_dir)`` -> ``report.html`` + ``report.json`` (owner-side, next
to ``release/``) and the cards and exports in ``release/`` (docs/report.md).

One module per section (privacy, fidelity, utility, fairness, disclosure), each turning what the run directory
already holds into a ``model.Section``; ``inputs`` reads and checks the run directory, ``render`` writes the page
from ``template.html``, ``cards`` the release's cards. Nothing here runs a model or reads private rows itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dpsynth_core.report.aim_baseline import AimBaseline, read_aim_baseline
from dpsynth_core.report.cards import write_cards
from dpsynth_core.report.disclosure import disclosure_section
from dpsynth_core.report.fairness import fairness_section
from dpsynth_core.report.fidelity import fidelity_section
from dpsynth_core.report.inputs import RunFacts, read_run
from dpsynth_core.report.model import Section
from dpsynth_core.report.privacy import badge, privacy_section, privacy_unit
from dpsynth_core.report.render import inline_png, render_html
from dpsynth_core.report.utility import utility_section
from dpsynth_core.runs.files import atomic_write_text

REPORT_HTML = "report.html"
REPORT_JSON = "report.json"
REPORT_FORMAT = 1
# owner-side PNGs the run already wrote, shown in the section they belong to
PLOTS = {"fidelity": ("plots/lengths.png", "plots/text_attribute_djs.png", "plots/features_djs.png",
                      "eval/marginals.png"),
         "disclosure": ("eval/dcr.png",)}


def build_sections(facts: RunFacts, aim: AimBaseline | None = None) -> list[Section]:
    sections = [privacy_section(facts), fidelity_section(facts), utility_section(facts), fairness_section(facts, aim),
                disclosure_section(facts)]
    for s in sections:
        for rel in PLOTS.get(s.key, ()):
            if (facts.root / rel).is_file() and s.grade != "not applicable":
                s.charts.append(inline_png(facts.root / rel, f"{rel} (owner-side)"))
    return sections


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dpsynth")
    except PackageNotFoundError:
        return "dev"


def write_report(run_dir: str | Path, baseline: str | Path | None = None) -> dict[str, Path]:
    """Check ``run_dir``, add the cards and exports to its ``release/``, then write ``report.json`` and
    ``report.html`` next to it (each written whole, atomically). Returns the paths by name.

    ``baseline``: a finished AIM run on the same table (columns, target, test rows), shown beside this run in the
    fairness section (its gaps from its own owner-side evaluation)."""
    started = time.perf_counter()
    facts = read_run(run_dir)  # refuses a missing, unfinished or older run before anything is written
    aim = read_aim_baseline(baseline, facts) if baseline is not None else None  # and a baseline that does not fit
    added = write_cards(facts.root, facts.method, privacy_unit(facts.ledger))
    sections = build_sections(facts, aim)
    b = badge(facts)
    title = f"{facts.method} run '{facts.ledger.get('dataset', facts.root.name)}': report for the data owner"
    subtitle = f"Run directory {facts.root}" + (f" (released by the DP sweep in {run_dir})" if facts.sweep else "")
    data = {"format": REPORT_FORMAT, "method": facts.method, "run_dir": str(facts.root), "owner_side": True,
            "privacy_badge": b, "sections": {s.key: s.to_dict() for s in sections},
            "baselines": {} if aim is None else {"aim": {"run_dir": str(aim.run_dir), "epsilon": aim.epsilon,
                                                         "n_synthetic": aim.n_synthetic}},
            "release_added": added}
    html = render_html(title=title, subtitle=subtitle, badge=b, sections=sections, run_dir=str(facts.root),
                       version=_version())
    paths = {"json": facts.root / REPORT_JSON, "html": facts.root / REPORT_HTML, "release": facts.root / "release"}
    atomic_write_text(paths["json"], json.dumps({**data, "seconds": round(time.perf_counter() - started, 2)},
                                                indent=2, default=str))
    atomic_write_text(paths["html"], html)
    return paths


__all__ = ["REPORT_HTML", "REPORT_JSON", "write_report"]
