"""Checksums of a mapped cache file's blocks, verified before a process first serves a block.

A node cache file (:mod:`feedline.loader.data.node_cache`) is a shared file any process of
the node may damage or replace: a bit flip on disk, a stray write, a truncation while it is
mapped. Its rows are cut into blocks of about :data:`BLOCK_BYTES` (``block_rows`` rows of
every array); the filler stores one CRC-32 per block and array in a table of the file.
:class:`BlockChecks` then guards one process's mapping:

- before a gather serves rows, the CRCs of the blocks holding them are checked, once per
  block and process (lazily: the first batches pay for the blocks they touch, later ones
  nothing but a flag test), so a damaged block is found before any of its values is served;
- before every gather the file's size is checked on the descriptor kept open with the map,
  so a file truncated in place is reported instead of killing the process with ``SIGBUS``
  when a gather touches a page past its new end.

:meth:`BlockChecks.check` returns what is wrong (``None`` when the rows may be served); the
cache decides what to do (rebuild the file, or raise). CRC-32 is ISA-L's (``isal``, a core
dependency; ~18 GB/s here), else ``zlib``'s: the same function, so the files agree.

Examples
--------
>>> import mmap, os, tempfile
>>> import numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "f")
>>> _ = open(path, "wb").write(np.arange(8, dtype="<i8").tobytes())
>>> handle = open(path, "rb")
>>> memory = mmap.mmap(handle.fileno(), 64, prot=mmap.PROT_READ)
>>> regions = [Region("x", 0, 8)]
>>> table = checksum_table(memory, regions, rows=8, block_rows=4)
>>> checks = BlockChecks(memory, handle, 64, regions, 8, 4, table, "the file f")
>>> checks.check(np.array([1, 2])) is None, checks.verified_blocks
(True, 1)
>>> os.truncate(path, 32)
>>> checks.check(np.array([7]))
'the file f shrank to 32 bytes of 64 while mapped (truncated in place)'
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

try:  # ISA-L's CRC-32: ~18 GB/s here against zlib's ~6 GB/s; the same checksum
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the same function, slower
    from zlib import crc32

__all__ = ["BLOCK_BYTES", "CHECKSUM", "BlockChecks", "Region", "block_rows", "checksum_table"]

#: bytes of every array's rows a block holds, about (one row at least)
BLOCK_BYTES = 1 << 20
#: the name of the checksum the table holds
CHECKSUM = "crc32"


@dataclass(frozen=True)
class Region:
    """One array of the file: its key, its first byte in the file and its bytes per row."""

    key: str
    offset: int
    row_bytes: int


def block_rows(row_bytes: int) -> int:
    """Rows per block for arrays of ``row_bytes`` bytes per row (all arrays together).

    Examples
    --------
    >>> block_rows(1024), block_rows(10 << 20)
    (1024, 1)
    """
    return max(1, BLOCK_BYTES // max(1, row_bytes))


def block_count(rows: int, per_block: int) -> int:
    """Blocks of ``per_block`` rows that hold ``rows`` rows.

    Examples
    --------
    >>> block_count(10, 4), block_count(0, 4)
    (3, 0)
    """
    return -(-rows // per_block)


def _crc(view: memoryview, region: Region, lo: int, hi: int) -> int:
    start = region.offset + lo * region.row_bytes
    return int(crc32(view[start : start + (hi - lo) * region.row_bytes]))


def checksum_table(
    memory: Any, regions: Sequence[Region], rows: int, block_rows: int
) -> np.ndarray:
    """The CRC-32 of every block of every array: ``uint32[blocks, arrays]``, little-endian."""
    view = memoryview(memory)
    table = np.empty((block_count(rows, block_rows), len(regions)), "<u4")
    try:
        for b in range(len(table)):
            lo, hi = b * block_rows, min(rows, (b + 1) * block_rows)
            for j, region in enumerate(regions):
                table[b, j] = _crc(view, region, lo, hi)
    finally:
        view.release()
    return table


class BlockChecks:
    """One process's guard over a mapped file: size before every gather, CRCs before first use.

    Parameters
    ----------
    memory
        The file's mapping (anything with the buffer protocol).
    handle
        The file, kept open while mapped: its size is read with ``fstat`` before each gather.
    file_bytes
        The size the file must keep.
    regions, rows, block_rows, table
        The arrays, their rows, rows per block and the stored ``uint32[blocks, arrays]`` CRCs.
    where
        How messages name the file.
    verify
        ``False`` skips the CRCs (the size is still checked): only to measure their cost.
    """

    def __init__(
        self, memory: Any, handle: BinaryIO, file_bytes: int, regions: Sequence[Region],
        rows: int, block_rows: int, table: np.ndarray, where: str, verify: bool = True,
    ) -> None:  # fmt: skip
        self._memory, self._handle, self._fd = memory, handle, handle.fileno()
        #: the file's size now: an ``mmap``'s ``size()`` is one ``fstat`` of the file, cheaper
        #: than ``os.fstat`` (no stat result built), and this runs before every gather
        self._size = getattr(memory, "size", None) or self._fstat_size
        self._file_bytes, self._regions = file_bytes, list(regions)
        self._rows, self._per_block, self._table, self._where = rows, block_rows, table, where
        self._verified = np.zeros(len(table), bool)
        self._left = len(table) if verify else 0
        self._lock = threading.Lock()

    @property
    def verified_blocks(self) -> int:
        """Blocks checked so far in this process."""
        return int(self._verified.sum())

    @property
    def blocks(self) -> int:
        return len(self._table)

    def _fstat_size(self) -> int:
        return os.fstat(self._fd).st_size

    def size_problem(self) -> str | None:
        """What is wrong with the file's size now (``None``: it is whole)."""
        size = self._size()
        if size >= self._file_bytes:
            return None
        return (
            f"{self._where} shrank to {size} bytes of {self._file_bytes} while mapped "
            "(truncated in place)"
        )

    def check(self, indices: np.ndarray) -> str | None:
        """Make rows ``indices`` safe to serve: ``None``, or what is wrong with the file.

        Checks the file's size, then the CRCs of the blocks holding these rows that this
        process has not checked yet.
        """
        if self._size() < self._file_bytes:
            return self.size_problem()
        if not self._left:
            return None
        idx = np.asarray(indices, dtype=np.int64)
        blocks = np.unique(idx // self._per_block)
        if len(blocks) and (blocks[0] < 0 or blocks[-1] >= len(self._table)):
            blocks = np.unique(np.where(idx < 0, idx + self._rows, idx) // self._per_block)
            blocks = blocks[(blocks >= 0) & (blocks < len(self._table))]  # take raises
        todo = blocks[~self._verified[blocks]]
        if not len(todo):
            return None
        with self._lock:
            view = memoryview(self._memory)
            try:
                for b in todo.tolist():
                    if self._verified[b]:
                        continue
                    problem = self._verify(view, b)
                    if problem is not None:
                        return problem
                    self._verified[b] = True
                    self._left -= 1
            finally:
                view.release()
        return self.size_problem()  # a truncation while the blocks were checked

    def _verify(self, view: memoryview, b: int) -> str | None:
        lo, hi = b * self._per_block, min(self._rows, (b + 1) * self._per_block)
        problem = self.size_problem()  # before touching the block's pages
        if problem is not None:
            return problem
        for j, region in enumerate(self._regions):
            found, stored = _crc(view, region, lo, hi), int(self._table[b, j])
            if found != stored:
                return (
                    f"block {b} (rows {lo}..{hi - 1}) of array {region.key!r} in {self._where} "
                    f"fails its CRC-32 (stored {stored:08x}, found {found:08x})"
                )
        return None
