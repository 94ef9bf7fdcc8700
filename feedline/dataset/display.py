"""How a Dataset shows itself: ``repr``, the notebook HTML view, and ``show()``'s rich table.

Names and values come from data: every one is shown inert (control and bidi characters as
escapes, never Rich markup; :mod:`feedline.ui.inert_text`), so a hostile column name cannot
drive the terminal or the notebook.

Nothing here runs a plan: :func:`describe` and :func:`to_html` use the plan and the schema
(only when the schema is known without running user functions) and a row count only when
metadata gives it. :func:`render_table` formats rows already read (``Dataset.show`` reads
them with ``head``): long strings are cut, lists shortened and tensors summarized as their
dtype and shape, so a row of images prints as one line.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from feedline.engines.local.engine import plan_schema
from feedline.errors import FeedlineError
from feedline.plan.relational import plan_lines
from feedline.ui.inert_text import inert, safe_text
from feedline.ui.notebook import short_type, table

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from feedline.plan.plan import Plan

__all__ = ["describe", "format_value", "render_table", "to_html"]

#: columns named in ``repr`` before "... (+N more)"
_REPR_COLUMNS = 8
#: characters of a cell in ``show()`` before it is cut with "…"
_CELL_CHARS = 40
#: list items shown in a cell
_LIST_ITEMS = 4


def _schema(plan: Plan) -> pa.Schema | None:
    """The output schema when it is known without running user code, else ``None``."""
    if _runs_user_code(plan):
        return None

    try:
        return plan_schema(plan)
    except (FeedlineError, OSError, pa.ArrowException):
        return None


def _runs_user_code(plan: Plan) -> bool:
    """True when the plan, or a plan feeding it (a join's inputs…), has user functions."""
    inputs = getattr(plan.source, "inputs", ())
    return plan.has_user_functions or any(_runs_user_code(p) for p in inputs)


def _rows(plan: Plan) -> int | None:
    try:
        return plan.known_rows()
    except (FeedlineError, OSError, pa.ArrowException):
        return None


def describe(plan: Plan) -> str:
    """The text ``repr(dataset)`` shows: source, operators, schema summary.

    Examples
    --------
    >>> import feedline as fl
    >>> print(describe(fl.range(3).limit(2).plan))
    Dataset(range: 3 rows -> Limit(2))
      schema: 1 column: id: int64
    """
    lines = ["Dataset(" + " -> ".join([plan.source.describe(), *plan.describe()[1:]]) + ")"]
    lines += _input_lines(plan, 1)
    schema = _schema(plan)
    if schema is None:
        lines.append("  schema: known after running the user functions (ds.schema())")
    else:
        shown = ", ".join(f"{f.name}: {short_type(f.type)}" for f in list(schema)[:_REPR_COLUMNS])
        more = f", ... (+{len(schema) - _REPR_COLUMNS} more)" if len(schema) > _REPR_COLUMNS else ""
        noun = "column" if len(schema) == 1 else "columns"
        lines.append(f"  schema: {len(schema)} {noun}: {shown}{more}")
    return "\n".join(inert(line) for line in lines)


def _input_lines(plan: Plan, depth: int) -> list[str]:
    """The input plans of a relational source (a join's two sides…), one line each."""
    lines = []
    for number, child in enumerate(getattr(plan.source, "inputs", ())):
        chain = " -> ".join([child.source.describe(), *child.describe()[1:]])
        lines.append(f"{'  ' * depth}input {number}: {chain}")
        lines += _input_lines(child, depth + 1)
    return lines


def to_html(plan: Plan) -> str:
    """The notebook view: a schema table, the plan, and the row count when metadata knows it.

    Examples
    --------
    >>> import feedline as fl
    >>> page = to_html(fl.range(3).plan)
    >>> "<td>id</td>" in page and "3 rows" in page
    True
    """
    esc = html.escape
    parts = ["<div class='feedline-dataset'><strong>feedline Dataset</strong>"]
    rows = _rows(plan)
    if rows is not None:
        parts.append(f" <span>({rows:,} rows)</span>")

    parts.append(f"<pre>{esc(chr(10).join(inert(line) for line in plan_lines(plan)))}</pre>")
    schema = _schema(plan)
    if schema is None:
        parts.append("<p>Schema: known after running the user functions.</p>")
    else:
        noun = "column" if len(schema) == 1 else "columns"
        parts.append(f"<div>{len(schema):,} {noun}</div>")
        parts.append(table(["column", "type"], [[f.name, short_type(f.type)] for f in schema]))
    parts.append("</div>")
    return "".join(parts)


def format_value(value: Any, kind: pa.DataType) -> str:
    """One cell of ``show()``: short, one line; tensors as ``<dtype shape>``.

    Examples
    --------
    >>> format_value([1, 2, 3, 4, 5, 6], pa.list_(pa.int64()))
    '[1, 2, 3, 4, … +2]'
    >>> format_value(None, pa.int64())
    'null'
    """
    if value is None:
        return "null"
    if isinstance(kind, pa.FixedShapeTensorType):
        return "<" + short_type(kind) + ">"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return f"<{len(value)} bytes>"
    if isinstance(value, list):
        items = [format_value(v, _item_type(kind)) for v in value[:_LIST_ITEMS]]
        more = f", … +{len(value) - _LIST_ITEMS}" if len(value) > _LIST_ITEMS else ""
        text = "[" + ", ".join(items) + more + "]"
    else:
        text = str(value)
    text = text.replace("\n", "⏎")
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 1] + "…"


def _item_type(kind: pa.DataType) -> pa.DataType:
    return getattr(kind, "value_type", pa.null())


def render_table(table: pa.Table, title: str | None = None) -> Table:
    """A ``rich`` table of ``table``'s rows (header: name and type), every name and value
    inert (:func:`~feedline.ui.inert_text.safe_text`)."""
    from rich.table import Table
    from rich.text import Text

    out = Table(
        title=safe_text(title) if title is not None else None,
        show_lines=False,
        header_style="bold",
    )
    for field in table.schema:
        kind = field.type
        type_name = short_type(kind)
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        justify: Literal["right", "left"] = "right" if numeric else "left"
        out.add_column(
            Text.assemble(safe_text(field.name), "\n", safe_text(type_name, style="dim")),
            justify=justify,
            overflow="ellipsis",
            max_width=_CELL_CHARS,
            no_wrap=True,
        )
    kinds = [f.type for f in table.schema]
    for row in table.to_pylist():
        values = row.values()
        out.add_row(*(safe_text(format_value(v, k)) for v, k in zip(values, kinds, strict=True)))
    return out


def print_table(table: pa.Table, title: str | None, console: Console | None) -> None:
    """Print :func:`render_table` of ``table`` on ``console`` (a new one on stdout if ``None``)."""
    from rich.console import Console

    (console or Console()).print(render_table(table, title))
