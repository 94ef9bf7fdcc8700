"""Large cache arrays whose pages the kernel fills in bulk, row range by row range.

A cache of a gigabyte is a quarter of a million 4 KiB pages. Left to page faults while the
cache fills, every first write traps into the kernel (and, in a virtual machine, often out of
it); and ``np.empty`` of a large array asks for transparent huge pages, which the kernel may
stop to compact memory for. Measured here (2-core VM), writing 1.2 GB into fresh memory took
0.55-2.4 s through ``np.empty``, 0.75-0.9 s through plain anonymous memory and 0.45 s when
the kernel populated the pages first. So arrays of at least :data:`LARGE` bytes are
anonymous memory maps (no huge-page request) and :func:`prefault` has the kernel populate
the pages of the rows a reader thread is about to fill (``MADV_POPULATE_WRITE``, Linux 5.14
and later; elsewhere, and for smaller arrays, it does nothing and pages fault in as usual).
The memory is returned when the array is garbage collected, like any NumPy array's.

Examples
--------
>>> a = empty((4, 3), np.float32)
>>> prefault(a, 0, 2)
>>> a[:] = 1
>>> a.sum()
np.float32(12.0)
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

import numpy as np

__all__ = ["LARGE", "empty", "prefault"]

#: arrays of at least this many bytes are anonymous memory maps
LARGE = 64 << 20
#: ``madvise`` advice: populate (write-fault) the pages of a range (Linux >= 5.14)
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def empty(shape: tuple[int, ...], dtype: Any, large: int = LARGE) -> np.ndarray:
    """An uninitialized array: anonymous memory when it is ``large`` bytes or more (by
    default :data:`LARGE`), else ``np.empty``.

    Examples
    --------
    >>> empty((2, 2), "int64").shape
    (2, 2)
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < large or dtype.hasobject or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(shape, dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(memory, dtype).reshape(shape)


def _mapping(array: np.ndarray) -> mmap.mmap | None:
    base: Any = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return base


def prefault(array: np.ndarray, start: int, stop: int) -> None:
    """Have the kernel populate the pages of rows ``start:stop`` of an :func:`empty` array.

    A no-op for arrays not made by :func:`empty` and where the kernel lacks the advice.
    """
    memory = _mapping(array)
    if memory is None or stop <= start or not hasattr(memory, "madvise"):
        return
    origin = np.frombuffer(memory, np.uint8).ctypes.data
    row = array.strides[0]
    first = array.ctypes.data - origin + start * row
    last = min(len(memory), array.ctypes.data - origin + stop * row)
    page = mmap.PAGESIZE
    first -= first % page
    with contextlib.suppress(OSError, ValueError):  # an older kernel: pages fault in later
        memory.madvise(_POPULATE_WRITE, first, last - first)
