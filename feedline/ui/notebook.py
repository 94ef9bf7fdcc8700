"""Notebook views (``_repr_html_``) and one-line ``repr`` texts of feedline's result objects.

Every view is one self-contained ``<div>`` (inline CSS, no scripts, no external resources),
every string in it is HTML-escaped (column names may hold markup) with its control and
bidi characters shown as escapes (:func:`~feedline.ui.inert_text.inert`), and it
stays small for wide data: a table lists at most ``MAX_ROWS`` entries and then one
"… and K more" row.

Examples
--------
>>> page = table(["column"], [["a"], ["<b>"], ["c"]], max_rows=2)
>>> "<td>&lt;b&gt;</td>" in page, "… and 1 more" in page, ">c<" in page
(True, True, False)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from feedline.ui.inert_text import inert

__all__ = ["MAX_ROWS", "Markup", "names", "short_type", "size", "table", "view"]

#: entries a notebook table lists before "… and K more"
MAX_ROWS = 20
#: names a ``repr`` lists before "… +K more"
MAX_NAMES = 8
#: characters of a table cell before it is cut with "…"
MAX_CELL = 200

_STYLE = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.4"
_CSS = (
    ".feedline-view table{border-collapse:collapse;margin:4px 0}.feedline-view td,"
    ".feedline-view th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;"
    "vertical-align:top}.feedline-view th{background:#f4f6f8}"
)


class Markup(str):
    """A string that is already HTML (written by feedline itself): not escaped again."""


def _cell(value: Any) -> str:
    if isinstance(value, Markup):
        return inert(value)  # feedline's own HTML (data in it escaped): no controls either
    text = inert(value)
    text = text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
    return html.escape(text, quote=True)


def table(head: Sequence[str], rows: Sequence[Sequence[Any]], *, max_rows: int = MAX_ROWS) -> str:
    """An HTML table: cells escaped (unless :class:`Markup`) and cut at ``MAX_CELL``
    characters, at most ``max_rows`` rows; no header row when ``head`` is empty."""
    out = ["<table>"]
    if head:
        out += ["<thead><tr>", *(f"<th>{_cell(h)}</th>" for h in head), "</tr></thead>"]
    out.append("<tbody>")
    for row in rows[:max_rows]:
        out.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>")
    if len(rows) > max_rows:
        more = f"… and {len(rows) - max_rows:,} more"
        span = len(head) or max(len(r) for r in rows)
        out.append(f'<tr><td colspan="{span}"><em>{more}</em></td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def view(title: str, lines: Sequence[str], body: str = "") -> str:
    """One notebook view: a bold ``title``, escaped ``lines`` of text, then ``body`` (HTML)."""
    text = "".join(f"<div>{html.escape(inert(line))}</div>" for line in lines)
    return (
        f'<div class="feedline-view" style="{_STYLE}"><style>{_CSS}</style>'
        f"<strong>{html.escape(inert(title))}</strong>{text}{body}</div>"
    )


def names(items: Sequence[str], limit: int = MAX_NAMES) -> str:
    """``items`` for a ``repr``: at most ``limit`` of them, then ``… +K more``.

    Examples
    --------
    >>> names(["a", "b", "c"], 2)
    "'a', 'b', … +1 more"
    """
    shown = ", ".join(repr(i) for i in items[:limit])
    return shown + (f", … +{len(items) - limit:,} more" if len(items) > limit else "")


def size(n: int) -> str:
    """A byte count for people: ``3.2 KB``, ``1.5 GB`` (powers of 1000), with the exact count.

    Examples
    --------
    >>> size(3160), size(12), size(1_500_000_000)
    ('3.2 KB (3,160 bytes)', '12 bytes', '1.5 GB (1,500,000,000 bytes)')
    """
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if n >= scale:
            return f"{n / scale:,.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def short_type(kind: pa.DataType) -> str:
    """A compact type name: ``tensor<float, 2×4>``, ``list<int64>``.

    Examples
    --------
    >>> short_type(pa.fixed_shape_tensor(pa.float32(), [2, 4])), short_type(pa.list_(pa.int8()))
    ('tensor<float, 2×4>', 'list<int8>')
    """
    if isinstance(kind, pa.FixedShapeTensorType):
        return f"tensor<{kind.value_type}, {'×'.join(str(d) for d in kind.shape)}>"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{short_type(kind.value_type)}>"
    return str(kind)
