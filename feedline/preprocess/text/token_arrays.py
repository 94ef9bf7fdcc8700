"""Token id arrays, vectorized: ragged id lists packed into flat arrays (:func:`pack`,
:func:`pack_chunks`), laid out as padded matrices with special tokens (:func:`frame`) and
stored as ``arrow.fixed_shape_tensor`` columns (:func:`tensor_array`). Shared by
:class:`~feedline.preprocess.text.clip_bpe.ClipTokenizer` and
:class:`~feedline.preprocess.text.tokenize.Tokenize`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError

__all__ = ["frame", "pack", "pack_chunks", "tensor_array"]


def pack(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged id lists as one ``int32`` array of all ids and an ``int64`` array of lengths.

    Examples
    --------
    >>> [a.tolist() for a in pack([[5, 6], [], [7]])]
    [[5, 6, 7], [2, 0, 1]]
    """
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


def tensor_array(matrix: np.ndarray) -> pa.Array:
    """An ``arrow.fixed_shape_tensor`` array of the rows of a 2-d array (empty ones too)."""
    storage = pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])
    kind = pa.fixed_shape_tensor(pa.from_numpy_dtype(matrix.dtype), [matrix.shape[1]])
    return pa.ExtensionArray.from_storage(kind, storage)


def pack_chunks(
    lists: Sequence[Sequence[int]], counts: Iterable[int], rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Like :func:`pack` for rows made of ``counts[i]`` consecutive id lists each."""
    sizes = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    ends = np.concatenate([[0], np.cumsum(sizes)])
    flat = np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=int(ends[-1]))
    per_row = np.fromiter(counts, dtype=np.int64, count=rows)
    return flat, np.diff(ends[np.concatenate([[0], np.cumsum(per_row)])])


def frame(
    flat: np.ndarray,
    lengths: np.ndarray,
    length: int,
    pad_id: int,
    *,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
    truncate: bool = True,
    left: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay out packed ids (see :func:`pack`) as a padded matrix, vectorized.

    Each row is ``prefix + ids + suffix``; with ``truncate`` the ids are cut so the row fits
    in ``length`` (the prefix and suffix are kept, as CLIP keeps its end token). Without
    ``truncate`` the matrix widens to the longest row.

    Returns
    -------
    ids, mask, lengths:
        ``int32 (n, width)`` ids, boolean ``(n, width)`` mask of real tokens, row lengths.

    Examples
    --------
    >>> ids, mask, n = frame(*pack([[5, 6, 7], [8]]), 4, 0, prefix=[1], suffix=[2])
    >>> ids.tolist(), n.tolist()
    ([[1, 5, 6, 2], [1, 8, 2, 0]], [4, 3])
    >>> frame(*pack([[5, 6]]), 3, 0, left=True)[0].tolist()
    [[0, 5, 6]]
    """
    n = len(lengths)
    extra = len(prefix) + len(suffix)
    if truncate and extra > length:
        raise ConfigurationError(
            f"max_length={length} leaves no room for the {extra} special tokens. Fix: use a "
            "larger max_length."
        )
    keep = np.minimum(lengths, length - extra) if truncate else lengths
    if truncate and bool((keep < lengths).any()):
        starts = np.cumsum(lengths) - lengths
        position = np.arange(flat.size) - np.repeat(starts, lengths)
        flat = flat[position < np.repeat(keep, lengths)]
    total = keep + extra
    width = length if truncate else int(max(length, total.max(initial=0)))
    offset = width - total if left else np.zeros(n, dtype=np.int64)
    column = np.arange(width)[None, :] - offset[:, None]
    mask = (column >= 0) & (column < total[:, None])
    ids = np.full((n, width), pad_id, dtype=np.int32)
    start = len(prefix)
    ids[(column >= start) & (column < (start + keep)[:, None])] = flat
    rows = np.arange(n)
    for j, token in enumerate(prefix):
        ids[rows, offset + j] = token
    for j, token in enumerate(suffix):
        ids[rows, offset + start + keep + j] = token
    return ids, mask, total
