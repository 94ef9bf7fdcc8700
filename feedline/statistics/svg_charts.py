"""Inline SVG charts of the statistics page: histograms and top-value bars.

Each chart is a standalone SVG (``xmlns``, ``viewBox``, its own font attributes), so it
draws the same inside the page, saved alone, or rendered by an SVG library. Nothing is
clipped: text widths are estimated per character (:func:`text_width`, on the wide side for
the common sans-serif fonts), margins grow to fit the tick labels, long labels are shortened
with "…", and an axis gets as many ticks as fit without their labels touching.

Examples
--------
>>> import numpy as np
>>> svg = histogram_svg(np.linspace(0.0, 1e7, 31), np.ones(30), "bytes")
>>> svg.startswith("<svg xmlns=") and ">10M</text>" in svg
True
"""

from __future__ import annotations

import html
import math
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.statistics.numbers import decade, number, ticks

__all__ = ["histogram_svg", "shown_value", "text_width", "top_svg"]

WIDTH, HEIGHT = 520, 210  # chart size (pixels)
FONT_SIZE = 11
FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
TICK_GAP = 8  # least space between two tick labels (pixels)

_NARROW, _SEMI, _WIDE = set("il.,:;'|!`"), set('fjrtI ()[]{}-/\\"*'), set("mwMW@%…")


def _em(ch: str) -> float:
    if ch in _NARROW:
        return 0.32
    if ch in _SEMI:
        return 0.45
    if ch in _WIDE or unicodedata.east_asian_width(ch) in "WF":
        return 1.02
    if ch.isupper():
        return 0.78
    return 0.66 if ch.isascii() else 0.8


def text_width(text: str, size: float = FONT_SIZE) -> float:
    """Estimated width in pixels of ``text`` at ``size`` (at least that of DejaVu Sans).

    Examples
    --------
    >>> round(text_width("1,000")), round(text_width("1,000", 22))
    (33, 65)
    """
    return size * sum(_em(ch) for ch in text)


def fit(text: str, width: float, size: float = FONT_SIZE) -> str:
    """``text``, shortened with "…" to at most ``width`` pixels (estimated).

    Examples
    --------
    >>> fit("short", 100), fit("a rather long category name", 60)
    ('short', 'a rathe…')
    """
    if text_width(text, size) <= width:
        return text
    while text and text_width(text + "…", size) > width:
        text = text[:-1]
    return text.rstrip() + "…"


def shown_value(value: Any) -> tuple[str, bool]:
    """How a category value is labelled, and whether the label is a description.

    The empty string is ``(empty string)`` (a description, drawn in italics, never blank);
    strings with leading or trailing spaces or control characters are quoted so the
    spaces show.

    Examples
    --------
    >>> shown_value(""), shown_value(" padded "), shown_value("a\\nb"), shown_value(3)
    (('(empty string)', True), ('" padded "', False), ("'a\\\\nb'", False), ('3', False))
    """
    if isinstance(value, str):
        if value == "":
            return "(empty string)", True
        if not value.isprintable():
            return repr(value), False
        if value != value.strip():
            return f'"{value}"', False
    return str(value), False


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _svg(width: float, height: float, label: str, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}" font-family="{FONT}" font-size="{FONT_SIZE}" '
        f'role="img" aria-label="{_e(label)}">{body}</svg>'
    )


def _text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{_e(text)}</text>'


def nice_ticks(low: float, high: float, count: int, *, integer: bool = False) -> np.ndarray:
    """About ``count`` round values (steps of 1, 2, 2.5 or 5 times a power of ten) in
    ``[low, high]``.

    Examples
    --------
    >>> nice_ticks(0.0, 97.0, 5).tolist(), nice_ticks(1995, 2023, 4, integer=True).tolist()
    ([0.0, 25.0, 50.0, 75.0], [2000.0, 2010.0, 2020.0])
    """
    if not high > low:
        return np.array([low])
    raw = (high - low) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * 0.999)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(low / step - 1e-9) * step
    out = np.arange(first, high + step * 1e-9, step)
    return np.where(np.abs(out) < step * 1e-9, 0.0, out)


def _x_ticks(
    low: float, high: float, width: float, *, log: bool, integer: bool
) -> tuple[list[float], list[str]]:
    """The most tick values between ``low`` and ``high`` whose labels fit ``width`` pixels."""
    if log:
        first, last = math.ceil(math.log10(low) - 1e-9), math.floor(math.log10(high) + 1e-9)
        powers = list(range(first, last + 1))
        for every in range(1, len(powers) + 1):
            chosen = powers[::every]
            labels = [decade(p) for p in chosen]
            values = [10.0**p for p in chosen]
            if _fits(values, labels, low, high, width, log=True):
                return values, labels
        return values[:1], labels[:1]
    for count in (7, 6, 5, 4, 3, 2):
        values = nice_ticks(low, high, count, integer=integer).tolist()
        labels = ticks(values)
        if _fits(values, labels, low, high, width, log=False):
            return values, labels
    return values[:1], labels[:1]


def _position(v: float, low: float, high: float, width: float, log: bool) -> float:
    if high <= low:
        return width / 2
    if log:
        return width * (math.log10(v) - math.log10(low)) / (math.log10(high) - math.log10(low))
    return width * (v - low) / (high - low)


