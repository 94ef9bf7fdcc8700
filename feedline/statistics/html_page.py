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
from feedline.statistics.numbers import fixed, number
from feedline.statistics.svg_charts import histogram_svg, shown_value, top_svg

if TYPE_CHECKING:
    from feedline.statistics.result import Stats

__all__ = ["histogram", "log_scale", "render_html", "write_html"]

BINS = 30
#: a histogram uses a log axis when its values are all positive and span more than this ratio
LOG_RATIO = 1e3

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1100px;
color:#1f2328;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin:0 0 6px}h3{font-size:14px;margin:10px 0 4px}
table{border-collapse:collapse;margin:6px 0 10px}th,td{padding:3px 9px;border-bottom:1px solid #ddd;
text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f4f6f8}
section{border:1px solid #d8dee4;border-radius:6px;padding:12px 16px;margin:14px 0}
.kind{color:#57606a;font-size:12px;margin-left:8px}.row{display:flex;gap:28px;flex-wrap:wrap;
align-items:flex-start}.note{color:#57606a;font-size:12px;max-width:520px}svg text{fill:#333}
a{color:#0969da}code{background:#f4f6f8;padding:0 3px}.summary td:nth-child(-n+3),
.summary th:nth-child(-n+3),.summary td:last-child,.summary th:last-child{text-align:left}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    """A number for a table cell (:func:`~feedline.statistics.numbers.number`), HTML-escaped."""
    return _e(number(value, "–"))


def _category(value: Any) -> str:
    """A category value as HTML: the empty string as an italic ``(empty string)``."""
    text, described = shown_value(value)
    return f"<i>{_e(text)}</i>" if described else f'<span style="white-space:pre">{_e(text)}</span>'


def log_scale(column: dict[str, Any], bins: int = BINS) -> bool:
    """Whether a numeric column's histogram uses a log axis: all values positive, spanning
    more than ``LOG_RATIO`` (three orders of magnitude), and not one bin per integer.

    Examples
    --------
    >>> log_scale({"min": 1.0, "max": 5e4, "type": "double"})
    True
    >>> log_scale({"min": 0.0, "max": 5e4, "type": "double"}), log_scale({"min": 1, "max": 9})
    (False, False)
    """
    low, high = column.get("min"), column.get("max")
    if low is None or high is None or low <= 0:
        return False
    integral = str(column.get("type", "")).startswith(("int", "uint"))
    return high / low > LOG_RATIO and not (integral and high - low + 1 <= bins)


def histogram(
    column: dict[str, Any],
    bins: int = BINS,
    *,
    integral: bool | None = None,
    clip_tails: bool = False,
    log: bool = False,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Approximate bin ``edges`` and value ``counts`` of a numeric column's statistics.

    Derived from the stored quantile function (``cdf``); integer columns (``integral``,
    default: from the column's type) with at most ``bins`` possible values get one bin per
    integer. ``clip_tails=True`` bins only the central 99% (the 0.5% and 99.5% quantiles)
    when the extremes lie far outside it (the range is over 5 times wider), so outliers do
    not squash the rest into one bar; the counts then add up to about 99% of the values.
    ``log=True`` (for positive values, see :func:`log_scale`) spaces the edges evenly in
    ``log10`` (and tests the tails there). ``None`` without values.

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
    log = log and low > 0
    scaled = np.log10 if log else (lambda v: v)
    spaced = np.geomspace if log else np.linspace
    tails = len(values) > 4 and (scaled(values[-2]) - scaled(values[1])) * 5 < (
        scaled(high) - scaled(low)
    )
    if integral and high - low + 1 <= bins and not log:
        edges = np.arange(low - 0.5, high + 1.0, 1.0)
    elif clip_tails and tails:
        edges, clipped = spaced(values[1], values[-2], bins + 1), True
    elif high > low:
        edges = spaced(low, high, bins + 1)
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


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str] | None = None, css: str = "") -> str:
    out = [f'<table class="{css}">' if css else "<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    return "".join(out) + "</table>"


def _histogram_html(c: dict[str, Any], what: str, *, integral: bool | None = None) -> str:
    """A column's histogram (log axis by :func:`log_scale`) and a note on how it was made."""
    log = log_scale(c) and not integral
    found = histogram(c, clip_tails=True, integral=integral, log=log)
    if found is None:
        return '<p class="note">no values</p>'
    exact = "exact" if c.get("quantiles_exact") else f"rank error ≤ {c.get('rank_error', 0):.2%}"
    note = f"Approximate histogram from 201 quantiles ({exact})"
    if found[0][0] > c["min"] or found[0][-1] < c["max"]:  # clipped
        note = f"The central 99% (min {_num(c['min'])}, max {_num(c['max'])}); approximate"
    if log:
        note += f"; log axis: all values are positive and max/min > {LOG_RATIO:,.0f}"
    integer = bool(np.allclose(np.diff(found[0]), 1.0) and found[0][0] % 1 == 0.5)
    chart = histogram_svg(*found, what, log=log, integer=integer)
    return f'{chart}<p class="note">{note}.</p>'


def _moments_html(c: dict[str, Any]) -> str:
    moments = [(k, _num(c.get(k))) for k in ("mean", "std", "min", "max", "skewness", "kurtosis")]
    moments.append(("infinite", _num(c.get("infinite"))))
    quantiles = [(k, _num(v)) for k, v in (c.get("quantiles") or {}).items()]
    return (
        f"<div><h3>moments</h3>{_table(moments)}</div>"
        f"<div><h3>quantiles</h3>{_table(quantiles)}</div>"
    )


def _column_html(index: int, name: str, c: dict[str, Any], rows: int) -> str:
    kind = c.get("kind", "other")
    body = ""
    if kind == "numeric":
        body = f'<div class="row"><div>{_histogram_html(c, name)}</div>{_moments_html(c)}</div>'
    elif kind == "categorical":
        distinct = f"{c['distinct']:,}" + ("" if c.get("distinct_exact") else " (estimated)")
        note = f"; counts low by at most {c['top_error']:,}" if c.get("top_error") else ""
        if c.get("labels") is not None:
            note += "; integer codes of an indexed column (StringIndexer), shown with their labels"
        caption = f"top {len(c['top'][:20])} values by count"
        body = f"<p>{distinct} distinct values{_e(note)}</p>" + (
            top_svg(c["top"], caption, c.get("labels")) if c["top"] else ""
        )
    elif kind == "tensor":
        shapes = ", ".join(f"{_e(k)} ({v:,})" for k, v in c.get("shapes", [])[:5])
        elements = c["elements"]
        body = (
            f"<p>shape: {shapes or '–'}; {_num(elements.get('count'))} elements in all; "
            "the statistics below are over every element of every row</p>"
            f'<div class="row"><div>{_histogram_html(elements, f"{name} (elements)")}</div>'
            f"{_moments_html(elements)}</div>"
        )
    elif kind == "image":
        body = f"<p>{c.get('unreadable', 0):,} unreadable image(s)</p><div class='row'>"
        for axis in ("width", "height"):
            if c[axis].get("count"):
                body += f"<div>{_histogram_html(c[axis], f'{axis} (pixels)', integral=True)}</div>"
        for key, label in (("top_sizes", "top sizes (width x height)"), ("modes", "modes")):
            if c.get(key):
                body += f"<div>{top_svg(c[key], label)}</div>"
        body += "</div>"
    nulls = c.get("nulls") or 0
    share = f" ({nulls / rows:.1%})" if rows else ""
    return (
        f'<section id="col-{index}"><h2>{_e(name)}<span class="kind">{_e(kind)} · '
        f"{_e(c.get('type', ''))}</span></h2><p>{_num(c.get('count'))} values, "
        f"{_num(nulls)} null{share}</p>{body}</section>"
    )


def summary_line(c: dict[str, Any]) -> str:
    """One line of HTML (escaped) about a column's distribution."""
    kind = c.get("kind")
    if kind == "tensor":
        c, shapes = c["elements"], ", ".join(_e(k) for k, _ in c.get("shapes", [])[:2])
        if not c.get("count"):
            return f"shape {shapes}" if shapes else ""
        return f"shape {shapes}; elements: " + summary_line(c)
    if kind == "numeric" and c.get("count"):
        return (
            f"mean {_num(c['mean'])} ± {_num(c['std'])}; min {_num(c['min'])}, "
            f"median {_num((c.get('quantiles') or {}).get('p50'))}, max {_num(c['max'])}"
        )
    if kind == "categorical":
        labels = c.get("labels") or {}
        top = ", ".join(
            _category(k)
            + (f" · {_category(labels[str(k)])}" if str(k) in labels else "")
            + f" ({v:,})"
            for k, v in c["top"][:3]
        )
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
                cells.append(f'<span style="background:{tint};padding:0 4px">{fixed(v)}</span>')
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
            summary_line(c),
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
        f"<p>{stats.rows:,} rows · {len(stats.columns):,} columns</p>"
        f"{_table(summary, head, 'summary')}"
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
