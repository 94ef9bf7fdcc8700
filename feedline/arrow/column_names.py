"""Column names: every column of a dataset has a name of its own.

Arrow lets a schema name two columns alike, but nothing downstream can tell them apart:
``to_pylist()`` keeps one of them, a Parquet file holding both cannot be read back
(``Multiple matches for FieldRef.Name``). Every operator that names columns (``rename``,
``select``, ``map_batches`` outputs, the in-memory constructors) and every writer checks its
names with :func:`check_unique`.

Examples
--------
>>> repeated(["k", "s", "s", "k", "v"])
['k', 's']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from feedline.errors import SchemaError

__all__ = ["check_unique", "repeated"]


def repeated(names: Iterable[str]) -> list[str]:
    """The names that occur more than once in ``names``, in order of first occurrence.

    Examples
    --------
    >>> repeated(["a", "b"]), repeated(["z", "z", "s"])
    ([], ['z'])
    """
    listed = list(names)
    counts = Counter(listed)
    return [name for name in dict.fromkeys(listed) if counts[name] > 1]


def check_unique(names: Iterable[str], what: str, fix: str) -> None:
    """Raise :class:`~feedline.errors.SchemaError` when a name occurs twice in ``names``.

    Parameters
    ----------
    names
        The column names produced (in order).
    what
        What produced them, for the message (``"rename(v->s)"``, ``"the schema written"``).
    fix
        How to fix it (the text after ``Fix:``).

    Examples
    --------
    >>> check_unique(["k", "s"], "rename(v->s)", "rename to a new name.")
    >>> check_unique(["k", "s", "s"], "rename(v->s)", "rename to a new name.")
    Traceback (most recent call last):
    ...
    feedline.errors.SchemaError: rename(v->s) gives more than one column named ['s'] ...
    """
    listed = list(names)
    twice = repeated(listed)
    if twice:
        shown = listed if len(listed) <= 50 else [*listed[:50], "..."]
        raise SchemaError(
            f"{what} gives more than one column named {twice} (columns: {shown}); a dataset "
            f"needs one name per column, or one of them is lost or unreadable. Fix: {fix}"
        )
