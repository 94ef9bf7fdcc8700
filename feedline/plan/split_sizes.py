"""How ``split`` sizes its pieces: exact totals, and each stratum cut in proportion.

``split(fractions)`` ranks the rows of each stratum by their seeded row key
(:mod:`feedline.plan.rowhash`); piece ``i`` of a stratum is a range of those ranks. Without
``stratify`` there is one stratum of ``N`` rows, and piece ``i`` gets the ranks
``floor(c_(i-1) * N) <= r < floor(c_i * N)`` (``c`` the cumulative fractions,
:func:`~feedline.plan.relational.split_bounds`).

With ``stratify``, cutting every stratum that way on its own would make the totals drift by
up to one row per stratum and piece (3,000 strata of 5 rows and ``test_size=0.1``: every
stratum gives its test piece ``5 - floor(0.9 * 5) = 1`` row, 20% instead of 10%). So the
sizes are allocated over all the strata at once (:func:`stratum_bounds`): the totals are
exactly the unstratified ones, ``floor(c_i * N) - floor(c_(i-1) * N)``, and each stratum
gets its proportional share of each piece rounded up or down (a *systematic* rounding over
the strata in the order of their smallest row key, a seeded and engine-independent order).
Every engine computes the strata's sizes, calls :func:`stratum_bounds` and keeps, in each
stratum, the ranks between its bounds, so the partition is the same on every engine.

Examples
--------
>>> stratum_bounds([5] * 4, [0.9, 0.1]).tolist()  # 18 + 2 rows, as for 20 rows unstratified
[[0, 4, 5], [0, 5, 5], [0, 4, 5], [0, 5, 5]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from feedline.plan.relational import split_bounds

__all__ = ["piece_totals", "stratum_bounds"]


def piece_totals(rows: int, fractions: Sequence[float]) -> list[int]:
    """The exact size of each piece of ``split(fractions)`` over ``rows`` rows.

    Examples
    --------
    >>> piece_totals(10, [0.7, 0.2, 0.1])
    [7, 2, 1]
    >>> piece_totals(160_000, [0.8, 0.2])
    [128000, 32000]
    """
    return [math.floor(hi * rows) - math.floor(lo * rows) for lo, hi in split_bounds(fractions)]


def stratum_bounds(sizes: Sequence[int] | np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    """The rank bounds of each piece in each stratum: an int64 array ``(strata, pieces + 1)``.

    ``sizes`` are the strata's row counts, in the order of their smallest row key. Row
    ``r`` (rank by row key in its stratum ``s``) belongs to piece ``i`` when
    ``bounds[s, i] <= r < bounds[s, i + 1]``; ``bounds[s, 0] == 0`` and
    ``bounds[s, -1] == sizes[s]``, so every row lands in exactly one piece.

    The pieces are allocated one after the other: piece ``i`` takes its exact total ``T``
    (:func:`piece_totals`) from the ``L`` rows the earlier pieces left, stratum ``s`` (with
    ``r_s`` rows left, ``P_s`` of them in the strata before it) giving
    ``floor(T * (P_s + r_s) / L) - floor(T * P_s / L)`` rows (exact integer arithmetic). So
    the totals are exact, and with two pieces each stratum gives ``floor`` or ``ceil`` of
    its share ``T * n_s / N``; with more, a stratum's pieces stay within a few rows of their
    shares (under 3 rows with up to 5 pieces, over random strata in the tests).

    Examples
    --------
    >>> stratum_bounds([3, 3, 4], [0.5, 0.5]).tolist()
    [[0, 1, 3], [0, 2, 3], [0, 2, 4]]
    >>> stratum_bounds([10], [0.7, 0.2, 0.1]).tolist()  # one stratum: the unstratified cut
    [[0, 7, 9, 10]]
    >>> stratum_bounds([], [0.5, 0.5]).shape
    (0, 3)
    """
    counts = np.asarray(sizes, dtype=np.int64).reshape(-1)
    rows = int(counts.sum())
    totals = piece_totals(rows, fractions)
    bounds = np.zeros((counts.size, len(totals) + 1), dtype=np.int64)
    # T * P fits in int64 while rows**2 does; beyond, Python ints (object arrays) are exact
    exact = object if rows > 0 and rows.bit_length() * 2 >= 63 else np.int64
    remaining = counts.astype(exact)
    left = rows
    for i, total in enumerate(totals[:-1]):
        if left > 0:
            ends = np.cumsum(remaining)
            taken = (total * ends) // left - (total * (ends - remaining)) // left
        else:
            taken = np.zeros_like(remaining)
        bounds[:, i + 1] = bounds[:, i] + np.asarray(taken, dtype=np.int64)
        remaining = remaining - taken
        left -= total
    bounds[:, -1] = counts
    return bounds
