"""From a block of documents to its rows, and from rows to a batch's arrays.

The two steps :class:`~feedline.loader.packing.packed_loader.PackedLoader` and the
:class:`~feedline.loader.nodes.Pack` node share: :func:`block_rows` plans one block (a dict of
columns holding ``packing.column``, one token list per document) into rows that keep their
block's documents, and :func:`rows_batch` builds the arrays of some such rows (of one block or
several).

Examples
--------
>>> import numpy as np
>>> from feedline.loader.packing.spec import Packing
>>> packing = Packing(seq_len=4)
>>> rows, plan, _ = block_rows({"input_ids": [np.array([1, 2, 3]), np.array([4, 5])]}, packing)
>>> [segments for _, segments in rows], plan.split
([[(0, 0, 3)], [(1, 0, 2)]], 0)
>>> rows_batch(rows, packing)["input_ids"].tolist()
[[1, 2, 3, 0], [4, 5, 0, 0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.packing.bins import RowPlan, Segment, plan_rows
from feedline.loader.packing.rows import row_arrays
from feedline.loader.packing.spec import Packing

__all__ = ["Row", "block_rows", "rows_batch"]

#: a row on its way: its block's documents and its segments of them
Row = tuple[list[Any], list[Segment]]


def block_rows(
    block: Mapping[str, Any], packing: Packing, padded: Any = None
) -> tuple[list[Row], RowPlan, int]:
    """The rows of one block of documents (each row with the block's documents), its plan and
    the number of documents it packs (neither empty nor padding).

    ``padded`` (else the block's ``"_padded"`` column, when it has one) marks the documents
    that only repeat one to pad the epoch (:func:`~feedline.loader.order.sample_order.
    split_for_rank` gives a rank past the epoch's last documents one such repeat): they are
    left out, so no token is delivered twice.

    Examples
    --------
    >>> rows, _, count = block_rows({"input_ids": [[1, 2], [1, 2]], "_padded": [False, True]},
    ...                             Packing(seq_len=4))
    >>> [segments for _, segments in rows], count
    ([[(0, 0, 2)]], 1)
    >>> block_rows({"input_ids": [7]}, Packing(seq_len=4))
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Packing: column 'input_ids' must hold a list of ...
    """
    docs = list(block.get(packing.column, ()))
    if docs and not isinstance(docs[0], np.ndarray | list):
        raise ConfigurationError(
            f"Packing: column {packing.column!r} must hold a list of token ids per "
            f"document, got {type(docs[0]).__name__}. Fix: store tokens as list<int32> "
            "(fl.Tokenize(..., max_length=None)) or return them from the transform."
        )
    docs = [np.asarray(d) for d in docs]
    if padded is None:
        padded = block.get("_padded")
    if padded is not None:  # a repeat takes no room: an empty document in its place
        docs = [d[:0] if pad else d for d, pad in zip(docs, padded, strict=True)]
    plan = plan_rows([len(d) for d in docs], packing)
    return [(docs, row) for row in plan.rows], plan, sum(1 for d in docs if len(d))


def rows_batch(rows: Sequence[Row], packing: Packing) -> dict[str, np.ndarray]:
    """The arrays of ``rows`` (:func:`~feedline.loader.packing.rows.row_arrays`), numpy."""
    docs: list[Any] = []
    segments: list[list[Segment]] = []
    for row_docs, row in rows:
        base = len(docs)
        used = sorted({d for d, _, _ in row})
        where = {d: base + k for k, d in enumerate(used)}
        docs += [row_docs[d] for d in used]
        segments.append([(where[d], s, e) for d, s, e in row])
    return row_arrays(docs, segments, packing)
