"""Text that came from data, made inert before feedline shows it.

Column names, values, paths and lineage come from files anyone may have written. Shown as
they are, an escape sequence in them drives the terminal (clears it, retitles the window,
fakes a prompt), a bidi override (U+202E) reverses what follows, and ``[bold]`` is parsed
as Rich markup. Every repr, table and notebook view of data-derived text goes through
:func:`inert` (plain strings) or :func:`safe_text` (Rich text): the CLI, ``Dataset.show()``,
``repr(ds)``, ``_repr_html_`` and the result objects' reprs.

Examples
--------
>>> inert("price\\x1b[2J\\u202e")
'price\\\\x1b[2J\\\\u202e'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["inert", "safe_text"]


def inert(value: object) -> str:
    """``str(value)`` with every character Python does not call printable shown as its
    Python escape (``\\x1b``, ``\\u202e``, ``\\n``): C0/C1 controls such as ESC, BEL and NUL,
    bidi overrides, zero-width and other format characters, line separators.

    Examples
    --------
    >>> print(inert("\\x1b]0;title\\x07 \\u202egnp.exe ü 日本"))
    \\x1b]0;title\\x07 \\u202egnp.exe ü 日本
    >>> inert(3)
    '3'
    """
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text


def safe_text(value: object, style: str = "") -> Text:
    """``value`` as inert terminal text: shown as is, never driving the terminal.

    :func:`inert` text in a Rich ``Text``, so ``[bold]`` in data is never parsed as markup
    (nor ``:emoji:`` codes).

    Examples
    --------
    >>> print(safe_text("\\x1b]0;title\\x07[bold]x[/] \\u202egnp.exe").plain)
    \\x1b]0;title\\x07[bold]x[/] \\u202egnp.exe
    """
    from rich.text import Text

    return Text(inert(value), style=style)
