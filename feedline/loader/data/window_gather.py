"""Copying windows out of time series held row-major (for :mod:`feedline.loader.data.windows`).

``values`` holds one time step per row, C-contiguous, so a window of ``length`` rows is one
contiguous block of memory. :func:`strided_windows` views every window as a
``(windows, length, ...)`` array without copying; :func:`window_blocks` views every window
as one opaque item, so indexing it with start rows copies each window with one ``memcpy``;
:func:`gather_windows` copies chosen windows, into fresh memory or into a given buffer.

:func:`torch_window_blocks` and :func:`torch_gather_windows` are the same one-copy-per-window
gather done by ``torch.index_select`` into a given buffer: one call for the whole batch, the
GIL released once, the copy split across torch's intra-op threads. On the project's 2-core
machine (2,000 series x 5,000 steps x 8 float32, windows of 96 + 8 rows, 512 a call):
NumPy's fancy index into fresh arrays 2.2-2.4M windows/s; ``index_select`` into reused
buffers 2.1-2.3M on one thread, 3.3-4.2M on two. NumPy has no such call: ``take`` on the
overlapping window view copies the whole view first, and a fancy index has no ``out=``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError

__all__ = [
    "gather_windows",
    "strided_windows",
    "torch_gather_windows",
    "torch_window_blocks",
    "window_blocks",
]


def strided_windows(values: np.ndarray, length: int) -> np.ndarray:
    """Every window of ``length`` rows of ``values`` as a read-only strided view (no copy).

    ``values`` holds one time step per row, C-contiguous, so every window is one contiguous
    block of memory; the view's first axis is the start row. Index it with start rows to
    copy just those windows; never ``np.take`` it (that copies every window first).

    Examples
    --------
    >>> strided_windows(np.arange(5.0), 3)[[2, 0]].tolist()
    [[2.0, 3.0, 4.0], [0.0, 1.0, 2.0]]
    """
    values = np.ascontiguousarray(values)
    count = max(len(values) - length + 1, 0)
    step = values.strides[0]
    return np.lib.stride_tricks.as_strided(
        values,
        shape=(count, length, *values.shape[1:]),
        strides=(step, step, *values.strides[1:]),
        writeable=False,
    )


def _windowed(values: np.ndarray, length: int, caller: str) -> tuple[np.ndarray, int, int]:
    """``values`` made C-contiguous, the bytes of one row, the number of windows (checked)."""
    values = np.ascontiguousarray(values)
    step = values.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
    if values.ndim < 1 or length < 1 or step < 1:
        raise ConfigurationError(
            f"{caller}: windows of {length} rows of {step} bytes over an array of shape "
            f"{values.shape}. Fix: pass an array with rows of at least one byte and length >= 1."
        )
    return values, step, max(len(values) - length + 1, 0)


def window_blocks(values: np.ndarray, length: int) -> np.ndarray:
    """Every window of ``length`` rows of ``values`` as one opaque item: a read-only 1-D view.

    Each window is one contiguous block of ``length`` rows (``values`` C-contiguous); the
    view's items are those blocks (a NumPy void dtype of ``length`` rows' bytes), so indexing
    it with start rows copies each window with one ``memcpy``, where :func:`strided_windows`
    copies row by row (about 15% less CPU per batch for 96 rows of 8 float32, measured on
    2,000 x 5,000 x 8). :func:`gather_windows` turns the items back into typed windows.

    Examples
    --------
    >>> blocks = window_blocks(np.arange(10.0).reshape(5, 2), 3)
    >>> blocks.shape, blocks.dtype.itemsize
    ((3,), 48)
    >>> blocks[[2]].view(np.float64).reshape(1, 3, 2).tolist()
    [[[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]]
    """
    values, step, count = _windowed(values, length, "window_blocks")
    dtype = np.dtype((np.void, length * step))
    if not count:
        return np.empty(0, dtype=dtype)
    blocks = np.ndarray(shape=(count,), dtype=dtype, buffer=values, strides=(step,))
    blocks.flags.writeable = False
    return blocks


def gather_windows(
    values: np.ndarray, starts: np.ndarray, length: int, out: np.ndarray | None = None
) -> np.ndarray:
    """``values[s : s + length]`` for every ``s`` in ``starts``, as one array.

    Without ``out``: :func:`strided_windows` indexed by ``starts``, window by window into a
    fresh array (about 1.8x a row-by-row ``np.take`` of the same rows). With ``out`` (shape
    ``(len(starts), length, *values.shape[1:])``): a row-by-row ``np.take`` straight into
    it (no temporary array, one copy). ``values`` of a :class:`WindowSampler` are
    C-contiguous; others are made so first.

    Examples
    --------
    >>> gather_windows(np.arange(10.0), np.array([6, 0]), 3).tolist()
    [[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]
    >>> out = np.empty((1, 2))
    >>> gather_windows(np.arange(10.0), np.array([4]), 2, out) is out, out.tolist()
    (True, [[4.0, 5.0]])
    """
    starts = np.asarray(starts, dtype=np.int64)
    if out is None:
        return strided_windows(values, length)[starts]
    values = np.ascontiguousarray(values)
    rows = (starts[:, None] + np.arange(length, dtype=np.int64)).reshape(-1)
    flat = out.reshape(len(rows), *values.shape[1:])  # a view: out is C-contiguous
    if len(rows) and (rows.min() < 0 or rows.max() >= len(values)):
        raise ConfigurationError(
            f"gather_windows: windows of {length} rows starting at rows {int(starts.min())}.."
            f"{int(starts.max())} leave the {len(values)} rows. Fix: pass start rows from "
            "0 to len(values) - length."
        )
    values.take(rows, axis=0, out=flat, mode="clip")
    return out


def torch_window_blocks(values: np.ndarray, length: int) -> Any:
    """Every window of ``length`` rows of ``values`` as one row of bytes: a torch view.

    A ``(windows, length * row_bytes)`` ``torch.uint8`` tensor sharing ``values``' memory
    (rows overlap, so it must only be read), for :func:`torch_gather_windows`. Bytes, so
    every dtype is served alike. Needs torch.

    Examples
    --------
    >>> blocks = torch_window_blocks(np.arange(10, dtype=np.float32).reshape(5, 2), 3)
    >>> tuple(blocks.shape), str(blocks.dtype)
    ((3, 24), 'torch.uint8')
    """
    import torch

    values, step, count = _windowed(values, length, "torch_window_blocks")
    flat = values.reshape(-1).view(np.uint8)
    with warnings.catch_warnings():  # a read-only cache: the view is only ever read
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        as_bytes = torch.from_numpy(flat)
    return torch.as_strided(as_bytes, (count, length * step), (step, 1))


def torch_gather_windows(blocks: Any, starts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Copy windows ``starts`` of ``blocks`` (:func:`torch_window_blocks`) into ``out``.

    One ``torch.index_select`` call for every window (one copy each, straight into ``out``,
    the GIL released once, split across torch's intra-op threads). ``out`` is C-contiguous,
    ``len(starts)`` windows of the blocks' bytes; it is returned.

    Examples
    --------
    >>> values = np.arange(10, dtype=np.float32).reshape(5, 2)
    >>> out = np.empty((2, 3, 2), dtype=np.float32)
    >>> torch_gather_windows(torch_window_blocks(values, 3), np.array([2, 0]), out).tolist()
    [[[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]], [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]]
    """
    import torch

    starts = np.asarray(starts, dtype=np.int64)
    target = out.reshape(len(starts), -1).view(np.uint8)  # a view: out is C-contiguous
    if target.shape[1] != blocks.shape[1] or not out.flags.c_contiguous:
        raise ConfigurationError(
            f"torch_gather_windows: out {out.shape} {out.dtype} holds {target.shape[1]} bytes a "
            f"window, the windows have {blocks.shape[1]}. Fix: pass a C-contiguous out of "
            "len(starts) windows of the same shape and dtype as the data's."
        )
    try:  # torch checks the bounds
        torch.index_select(blocks, 0, torch.from_numpy(starts), out=torch.from_numpy(target))
    except IndexError as exc:
        raise ConfigurationError(
            f"torch_gather_windows: start rows {int(starts.min())}..{int(starts.max())} leave "
            f"the {len(blocks)} windows ({exc}). Fix: pass start rows from 0 to "
            "len(values) - length."
        ) from exc
    return out
