"""The sections as one self-contained HTML page (template.html: inline CSS and SVG, base64 PNGs, no network)."""

from __future__ import annotations

import base64
import re
from html import escape
from importlib.resources import files
from pathlib import Path
from string import Template

from dpsynth_core.report.model import Figure, Section, Table, fmt

MAX_IMAGE_BYTES = 600_000  # the page stays well under 5 MB


def _figure_row(f: Figure) -> str:
    value = escape(fmt(f.value))
    base = f"{fmt(f.baseline)} ({escape(f.baseline_label)})" if f.baseline is not None else ""
    ref = f"{fmt(f.reference)} ({escape(f.reference_label)})" if f.reference is not None else ""
    flag = f'<span class="flag">{escape(f.flag)}</span>' if f.flag else ""
    return (f"<tr><td>{escape(f.label)}</td><td>{value}</td><td>{escape(f.n)}</td><td>{base}</td>"
            f"<td>{ref}</td><td>{flag}</td></tr>")


def _table(t: Table) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in t.rows)
    cls = f' class="{t.css_class}" id="{t.css_class}-table"' if t.css_class else ""
    return f"<h3>{escape(t.title)}</h3><table{cls}><tr>{head}</tr>{body}</table>"


def grade_span(grade: str) -> str:
    return f'<span class="grade grade-{escape(grade.replace(" ", "-"))}">{escape(grade)}</span>'


def _section(s: Section) -> str:
    parts = [f'<section id="section-{s.key}"><h2>{escape(s.title)} {grade_span(s.grade)}</h2>',
             f'<p class="action"><strong>Recommended action:</strong> {escape(s.action)}</p>']
    for note in s.notes:
        parts.append(f'<p class="{"statement" if s.key == "privacy" else "note"}">{escape(note)}</p>')
    if s.figures:
        parts.append("<table class=\"figures\"><tr><th>figure</th><th>value</th><th>sample size</th>"
                     "<th>trivial baseline</th><th>reference</th><th></th></tr>"
                     + "".join(_figure_row(f) for f in s.figures) + "</table>")
    parts.extend(_table(t) for t in s.tables)
    parts.extend(_chart(svg) for svg in s.charts)
    return "".join(parts) + "</section>"


def _chart(svg: str) -> str:
    """An inline SVG with its <title> as a visible caption (a PNG from ``inline_png`` is already a figure)."""
    if svg.startswith("<figure"):
        return svg
    found = re.search(r"<title>(.*?)</title>", svg)
    caption = f"<figcaption>{found.group(1)}</figcaption>" if found else ""  # already escaped in the SVG
    return f"<figure>{svg}{caption}</figure>"


def inline_png(path: Path, caption: str) -> str:
    """A PNG the run already wrote, inlined (base64); skipped when too large for a one-file page."""
    data = Path(path).read_bytes()
    if len(data) > MAX_IMAGE_BYTES:
        return ""
    return (f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def render_html(*, title: str, subtitle: str, badge: dict, sections: list[Section], run_dir: str, version: str) -> str:
    if badge["private"]:
        text = (f"DP: ε = {badge['epsilon']:.3f}, δ = {badge['delta']:.3g}, m·δ = {fmt(badge['m_times_delta'])} "
                f"(m = {fmt(badge['public_size'])}), unit of privacy: one {badge['unit']}")
        if badge["selection"]:
            text += " (ε of the DP sweep's selection)"
        banner, cls = "", "badge"
    else:
        text = "NOT PRIVATE (ε = ∞)"
        banner = ('<p class="not-private" id="not-private">NOT PRIVATE: a reference run. '
                  + escape("; ".join(badge["not_private_reasons"])) + "</p>")
        cls = "badge not-private-badge"
    grades = ('<table id="grades"><tr><th>section</th><th>grade</th><th>recommended action</th></tr>'
              + "".join(f'<tr><td><a href="#section-{s.key}">{escape(s.title)}</a></td><td>{grade_span(s.grade)}</td>'
                        f"<td>{escape(s.action)}</td></tr>" for s in sections) + "</table>")
    template = Template(files("dpsynth_core.report").joinpath("template.html").read_text(encoding="utf-8"))
    return template.substitute(title=escape(title), subtitle=escape(subtitle), not_private=banner, badge_class=cls,
                               badge=escape(text), grades=grades, sections="".join(_section(s) for s in sections),
                               version=escape(version), run_dir=escape(run_dir))
