"""Arrays through shared memory between the loader and its worker processes.

The side that writes a segment creates it (``multiprocessing.shared_memory``), the other
side attaches by name; arrays go in at 64-byte aligned offsets described by a small *layout*
(``[(key, dtype, shape, offset), ...]``) that travels in the (pickled) message instead of the
data. The loader process unlinks every segment, its own and those its workers created (they
report each one): a worker never unlinks, so each name is unregistered from
multiprocessing's resource tracker exactly once, and a worker killed mid-task leaves nothing
the tracker does not remove at exit.

Examples
--------
>>> arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.arange(2)}
>>> layout, nbytes = plan_layout(arrays)
>>> segments = Segments()
>>> shm = segments.acquire(nbytes)
>>> write(shm, arrays, layout)
>>> read(shm, layout)["x"].tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
>>> segments.close(unlink=True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from multiprocessing import shared_memory

import numpy as np

__all__ = ["Attached", "Segments", "plan_layout", "read", "unlink_name", "write"]

Layout = list[tuple[str, str, tuple[int, ...], int]]
_ALIGN = 64
#: smallest segment made, so tiny outputs do not each get one
_MIN_BYTES = 1 << 16


def plan_layout(arrays: Mapping[str, np.ndarray]) -> tuple[Layout, int]:
    """Where each array goes in a segment, and the bytes the segment needs."""
    layout: Layout = []
    offset = 0
    for key, array in arrays.items():
        layout.append((key, array.dtype.str, tuple(array.shape), offset))
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    return layout, offset


def write(shm: shared_memory.SharedMemory, arrays: Mapping[str, np.ndarray],
          layout: Layout) -> None:  # fmt: skip
    """Copy ``arrays`` into ``shm`` at the places ``layout`` says."""
    for key, dtype, shape, offset in layout:
        view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=shm.buf, offset=offset)
        np.copyto(view, arrays[key], casting="no")
        del view


def read(shm: shared_memory.SharedMemory | None, layout: Layout) -> dict[str, np.ndarray]:
    """Views of the arrays ``layout`` places in ``shm`` (valid while the segment is held)."""
    if shm is None:
        return {}
    return {key: np.ndarray(shape, dtype=np.dtype(dtype), buffer=shm.buf, offset=offset)
            for key, dtype, shape, offset in layout}  # fmt: skip


def _close(shm: shared_memory.SharedMemory) -> None:
    with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
        shm.close()


class Segments:
    """The segments one side writes into: a free one that fits is reused, else one is made.

    Segments too small for a request are *retired*: :meth:`take_retired` hands their names
    over (the loader process unlinks them).
    """

    def __init__(self) -> None:
        self._all: dict[str, shared_memory.SharedMemory] = {}
        self._free: set[str] = set()
        self._retired: list[str] = []

    def acquire(self, nbytes: int) -> shared_memory.SharedMemory:
        """A segment of at least ``nbytes`` bytes, now busy until :meth:`release`."""
        fits = [n for n in self._free if self._all[n].size >= nbytes]
        if fits:
            name = min(fits, key=lambda n: self._all[n].size)
            self._free.discard(name)
            return self._all[name]
        if self._free:  # a free segment too small for what is asked now: give it up
            small = min(self._free, key=lambda n: self._all[n].size)
            self._free.discard(small)
            _close(self._all.pop(small))
            self._retired.append(small)
        size = max(_MIN_BYTES, -(-int(nbytes * 1.25) // 4096) * 4096)
        shm = shared_memory.SharedMemory(create=True, size=size)
        self._all[shm.name] = shm
        return shm

    def release(self, names: Iterable[str]) -> None:
        """Make these segments free for reuse."""
        self._free.update(n for n in names if n in self._all)

    def take_retired(self) -> list[str]:
        """Names of segments given up since the last call (to be unlinked)."""
        out, self._retired = self._retired, []
        return out

    def names(self) -> list[str]:
        return [*self._all, *self._retired]

    def close(self, *, unlink: bool) -> None:
        """Unmap every segment (and unlink them when this side owns the names)."""
        for shm in self._all.values():
            if unlink:
                with contextlib.suppress(FileNotFoundError):
                    shm.unlink()
            _close(shm)
        if unlink:
            for name in self._retired:
                unlink_name(name)
        self._all.clear()
        self._free.clear()
        self._retired.clear()


class Attached:
    """Segments the other side wrote, attached by name on first use."""

    def __init__(self) -> None:
        self._all: dict[str, shared_memory.SharedMemory] = {}

    def get(self, name: str | None) -> shared_memory.SharedMemory | None:
        if name is None:
            return None
        if name not in self._all:
            self._all[name] = shared_memory.SharedMemory(name=name)
        return self._all[name]

    def forget(self, names: Iterable[str]) -> None:
        for name in names:
            shm = self._all.pop(name, None)
            if shm is not None:
                _close(shm)

    def names(self) -> list[str]:
        return list(self._all)

    def close(self) -> None:
        self.forget(list(self._all))


def unlink_name(name: str) -> None:
    """Unlink a segment by name (once; a missing one is fine)."""
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    _close(shm)
    with contextlib.suppress(FileNotFoundError):
        shm.unlink()
