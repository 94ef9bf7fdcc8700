"""Checking a saved preprocessor state before it is trusted: every fitted value, by kind.

A state comes back from a manifest or a file that anyone may have edited, so
:func:`~feedline.preprocess.preprocessor.from_state` checks it against what the preprocessor
declares (:meth:`~feedline.preprocess.preprocessor.Preprocessor.fitted_spec`: fitted key → kind of
its per-column values) and raises :class:`~feedline.errors.FormatError` naming the field,
instead of a ``KeyError`` or an Arrow error at the first transform, or NaN outputs.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from feedline.errors import FormatError

__all__ = ["KINDS", "check_fitted", "invalid_state", "non_finite"]

_FIX = "Fix: re-fit the preprocessor and save its state again; do not edit a saved state by hand."


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> str | None:
    return None if _finite(value) else "is not a finite number"


def _positive(value: Any) -> str | None:
    return None if _finite(value) and value > 0 else "is not a finite number > 0"


def _nonnegative(value: Any) -> str | None:
    return None if _finite(value) and value >= 0 else "is not a finite number >= 0"


def _count(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "is not a count (an int >= 0)"


def _fraction(value: Any) -> str | None:
    return None if _finite(value) and 0 <= value <= 1 else "is not a fraction in [0, 1]"


def _labels(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return "is not a list of strings"
    if not value:
        return "is an empty list of labels"
    repeated = sorted(v for v, n in Counter(value).items() if n > 1)
    return f"has duplicate labels {repeated[:10]}" if repeated else None


def _splits(value: Any) -> str | None:
    if not isinstance(value, list):
        return "is not a list of numbers"
    try:
        numbers = [v if _finite(v) else float({"inf": "inf", "-inf": "-inf"}[v]) for v in value]
    except (KeyError, TypeError):
        return "holds a value that is neither a finite number nor 'inf'/'-inf'"
    if any(b <= a for a, b in itertools.pairwise(numbers)):
        return "is not strictly increasing"
    return None


def _scalar(value: Any) -> str | None:
    ok = value is None or isinstance(value, str | bool | int) or _finite(value)
    return None if ok else "is not a plain value (str, number, bool or null)"


def _drop(value: Any) -> str | None:
    return None if value is None or (value == 0 and _count(value) is None) else "is not null or 0"


#: kind name → check returning what is wrong with a value (``None`` when it is fine)
KINDS: dict[str, Callable[[Any], str | None]] = {
    "number": _number,
    "positive": _positive,
    "nonnegative": _nonnegative,
    "count": _count,
    "fraction": _fraction,
    "labels": _labels,
    "splits": _splits,
    "scalar": _scalar,
    "drop": _drop,
}


def invalid_state(owner: str, field: str, value: Any, problem: str) -> FormatError:
    """The error for one bad field of a saved state.

    Examples
    --------
    >>> print(invalid_state("Scaler(x)", "fitted.scale.x", 0.0, "is not a finite number > 0"))
    The saved state of Scaler(x) is invalid: fitted.scale.x = 0.0 is not a ... Fix: re-fit ...
    """
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return FormatError(
        f"The saved state of {owner} is invalid: {field} = {shown} {problem}. {_FIX}"
    )


def non_finite(value: Any, path: str = "state") -> str | None:
    """The path of the first NaN or infinite float inside ``value`` (dicts and lists), or ``None``.

    Examples
    --------
    >>> non_finite({"fitted": {"mean": {"x": float("nan")}}})
    'state.fitted.mean.x'
    >>> non_finite({"a": [1.0, 2]}) is None
    True
    """
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        items = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = non_finite(item, where)
        if found is not None:
            return found
    return None


def check_fitted(owner: str, columns: tuple[str, ...], fitted: Any, spec: dict[str, str]) -> None:
    """Check ``fitted`` against ``spec`` (fitted key → kind of its value for each column).

    Examples
    --------
    >>> check_fitted("Indexer(c)", ("c",), {"labels": {"c": ["a", "a"]}}, {"labels": "labels"})
    Traceback (most recent call last):
    ...
    feedline.errors.FormatError: The saved state of Indexer(c) is invalid: fitted.labels.c = ...
    """
    if fitted is None or not spec:
        return
    if not isinstance(fitted, dict):
        raise invalid_state(owner, "fitted", fitted, "is not a dict of fitted parameters")
    for key, kind in spec.items():
        if key not in fitted:
            raise FormatError(
                f"The saved state of {owner} is invalid: fitted.{key} is missing (it has "
                f"{sorted(fitted)[:10]}). {_FIX}"
            )
        per_column = fitted[key]
        if not isinstance(per_column, dict):
            raise invalid_state(
                owner, f"fitted.{key}", per_column, "is not a dict of column -> value"
            )
        for column in columns:
            if column not in per_column:
                raise invalid_state(
                    owner, f"fitted.{key}", per_column, f"has no entry for column {column!r}"
                )
            problem = KINDS[kind](per_column[column])
            if problem is not None:
                raise invalid_state(owner, f"fitted.{key}.{column}", per_column[column], problem)
