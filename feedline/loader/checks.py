"""The checks of the loader's values: one function per kind of value.

The loader's options (:mod:`feedline.loader.options`), the pure order functions
(:mod:`feedline.loader.order.sample_order`, :mod:`feedline.loader.order.rng`) and the checkpoint
fields (:mod:`feedline.loader.order.state`) all take counts, sizes and indices: what an
acceptable one is lives here, once. Each caller words its own error around the expectation
(what was wrong, where, how to fix it): a loader option names the option, an order function
names itself, a checkpoint field says how to pass the state back unchanged.

This module imports nothing of feedline's, so the order functions stay a leaf of the loader.

Examples
--------
>>> checked_int(32, 1, fail=ValueError)
32
>>> checked_int(0, 1, fail=ValueError)
Traceback (most recent call last):
...
ValueError: an int >= 1
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["MAX_COUNT", "checked_int"]

#: the largest epoch, batch, sample or row count the loader takes (``2**62 - 1``): far more
#: than any training run reaches, and room for int64 arithmetic on positions (a count times
#: a small factor) without overflow
MAX_COUNT = (1 << 62) - 1


def checked_int(
    value: Any, low: int = 0, high: int | None = None, *, fail: Callable[[str], BaseException]
) -> int:
    """``value`` as an ``int`` in ``[low, high]`` (no upper bound when ``high`` is ``None``).

    Otherwise raises ``fail(expected)``, where ``expected`` says what was wanted (``"an int
    >= 1"``, ``"an int in [0, 3]"``) for the caller to word into its error.

    Parameters
    ----------
    value:
        The value to check: an ``int``, a NumPy integer or anything else with
        ``__index__``; a bool is refused.
    low, high:
        The smallest and largest values accepted.
    fail:
        Makes the exception raised, from the expectation.

    Examples
    --------
    >>> checked_int(np.int64(2), 0, 3, fail=ValueError)
    2
    >>> checked_int(True, 0, fail=lambda expected: ValueError(f"seed must be {expected}"))
    Traceback (most recent call last):
    ...
    ValueError: seed must be an int >= 0
    """
    if not isinstance(value, bool | np.bool_):
        try:
            number = operator.index(value)
        except TypeError:  # not an integer (a float, a string, an array of several)
            pass
        else:
            if number >= low and (high is None or number <= high):
                return number
    raise fail(f"an int >= {low}" if high is None else f"an int in [{low}, {high}]")
