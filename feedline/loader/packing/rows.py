"""The arrays of packed rows: ``input_ids``, ``labels``, ``position_ids`` and boundaries.

Examples
--------
>>> import numpy as np
>>> from feedline.loader.packing.spec import Packing
>>> docs = [np.array([1, 2, 3]), np.array([4, 5])]
>>> out = row_arrays(docs, [[(0, 0, 3), (1, 0, 2)]], Packing(seq_len=6, max_docs=3))
>>> out["input_ids"].tolist(), out["labels"].tolist()
([[1, 2, 3, 4, 5, 0]], [[2, 3, -100, 5, -100, -100]])
>>> out["position_ids"].tolist(), out["cu_seqlens"].tolist(), out["num_docs"].tolist()
([[0, 1, 2, 0, 1, 0]], [[0, 3, 5, 6, 6]], [2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.loader.packing.bins import Segment
from feedline.loader.packing.spec import Packing

__all__ = ["row_arrays"]


def row_arrays(
    docs: Sequence[Any], rows: Sequence[Sequence[Segment]], packing: Packing
) -> dict[str, np.ndarray]:
    """The batch of ``rows`` (segments of ``docs``, see :mod:`~feedline.loader.packing.bins`).

    ``input_ids`` keep the documents' integer dtype (int32 / int64); ``labels`` and
    ``position_ids`` are int64, ``cu_seqlens`` and ``num_docs`` int32.
    """
    size, n = packing.seq_len, len(rows)
    dtype = np.result_type(*(np.asarray(d).dtype for d in docs)) if len(docs) else np.int64
    ids = np.full((n, size), packing.pad_id, dtype=dtype)
    labels = np.full((n, size), packing.ignore_index, dtype=np.int64)
    positions = np.zeros((n, size), dtype=np.int64)
    segment = np.full((n, size), -1, dtype=np.int32)  # document number in its row
    cu = np.full((n, packing.max_docs + 2), size, dtype=np.int32)
    count = np.zeros(n, dtype=np.int32)
    for r, row in enumerate(rows):
        at = 0
        cu[r, 0] = 0
        for k, (doc, start, stop) in enumerate(row):
            length = stop - start
            piece = np.asarray(docs[doc])[start:stop]
            ids[r, at : at + length] = piece
            labels[r, at : at + length - 1] = piece[1:]
            positions[r, at : at + length] = np.arange(length)
            segment[r, at : at + length] = k
            at += length
            cu[r, k + 1] = at
        count[r] = len(row)
        positions[r, at:] = np.arange(size - at)  # the padding: a last segment
    out: dict[str, np.ndarray] = {"input_ids": ids, "labels": labels, "position_ids": positions}
    if packing.boundaries == "cu_seqlens":
        out["cu_seqlens"], out["num_docs"] = cu, count
    else:
        out["attention_mask"] = segment[:, :, None] == segment[:, None, :]
    return out
