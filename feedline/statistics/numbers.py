"""Numbers as the statistics tables, pages and charts print them.

:func:`number` gives table cells (thousands separators, about four significant digits),
:func:`fixed` a fixed number of decimals; neither ever prints a negative zero (``-0`` or
``-0.000``): a value that rounds to zero prints as zero. :func:`ticks` formats an axis's
tick values alike (one style per axis).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["decade", "fixed", "number", "ticks"]


def _unsigned_zero(text: str) -> str:
    """``text`` without its minus sign when every digit in it is zero (``-0.000`` -> ``0.000``)."""
    if text.startswith("-") and not any(ch in "123456789" for ch in text.split("e")[0]):
        return text[1:]
    return text


def fixed(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, never a negative zero.

    Examples
    --------
    >>> fixed(-0.0001), fixed(-0.25), fixed(-0.0)
    ('0.000', '-0.250', '0.000')
    """
    return _unsigned_zero(f"{value:.{digits}f}")


def number(value: Any, missing: str = "") -> str:
    """A table cell: thousands separators, about four significant digits; ``missing`` for None.

    Examples
    --------
    >>> number(1234567), number(-0.0), number(-0.00001234), number(3.14159), number(None, "–")
    ('1,234,567', '0', '-1.234e-05', '3.142', '–')
    """
    if value is None:
        return missing
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return _unsigned_zero(f"{value:,.0f}")
    if not math.isfinite(value):
        return str(value)
    digits = math.floor(math.log10(abs(value)))
    text = f"{value:,.{max(0, 3 - digits)}f}" if -3 <= digits < 7 else f"{value:.3e}"
    return _unsigned_zero(text)


_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def ticks(values: Sequence[float], step: float | None = None) -> list[str]:
    """Labels for an axis's ``values`` (``step`` apart, if evenly spaced), in one style.

    Magnitudes from a million up get a suffix (``20M``), tiny ones scientific notation; the
    decimals are the fewest that tell neighbouring ticks apart. Four-digit values (years)
    have no thousands separator.

    Examples
    --------
    >>> ticks([0, 2e7, 4e7]), ticks([1995, 2000, 2005]), ticks([-0.5, 0.0, 0.5])
    (['0', '20M', '40M'], ['1995', '2000', '2005'], ['-0.5', '0.0', '0.5'])
    >>> ticks([0.0, 0.0002, 0.0004]), ticks([12000, 14000])
    (['0', '2e-04', '4e-04'], ['12,000', '14,000'])
    """
    values = [float(v) for v in values]
    if not values:
        return []
    if step is None:
        gaps = [abs(b - a) for a, b in itertools.pairwise(values) if b != a]
        step = min(gaps) if gaps else abs(values[0]) or 1.0
    top = max(abs(v) for v in values)
    for scale, suffix in _SUFFIXES[:3]:
        if top >= 1e6 and top >= scale:
            decimals = max(0, -math.floor(math.log10(step / scale) + 1e-9))
            return [_unsigned_zero(f"{v / scale:.{decimals}f}") + suffix if v else "0"
                    for v in values]  # fmt: skip
    if top < 1e-3 or step < 1e-4:
        for decimals in range(5):
            labels = [_unsigned_zero(f"{v:.{decimals}e}") if v else "0" for v in values]
            if len(set(labels)) == len(set(values)):
                break
        return labels
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    sep = "," if top >= 1e4 else ""
    return [_unsigned_zero(f"{v:{sep}.{decimals}f}") for v in values]


def decade(power: int) -> str:
    """The label of ``10 ** power`` on a log axis: ``0.01``, ``1``, ``1k``, ``10M``, ``1e-05``.

    Examples
    --------
    >>> [decade(p) for p in (-5, -2, 0, 3, 7, 13)]
    ['1e-05', '0.01', '1', '1k', '10M', '10T']
    """
    if power < -3 or power > 14:
        return f"1e{power:+03d}"
    if power < 0:
        return f"{10.0**power:.{-power}f}"
    for scale, suffix in _SUFFIXES:
        if power >= round(math.log10(scale)):
            return f"{10 ** (power - round(math.log10(scale)))}{suffix}"
    return str(10**power)
