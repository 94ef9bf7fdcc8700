"""Which piece of which document goes into which row: a pure function of the lengths.

:func:`plan_rows` takes the lengths of one buffer of documents, in the loader's order, and
returns the rows, each a list of segments ``(document, start, stop)`` (positions in the
buffer, token offsets in the document). Documents longer than ``seq_len`` are split into
pieces of ``seq_len`` (the last shorter), or dropped; empty documents take no room.

- ``greedy`` (next-fit): pieces in order into the open row; when the next does not fit (or
  the row holds ``max_docs``), the row is closed and a new one opened. Rows keep the order.
- ``first_fit`` / ``best_fit`` (decreasing): the buffer's pieces, longest first (ties in
  order), each into the first open row with room / the open row with the least room that
  fits, else a new row. Rows come in the order they were opened.

Examples
--------
>>> from feedline.loader.packing.spec import Packing
>>> plan = plan_rows([3, 5, 2, 9], Packing(seq_len=8))
>>> plan.rows
[[(0, 0, 3), (1, 0, 5)], [(2, 0, 2)], [(3, 0, 8)], [(3, 8, 9)]]
>>> plan.split, plan.dropped
(1, 0)
>>> plan_rows([3, 5, 2, 6], Packing(seq_len=8, algorithm="best_fit")).rows
[[(3, 0, 6), (2, 0, 2)], [(1, 0, 5), (0, 0, 3)]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from feedline.loader.packing.spec import Packing

__all__ = ["RowPlan", "Segment", "plan_rows"]

#: one piece of a document in a row: (document's position in the buffer, start, stop)
Segment = tuple[int, int, int]


@dataclass(frozen=True)
class RowPlan:
    """The rows of one buffer, and what could not go in as it was."""

    rows: list[list[Segment]]
    #: documents longer than ``seq_len`` that were split
    split: int
    #: documents longer than ``seq_len`` that were dropped (``overlong="drop"``)
    dropped: int
    #: tokens of the dropped documents
    dropped_tokens: int


def _pieces(
    lengths: Sequence[int] | np.ndarray, packing: Packing
) -> tuple[list[Segment], int, int, int]:
    """The pieces to place, in order, and the split / dropped counts."""
    size = packing.seq_len
    pieces: list[Segment] = []
    split = dropped = dropped_tokens = 0
    for doc, length in enumerate(lengths):
        length = int(length)
        if length <= size:
            if length:
                pieces.append((doc, 0, length))
        elif packing.overlong == "drop":
            dropped, dropped_tokens = dropped + 1, dropped_tokens + length
        else:
            split += 1
            pieces.extend((doc, s, min(s + size, length)) for s in range(0, length, size))
    return pieces, split, dropped, dropped_tokens


def plan_rows(lengths: Sequence[int] | np.ndarray, packing: Packing) -> RowPlan:
    """The rows of a buffer of documents of ``lengths`` tokens (see the module docstring).

    Examples
    --------
    >>> plan_rows([2, 2, 2], Packing(seq_len=4, max_docs=1)).rows
    [[(0, 0, 2)], [(1, 0, 2)], [(2, 0, 2)]]
    """
    pieces, split, dropped, dropped_tokens = _pieces(lengths, packing)
    size, most = packing.seq_len, packing.max_docs
    rows: list[list[Segment]] = []
    if packing.algorithm == "greedy":
        used = size + 1  # no open row yet
        for piece in pieces:
            length = piece[2] - piece[1]
            if used + length > size or len(rows[-1]) >= most:
                rows.append([])
                used = 0
            rows[-1].append(piece)
            used += length
        return RowPlan(rows, split, dropped, dropped_tokens)
    lengths_of = np.array([p[2] - p[1] for p in pieces], dtype=np.int64)
    order = np.argsort(-lengths_of, kind="stable")  # longest first, ties in order
    room = np.empty(len(pieces), dtype=np.int64)  # per open row: tokens still free
    best = packing.algorithm == "best_fit"
    for i in order.tolist():
        length = int(lengths_of[i])
        free = room[: len(rows)]
        fits = np.flatnonzero(free >= length)
        if len(fits):
            r = int(fits[np.argmin(free[fits])]) if best else int(fits[0])
        else:
            r = len(rows)
            rows.append([])
            room[r] = size
        rows[r].append(pieces[i])
        room[r] -= length
        if len(rows[r]) >= most:
            room[r] = -1  # full: no more documents
    return RowPlan(rows, split, dropped, dropped_tokens)