def _fits(
    values: Sequence[float], labels: Sequence[str], low: float, high: float, width: float,
    *, log: bool,
) -> bool:  # fmt: skip
    xs = [_position(v, low, high, width, log) for v in values]
    half = [text_width(t) / 2 for t in labels]
    return all(xs[i + 1] - half[i + 1] - (xs[i] + half[i]) >= TICK_GAP for i in range(len(xs) - 1))


def histogram_svg(
    edges: np.ndarray,
    counts: np.ndarray,
    caption: str,
    *,
    log: bool = False,
    integer: bool = False,
) -> str:
    """A vertical-bar histogram: ``counts`` between ``edges``, on a log axis when ``log``.

    ``integer`` marks one bin per integer (ticks at whole numbers). The y axis has round
    counts; the x axis as many round values (or powers of ten) as fit.
    """
    edges, counts = np.asarray(edges, np.float64), np.asarray(counts, np.float64)
    low, high = float(edges[0]), float(edges[-1])
    top = float(counts.max()) if len(counts) else 0.0
    y_values = nice_ticks(0.0, top, 5, integer=True) if top > 0 else np.array([0.0])
    if len(y_values) > 1 and y_values[-1] < top:  # end the axis on a round count
        y_values = np.append(y_values, y_values[-1] + (y_values[1] - y_values[0]))
    y_labels = [number(int(v)) for v in y_values]
    y_top = max(top, float(y_values[-1]), 1.0)
    left = max(text_width(t) for t in y_labels) + 12
    plot_top, plot_h = 10, HEIGHT - 10 - 42
    base = plot_top + plot_h
    right = 14.0
    for _ in range(2):  # margins depend on the end labels, the labels on the width
        width = WIDTH - left - right
        x_values, x_labels = _x_ticks(low, high, width, log=log, integer=integer)
        xs = [_position(v, low, high, width, log) for v in x_values]
        halves = [text_width(t) / 2 for t in x_labels]
        left = max(left, halves[0] - xs[0] + 4)
        right = max(14.0, halves[-1] - (width - xs[-1]) + 4)
    width = WIDTH - left - right
    bars = []
    for i, c in enumerate(counts):
        x0 = left + _position(edges[i], low, high, width, log)
        x1 = left + _position(edges[i + 1], low, high, width, log)
        h = plot_h * float(c) / y_top
        bars.append(
            f'<rect x="{x0 + 0.5:.1f}" y="{base - h:.1f}" width="{max(x1 - x0 - 1, 0.5):.1f}" '
            f'height="{h:.1f}" fill="#4c8bd6"><title>{_e(number(edges[i]))} – '
            f"{_e(number(edges[i + 1]))}: {c:,.0f}</title></rect>"
        )
    parts = [*bars]
    for v, label in zip(y_values, y_labels, strict=True):
        y = base - plot_h * float(v) / y_top
        parts.append(f'<line x1="{left - 3:.1f}" y1="{y:.1f}" x2="{left:.1f}" y2="{y:.1f}" '
                     'stroke="#555"/>' + _text(left - 5, y + 4, label, "end"))  # fmt: skip
    for v, label in zip(x_values, x_labels, strict=True):
        x = left + _position(v, low, high, width, log)
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 3}" '
                     'stroke="#555"/>' + _text(x, base + 15, label))  # fmt: skip
    parts.append(
        f'<line x1="{left:.1f}" y1="{base}" x2="{left + width:.1f}" y2="{base}" stroke="#555"/>'
        f'<line x1="{left:.1f}" y1="{plot_top}" x2="{left:.1f}" y2="{base}" stroke="#555"/>'
    )
    suffix = " (log scale)" if log else ""
    text = fit(caption, WIDTH - 8 - text_width(suffix)) + suffix  # the name is cut, not the scale
    parts.append(_text(WIDTH / 2, HEIGHT - 8, text))
    return _svg(WIDTH, HEIGHT, caption + suffix, "".join(parts))


def top_svg(
    rows: Sequence[Sequence[Any]], caption: str, labels: dict[str, Any] | None = None
) -> str:
    """Horizontal bars of ``(value, count)`` pairs (at most 20); ``labels`` names values
    (an indexed column's ids: ``1 · hats``)."""
    rows = list(rows)[:20]
    names = []
    for value, _ in rows:
        text, described = shown_value(value)
        if labels and str(value) in labels:
            text = f"{text} · {shown_value(labels[str(value)])[0]}"
        names.append((text, described))
    line = 18
    height = line * len(rows) + 28
    counts = [f"{int(c):,}" for _, c in rows]
    most = max((int(c) for _, c in rows), default=1) or 1
    left = min(max((text_width(t) for t, _ in names), default=0) + 14, WIDTH * 0.45)
    room = WIDTH - left - max((text_width(t) for t in counts), default=0) - 12
    parts = []
    for i, ((_value, count), (text, described)) in enumerate(zip(rows, names, strict=True)):
        y, w = 4 + i * line, room * int(count) / most
        style = ' font-style="italic" fill="#6e7781"' if described else ' xml:space="preserve"'
        parts.append(
            _text(left - 6, y + 12, fit(text, left - 10), "end", style)
            + f'<rect x="{left:.1f}" y="{y + 2}" width="{max(w, 1):.1f}" height="{line - 5}" '
            f'fill="#2da44e"><title>{_e(text)}: {counts[i]}</title></rect>'
            + _text(left + max(w, 1) + 4, y + 12, counts[i], "start")
        )
    parts.append(_text(4, height - 8, fit(caption, WIDTH - 8), "start"))
    return _svg(WIDTH, height, caption, "".join(parts))
