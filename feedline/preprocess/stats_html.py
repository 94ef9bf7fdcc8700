"""A self-contained HTML page of :func:`feedline.stats` results (``feedline stats --html``).

One file, no external resources: inline CSS and inline SVG charts (no plotting package
needed). A summary table, then one section per column: numeric columns get a histogram,
their moments and quantiles; categorical columns a bar chart of their top values; image
columns histograms of width and height and their top sizes and modes; then the correlation
matrices. Every name and value is HTML-escaped.

Histograms are derived from the statistics alone (no second pass over the data): each
numeric column stores its quantile function at 201 evenly spaced probabilities (``cdf``),
and a bin's share is read off that function (linear between the points, as the quantiles
are), so every bar is accurate to about 0.5% of the values (one grid step; exact sketches)
plus the sketch's ``rank_error`` beyond that.

Examples
--------
>>> import feedline as fl, pyarrow as pa
>>> s = fl.stats(fl.from_arrow(pa.table({"<b>x": [1.0, 2.0, 2.0, 5.0]})))
>>> page = render_html(s)
>>> "&lt;b&gt;x" in page and "<b>x" not in page
True
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.errors import ConfigurationError

if TYPE_CHECKING:
    from feedline.preprocess.stats import Stats

__all__ = ["histogram", "render_html", "write_html"]

BINS = 30
_W, _H, _PAD = 520, 200, 36  # SVG chart size and left/bottom padding (pixels)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1100px;
color:#1f2328;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin:0 0 6px}h3{font-size:14px;margin:10px 0 4px}
table{border-collapse:collapse;margin:6px 0 10px}th,td{padding:3px 9px;border-bottom:1px solid #ddd;
text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f4f6f8}
section{border:1px solid #d8dee4;border-radius:6px;padding:12px 16px;margin:14px 0}
.kind{color:#57606a;font-size:12px;margin-left:8px}.row{display:flex;gap:28px;flex-wrap:wrap;
align-items:flex-start}.note{color:#57606a;font-size:12px}svg text{font:11px sans-serif;fill:#333}
a{color:#0969da}code{background:#f4f6f8;padding:0 3px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    """A number for a table cell: thousands separators, about four significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _e(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return f"{value:,.0f}"
    digits = int(np.floor(np.log10(abs(value)))) if value else 0
    return f"{value:,.{max(0, 3 - digits)}f}" if -3 <= digits < 7 else f"{value:.3e}"


def histogram(
    column: dict[str, Any],
    bins: int = BINS,
    *,
    integral: bool | None = None,
    clip_tails: bool = False,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Approximate bin ``edges`` and value ``counts`` of a numeric column's statistics.

    Derived from the stored quantile function (``cdf``); integer columns (``integral``,
    default: from the column's type) with at most ``bins`` possible values get one bin per
    integer. ``clip_tails=True`` bins only the central 99% (the 0.5% and 99.5% quantiles)
    when the extremes lie far outside it (the range is over 5 times wider), so outliers do
    not squash the rest into one bar; the counts then add up to about 99% of the values.
    ``None`` without values.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> s = fl.stats(fl.from_arrow(pa.table({"n": [0] * 100 + [1] * 200 + [2] * 700})))
    >>> edges, counts = histogram(s["n"])
    >>> edges.tolist(), counts.round(-1).tolist()
    ([-0.5, 0.5, 1.5, 2.5], [100.0, 200.0, 700.0])
    """
    grid, count = column.get("cdf") or [], column.get("count") or 0
    if not grid or not count or column.get("min") is None:
        return None
    values = np.asarray([np.nan if v is None else v for v in grid], np.float64)
    probs = np.linspace(0.0, 1.0, len(values))
    keep = np.isfinite(values)
    values, probs, clipped = values[keep], probs[keep], False
    low, high = float(column["min"]), float(column["max"])
    if integral is None:
        integral = str(column.get("type", "")).startswith(("int", "uint"))
    tails = len(values) > 4 and (values[-2] - values[1]) * 5 < high - low
    if integral and high - low + 1 <= bins:
        edges = np.arange(low - 0.5, high + 1.0, 1.0)
    elif clip_tails and tails:
        edges, clipped = np.linspace(values[1], values[-2], bins + 1), True
    elif high > low:
        edges = np.linspace(low, high, bins + 1)
    else:
        edges = np.array([low - 0.5, low + 0.5])
    # the CDF at each edge: linear between the grid's points (as the quantiles are),
    # right-continuous where values repeat; the outer edges hold 0 and 1 unless clipped
    inner = edges if clipped else edges[1:-1]
    i = np.clip(np.searchsorted(values, inner, side="right") - 1, 0, len(values) - 1)
    j = np.minimum(i + 1, len(values) - 1)
    span = values[j] - values[i]
    with np.errstate(invalid="ignore", divide="ignore"):
        part = np.where(span > 0, (inner - values[i]) / span, 0.0)
    cdf = np.where(inner < values[0], 0.0, probs[i] + np.clip(part, 0, 1) * (probs[j] - probs[i]))
    cdf = np.clip(cdf, 0.0, 1.0)
    cumulative = cdf if clipped else np.concatenate([[0.0], cdf, [1.0]])
    return edges, np.diff(cumulative) * count


def _bars_svg(edges: np.ndarray, counts: np.ndarray, label: str) -> str:
    """A vertical-bar histogram as inline SVG (integer bins are labelled by their centre)."""
    width, height = _W - _PAD - 34, _H - _PAD - 10
    top = float(counts.max()) or 1.0
    step = width / len(counts)
    bars = []
    for i, c in enumerate(counts):
        h = height * float(c) / top
        bars.append(
            f'<rect x="{_PAD + i * step + 0.5:.1f}" y="{10 + height - h:.1f}" '
            f'width="{max(step - 1, 0.5):.1f}" height="{h:.1f}" fill="#4c8bd6">'
            f"<title>{_e(_num(edges[i]))} – {_e(_num(edges[i + 1]))}: {c:,.0f}</title></rect>"
        )
    axis = (
        f'<line x1="{_PAD}" y1="{10 + height}" x2="{_PAD + width}" y2="{10 + height}" '
        f'stroke="#555"/><line x1="{_PAD}" y1="10" x2="{_PAD}" y2="{10 + height}" stroke="#555"/>'
    )
    if np.allclose(np.diff(edges), 1.0) and edges[0] % 1 == 0.5:  # one bin per integer
        every = max(1, len(counts) // 10)
        at = [((i + 0.5) / len(counts), edges[i] + 0.5) for i in range(0, len(counts), every)]
    else:
        at = [(f, edges[0] + (edges[-1] - edges[0]) * f) for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    ticks = "".join(
        f'<text x="{_PAD + width * f:.1f}" y="{_H - 18}" text-anchor="middle">{_e(_num(v))}</text>'
        for f, v in at
    )
    yticks = (
        f'<text x="{_PAD - 4}" y="14" text-anchor="end">{_e(_num(round(top)))}</text>'
        f'<text x="{_PAD - 4}" y="{10 + height}" text-anchor="end">0</text>'
    )
    caption = (
        f'<text x="{_PAD + width / 2:.1f}" y="{_H - 3}" text-anchor="middle">{_e(label)}</text>'
    )
    return (
        f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{_e(label)}">{"".join(bars)}{axis}{ticks}{yticks}{caption}</svg>'
    )


def _top_svg(top: Sequence[Sequence[Any]], label: str) -> str:
    """Horizontal bars of (value, count) pairs as inline SVG."""
    rows = list(top)[:20]
    line, left = 18, 170
    height = line * len(rows) + 26
    most = max((int(c) for _, c in rows), default=1) or 1
    parts = []
    for i, (value, count) in enumerate(rows):
        y, w = 4 + i * line, (_W - left - 70) * int(count) / most
        text = str(value)
        short = text if len(text) <= 26 else text[:25] + "…"
        parts.append(
            f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{_e(short)}</text>'
            f'<rect x="{left}" y="{y + 2}" width="{max(w, 1):.1f}" height="{line - 5}" '
            f'fill="#2da44e"><title>{_e(text)}: {int(count):,}</title></rect>'
            f'<text x="{left + w + 4:.1f}" y="{y + 12}">{int(count):,}</text>'
        )
    parts.append(f'<text x="{left}" y="{height - 6}">{_e(label)}</text>')
    return (
        f'<svg width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" role="img" '
        f'aria-label="{_e(label)}">{"".join(parts)}</svg>'
    )


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    return "".join(out) + "</table>"


def _numeric_html(c: dict[str, Any], what: str) -> str:
    moments = [(k, _num(c.get(k))) for k in ("mean", "std", "min", "max", "skewness", "kurtosis")]
    moments.append(("infinite", _num(c.get("infinite"))))
    quantiles = [(k, _num(v)) for k, v in (c.get("quantiles") or {}).items()]
    exact = "exact" if c.get("quantiles_exact") else f"rank error ≤ {c.get('rank_error', 0):.2%}"
    found = histogram(c, clip_tails=True)
    label = f"{what} (approximate histogram from 201 quantiles; {exact})"
    if found is not None and (found[0][0] > c["min"] or found[0][-1] < c["max"]):  # clipped
        label = f"{what}: central 99% (min {_num(c['min'])}, max {_num(c['max'])}; approximate)"
    chart = _bars_svg(*found, label) if found is not None else '<p class="note">no values</p>'
    return (
        f'<div class="row"><div>{chart}</div><div><h3>moments</h3>{_table(moments)}</div>'
        f"<div><h3>quantiles</h3>{_table(quantiles)}</div></div>"
    )


def _column_html(index: int, name: str, c: dict[str, Any], rows: int) -> str:
    kind = c.get("kind", "other")
    body = ""
    if kind == "numeric":
        body = _numeric_html(c, name)
    elif kind == "categorical":
        distinct = f"{c['distinct']:,}" + ("" if c.get("distinct_exact") else " (estimated)")
        note = f"; counts low by at most {c['top_error']:,}" if c.get("top_error") else ""
        body = f"<p>{distinct} distinct values{_e(note)}</p>" + (
            _top_svg(c["top"], f"top {len(c['top'][:20])} values by count") if c["top"] else ""
        )
    elif kind == "image":
        body = f"<p>{c.get('unreadable', 0):,} unreadable image(s)</p><div class='row'>"
        for axis in ("width", "height"):
            found = histogram(c[axis], integral=True)
            if found is not None:
                body += f"<div>{_bars_svg(*found, f'{axis} (pixels)')}</div>"
        for key, label in (("top_sizes", "top sizes (width x height)"), ("modes", "modes")):
            if c.get(key):
                body += f"<div>{_top_svg(c[key], label)}</div>"
        body += "</div>"
    nulls = c.get("nulls") or 0
    share = f" ({nulls / rows:.1%})" if rows else ""
    return (
        f'<section id="col-{index}"><h2>{_e(name)}<span class="kind">{_e(kind)} · '
        f"{_e(c.get('type', ''))}</span></h2><p>{_num(c.get('count'))} values, "
        f"{_num(nulls)} null{share}</p>{body}</section>"
    )


def _summary_line(c: dict[str, Any]) -> str:
    kind = c.get("kind")
    if kind == "numeric" and c.get("count"):
        return (
            f"mean {_num(c['mean'])} ± {_num(c['std'])}; min {_num(c['min'])}, "
            f"median {_num((c.get('quantiles') or {}).get('p50'))}, max {_num(c['max'])}"
        )
    if kind == "categorical":
        top = ", ".join(f"{_e(k)} ({v:,})" for k, v in c["top"][:3])
        return f"{c['distinct']:,} distinct; {top}"
    if kind == "image":
        return f"{c.get('unreadable', 0):,} unreadable; " + ", ".join(
            f"{_e(k)} ({v:,})" for k, v in c.get("top_sizes", [])[:2]
        )
    return ""


def _correlation_html(correlation: dict[str, Any]) -> str:
    names, out = correlation.get("columns") or [], []
    for method in ("pearson", "spearman"):
        matrix = correlation.get(method)
        if not matrix or len(names) < 2:
            continue
        rows = []
        for name, row in zip(names, matrix, strict=True):
            cells = [_e(name)]
            for v in row:
                if v is None:
                    cells.append("–")
                    continue
                tint = f"rgba({'9,105,218' if v >= 0 else '207,34,46'},{abs(v) * 0.6:.2f})"
                cells.append(f'<span style="background:{tint};padding:0 4px">{v:.3f}</span>')
            rows.append(cells)
        out.append(f"<h3>{method} correlation</h3>" + _table(rows, ["", *names]))
    return f"<section><h2>correlations</h2>{''.join(out)}</section>" if out else ""


def render_html(stats: Stats, *, title: str | None = None) -> str:
    """The HTML page of ``stats`` as a string (see the module docstring)."""
    title = title or f"feedline statistics: {stats.rows:,} rows"
    summary = [
        [
            f'<a href="#col-{i}">{_e(name)}</a>',
            _e(c.get("kind")),
            _e(c.get("type", "")),
            _num(c.get("count")),
            _num(c.get("nulls")),
            _summary_line(c),
        ]
        for i, (name, c) in enumerate(stats.columns.items())
    ]
    head = ["column", "kind", "type", "count", "nulls", "summary"]
    sections = "".join(
        _column_html(i, name, c, stats.rows) for i, (name, c) in enumerate(stats.columns.items())
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>"
        f"<p>{stats.rows:,} rows · {len(stats.columns):,} columns</p>{_table(summary, head)}"
        f"{sections}{_correlation_html(stats.correlation)}"
        '<p class="note">Written by <code>feedline stats --html</code>.</p></body></html>\n'
    )


def write_html(stats: Stats, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Write :func:`render_html` of ``stats`` to ``path`` (UTF-8; its folder is created).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, tempfile
    >>> s = fl.stats(fl.from_arrow(pa.table({"x": [1.0, 2.0]})))
    >>> write_html(s, tempfile.mkdtemp() + "/stats.html").suffix
    '.html'
    """
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_html(stats, title=title), encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"write_html: cannot write {str(out)!r}: {exc}. Fix: pass a writable path."
        ) from exc
    return out
