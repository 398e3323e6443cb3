"""Inline SVG charts: the report is one file that needs no network and no image files."""

from __future__ import annotations

from html import escape

PALETTE = ("#3b6ea5", "#e07b39", "#5a9e5a", "#b54a4a", "#8a6fb5", "#a08a3c", "#4aa5a0", "#777777")


def stacked_bar(title: str, parts: list[tuple[str, float]], width: int = 640) -> str:
    """One horizontal bar split into ``parts`` (label, value >= 0), with a legend."""
    total = sum(max(0.0, v) for _, v in parts)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{40 + 18 * len(parts)}">',
           f"<title>{escape(title)}</title>"]
    x = 0.0
    for i, (label, value) in enumerate(parts):
        w = (width * max(0.0, value) / total) if total > 0 else 0.0
        color = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="24" fill="{color}"/>')
        share = f"{100 * value / total:.0f}%" if total > 0 else "0%"
        out.append(f'<rect x="0" y="{32 + 18 * i}" width="12" height="12" fill="{color}"/>'
                   f'<text x="18" y="{43 + 18 * i}" font-size="12">{escape(label)}: {value:.4g} ({share})</text>')
        x += w
    out.append("</svg>")
    return "".join(out)


def paired_bars(title: str, labels: list[str], series: dict[str, list[float]], width: int = 640,
                height: int = 200) -> str:
    """Grouped vertical bars: one group per label, one bar per series (e.g. real vs synthetic)."""
    n, k = max(1, len(labels)), max(1, len(series))
    top = max([v for vs in series.values() for v in vs if v is not None] + [1e-9])
    group = (width - 40) / n
    bar = max(2.0, group * 0.8 / k)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height + 70}">',
           f"<title>{escape(title)}</title>"]
    for j, (name, values) in enumerate(series.items()):
        color = PALETTE[j % len(PALETTE)]
        out.append(f'<rect x="{40 + 120 * j}" y="{height + 52}" width="12" height="12" fill="{color}"/>'
                   f'<text x="{56 + 120 * j}" y="{height + 63}" font-size="12">{escape(name)}</text>')
        for i, v in enumerate(values):
            h = 0.0 if v is None else height * v / top
            x = 40 + i * group + j * bar
            out.append(f'<rect x="{x:.1f}" y="{height - h:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{color}">'
                       f"<title>{escape(labels[i])}: {'n/a' if v is None else f'{v:.3g}'}</title></rect>")
    for i, label in enumerate(labels):
        x = 40 + i * group + group * 0.4
        out.append(f'<text x="{x:.1f}" y="{height + 14}" font-size="10" text-anchor="middle">'
                   f"{escape(label[:14])}</text>")
    out.append(f'<text x="0" y="12" font-size="10">{top:.3g}</text><line x1="38" y1="0" x2="38" y2="{height}" '
               f'stroke="#999"/><line x1="38" y1="{height}" x2="{width}" y2="{height}" stroke="#999"/></svg>')
    return "".join(out)


def heatmap(title: str, labels: list[str], matrix: list[list[float]], cell: int = 34) -> str:
    """A square matrix of values in [0, 1] (e.g. Cramér's V), darker = stronger, each cell labelled."""
    n, pad = len(labels), 110
    size = pad + n * cell
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{size}" height="{size}">',
           f"<title>{escape(title)}</title>"]
    for i, row in enumerate(matrix):
        out.append(f'<text x="{pad - 4}" y="{pad + i * cell + cell * 0.6:.0f}" font-size="10" '
                   f'text-anchor="end">{escape(labels[i][:16])}</text>')
        out.append(f'<text x="{pad + i * cell + cell / 2:.0f}" y="{pad - 4}" font-size="10" '
                   f'transform="rotate(-45 {pad + i * cell + cell / 2:.0f} {pad - 4})">{escape(labels[i][:16])}</text>')
        for j, v in enumerate(row):
            shade = int(255 - 200 * max(0.0, min(1.0, v)))
            out.append(f'<rect x="{pad + j * cell}" y="{pad + i * cell}" width="{cell}" height="{cell}" '
                       f'fill="rgb({shade},{shade},255)" stroke="#fff"/><text x="{pad + j * cell + cell / 2:.0f}" '
                       f'y="{pad + i * cell + cell * 0.6:.0f}" font-size="9" text-anchor="middle">{v:.2f}</text>')
    out.append("</svg>")
    return "".join(out)
