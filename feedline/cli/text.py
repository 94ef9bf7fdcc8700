"""What the ``feedline`` command prints: inert text and human-readable numbers.

Everything printed that came from data (column names, lineage, paths, statistics, error
messages) goes through :func:`~feedline.ui.inert_text.safe_text` first (or
:func:`safe_table` for tables built elsewhere), so a hostile manifest cannot drive the
terminal (escape sequences, bidi overrides) or inject Rich markup. Numbers in tables go
through :func:`count`, :func:`size`, :func:`percent`, :func:`seconds` or :func:`rate`.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from feedline.ui.inert_text import safe_text

__all__ = ["count", "percent", "print_error", "rate", "safe_table", "seconds", "size"]


def safe_table(table: Table) -> Table:
    """Make the plain strings of a table built elsewhere (statistics, drift) inert."""

    def inert(value: Any) -> Any:
        return safe_text(value) if isinstance(value, str) else value

    table.title, table.caption = inert(table.title), inert(table.caption)
    for column in table.columns:
        column.header, column.footer = inert(column.header), inert(column.footer)
        column._cells[:] = [inert(cell) for cell in column.cells]  # Rich's list of cells
    return table


def print_error(kind: str, message: str) -> None:
    """``error: Kind: message`` on standard error, inert, never wrapped mid-word."""
    text = Text.assemble(("error:", "bold red"), safe_text(f" {kind}: {message}"))
    Console(stderr=True).print(text, soft_wrap=True)


def count(n: int | float | None) -> str:
    """A whole number with thousands separators.

    Examples
    --------
    >>> count(1234567), count(0), count(None)
    ('1,234,567', '0', '')
    """
    return "" if n is None else f"{n:,.0f}"


def size(n: int | float | None) -> str:
    """A number of bytes in B, KB, MB, GB or TB (powers of 1000, as disks are sold).

    Examples
    --------
    >>> size(512), size(1_536), size(12_345_678), size(2.5e9), size(None)
    ('512 B', '1.5 KB', '12.3 MB', '2.50 GB', '')
    """
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.2f} {unit}" if unit == "GB" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:,.2f} TB"


def percent(fraction: float | None) -> str:
    """A fraction as a percentage with one decimal.

    Examples
    --------
    >>> percent(0.1234), percent(1.0), percent(None)
    ('12.3%', '100.0%', '')
    """
    return "" if fraction is None else f"{fraction:.1%}"


def seconds(s: float | None) -> str:
    """A duration: milliseconds under a second, seconds under a minute, then minutes.

    Examples
    --------
    >>> seconds(0.0123), seconds(2.345), seconds(125.0), seconds(None)
    ('12.3 ms', '2.35 s', '2 min 5 s', '')
    """
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 60:
        return f"{s:.2f} s"
    minutes, rest = divmod(round(s), 60)
    return f"{minutes:,} min {rest} s"


def rate(per_second: float | None, unit: str = "") -> str:
    """A rate per second with thousands separators (about three significant digits).

    Examples
    --------
    >>> rate(11_412_345.6, "samples"), rate(12.345), rate(0.0)
    ('11,412,346 samples/s', '12.3/s', '0/s')
    """
    if per_second is None:
        return ""
    digits = 1 if 0 < abs(per_second) < 100 and not math.isclose(per_second % 1, 0) else 0
    return f"{per_second:,.{digits}f}{' ' + unit if unit else ''}/s"
