"""Streaming reads for data over the memory budget: one pool of row groups at a time.

The two-level shuffle of :func:`feedline.loader.order.sample_order.block_shuffle_order` permutes
the row groups, cuts them into pools of ``window`` groups and permutes rows inside each pool. A
:class:`PoolReader` serves batches of global row indices by loading the pools they fall in
(whole pools, each row group read once per epoch) and evicting the pools the batch no
longer needs. Batches walk the global order forwards, so at most the two pools a batch
straddles are resident: memory is bounded by ``2 * window`` row groups.

A pool's row groups are decoded by several threads at once (pyarrow releases the GIL while
decoding), each row group into its own rows of the pool's arrays, in pieces of
:func:`~feedline.loader.data.memory_cache.read_rows` rows: which thread reads which group changes
nothing in the arrays, so batches and their order do not depend on timing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from feedline.loader.data.bulk_arrays import prefault
from feedline.loader.data.columns import ColumnSpec
from feedline.loader.data.memory_cache import (
    ColumnCache,
    FileLayout,
    _checked,
    fill_arrays,
    read_rows,
)
from feedline.loader.data.packed_columns import Packing, column_views, plan_packing

__all__ = ["POOL_MAPPED", "PoolReader", "StreamStats", "sequential_pools"]

#: threads decoding the row groups of one pool at once (at most one per row group)
MAX_POOL_THREADS = 4
#: pool arrays of at least this many bytes are memory maps of their own, given back to the
#: system when the pool is dropped: from ``malloc`` they stayed in the heap of the thread
#: that made them (glibc's mmap threshold grows past a freed pool's size), and a stream in a
#: 300 MB memory cgroup grew to its limit over some epochs and was OOM-killed
POOL_MAPPED = 1 << 20


@dataclass
class StreamStats:
    """Counters of a streaming epoch (read by tests and ``Loader.stats()``)."""

    pools_loaded: int = 0
    row_groups_read: int = 0
    max_resident_rows: int = 0
    pool_rows: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "pools_loaded": self.pools_loaded,
            "row_groups_read": self.row_groups_read,
            "max_resident_rows": self.max_resident_rows,
            "max_pool_rows": max(self.pool_rows, default=0),
        }


def sequential_pools(num_groups: int, window: int) -> list[np.ndarray]:
    """Pools of ``window`` consecutive row groups in stored order (``shuffle=False``).

    Examples
    --------
    >>> [p.tolist() for p in sequential_pools(5, 2)]
    [[0, 1], [2, 3], [4]]
    """
    groups = np.arange(num_groups, dtype=np.int64)
    return [groups[i : i + window] for i in range(0, num_groups, max(1, window))]


class PoolReader:
    """Serves rows by global index from the pools of one epoch, reading pools on demand.

    Parameters
    ----------
    layout:
        The Parquet files and row groups.
    specs:
        The columns to read, or a :class:`~feedline.loader.data.packed_columns.Packing` of them (the
        batch keys and blocks; plain specs are packed without stacks).
    pools:
        Row-group ids of each pool (``block_shuffle_pools`` or :func:`sequential_pools`).
    stats:
        Counters to update (a fresh :class:`StreamStats` when ``None``).
    threads:
        Threads decoding a pool's row groups (default: the CPUs, at most
        :data:`MAX_POOL_THREADS`); the arrays and batches are the same for any number.
    """

    def __init__(
        self,
        layout: FileLayout,
        specs: Sequence[ColumnSpec] | Packing,
        pools: Sequence[np.ndarray],
        stats: StreamStats | None = None,
        threads: int | None = None,
    ) -> None:
        self._layout = layout
        self._packing = specs if isinstance(specs, Packing) else plan_packing(specs)
        self._specs = self._packing.specs
        self._threads = max(1, threads or min(MAX_POOL_THREADS, os.cpu_count() or 1))
        self._piece_rows = read_rows(self._packing, layout.source.schema())
        self._scratch: dict[str, np.ndarray] = {}
        self._file_of, self._local, self._starts = layout.locate()
        self._sizes = np.asarray(layout.row_group_sizes, dtype=np.int64)
        groups = self._sizes.size
        self._pool_of = np.full(groups, -1, dtype=np.int64)
        self._offset = np.zeros(groups, dtype=np.int64)  # first row of the group in its pool
        self._read_plan: list[list[tuple[int, list[int]]]] = []
        self._pool_groups: list[list[int]] = []  # global row groups of each pool, file order
        self._pool_rows: list[int] = []
        for p, pool in enumerate(pools):
            plan: list[tuple[int, list[int]]] = []
            row, in_pool = 0, []
            for f in dict.fromkeys(int(x) for x in self._file_of[pool]):  # file order of the pool
                mine = sorted(int(g) for g in pool if self._file_of[g] == f)
                for g in mine:
                    self._pool_of[g], self._offset[g] = p, row
                    row += int(self._sizes[g])
                plan.append((f, [int(self._local[g]) for g in mine]))
                in_pool += mine
            self._read_plan.append(plan)
            self._pool_groups.append(in_pool)
            self._pool_rows.append(row)
        self._loaded: dict[int, ColumnCache] = {}
        # a dropped pool's arrays, reused by the next one: no fresh pages (or malloc heap
        # left behind) per pool; sized for the largest pool
        self._arrays: dict[int, dict[str, np.ndarray]] = {}
        self._spare: dict[str, np.ndarray] | None = None
        self._largest = max(self._pool_rows, default=0)
        self.stats = stats if stats is not None else StreamStats()

    def _load(self, p: int) -> ColumnCache:
        rows = self._pool_rows[p]
        spare, self._spare = self._spare, None
        if spare is None or len(next(iter(spare.values()), ())) < rows:
            spare = self._packing.allocate(max(rows, self._largest), large=POOL_MAPPED)
        storage = {k: v[:rows] for k, v in spare.items()}
        views = column_views(self._packing, storage)
        names = [s.name for s in self._specs]
        row_of = self._row_of(p)

        def read_group(g: int) -> None:
            f, i = int(self._file_of[g]), int(self._local[g])
            at, rows = int(self._offset[g]), int(self._sizes[g])
            where = f"shard {self._layout.files[f].url!r}, row group {i}"
            for values in storage.values():  # this group's pages, populated in bulk
                prefault(values, at, at + rows)
            pieces = _checked(self._layout.iter_read(f, [i], names, self._piece_rows), rows, where)
            fill_arrays(views, pieces, self._specs, at, where, row_of)
            pa.default_memory_pool().release_unused()  # the decoded pieces: back to the system

        groups = [g for g in self._pool_groups[p] if self._sizes[g]]
        workers = min(self._threads, len(groups))
        if workers <= 1:
            for g in groups:
                read_group(g)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="feedline-pool") as pool:
                futures = [pool.submit(read_group, g) for g in groups]
                try:
                    for future in futures:
                        future.result()
                except BaseException:
                    for future in futures:  # the first error is raised; the rest not started
                        future.cancel()
                    raise
        self.stats.row_groups_read += len(self._pool_groups[p])
        self.stats.pools_loaded += 1
        self.stats.pool_rows.append(self._pool_rows[p])
        self._arrays[p] = spare
        return ColumnCache(packing=self._packing, storage=storage)

    def _row_of(self, p: int) -> Callable[[int], int]:
        """Pool ``p``'s row -> the dataset's row (named by errors)."""
        groups = np.flatnonzero(self._pool_of == p)
        groups = groups[np.argsort(self._offset[groups], kind="stable")]

        def row_of(r: int) -> int:
            g = groups[np.searchsorted(self._offset[groups], r, side="right") - 1]
            return int(self._starts[g] + r - self._offset[g])

        return row_of

    def file_order(self, indices: np.ndarray) -> list[int]:
        """Files in the order serving ``indices`` (in turn) reads them; a file may recur.

        Pools are read whole, in the order the indices first fall in them.
        """
        idx = np.asarray(indices, dtype=np.int64)
        if not idx.size:
            return []
        pools = self._pool_of[np.searchsorted(self._starts, idx, side="right") - 1]
        first, at = np.unique(pools, return_index=True)
        ordered = first[np.argsort(at, kind="stable")]
        return [f for p in ordered if p >= 0 for f, _ in self._read_plan[int(p)]]

    def resident_rows(self) -> int:
        """Rows currently held in memory."""
        return sum(self._pool_rows[p] for p in self._loaded)

    def gather(
        self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Rows ``indices`` (global row numbers) of every column, loading pools as needed."""
        idx = np.asarray(indices, dtype=np.int64)
        group = np.searchsorted(self._starts, idx, side="right") - 1
        pool = self._pool_of[group]
        if idx.size and pool.min() < 0:
            raise IndexError("rows outside every pool were requested")
        needed = [int(p) for p in np.unique(pool)]
        for p in [p for p in self._loaded if p not in needed]:
            del self._loaded[p]  # batches walk forwards: an unneeded pool is done with
            self._spare = self._arrays.pop(p)  # its arrays fill the next pool (gathers copy)
        for p in needed:
            if p not in self._loaded:
                self._loaded[p] = self._load(p)
        self.stats.max_resident_rows = max(self.stats.max_resident_rows, self.resident_rows())
        local = self._offset[group] + idx - self._starts[group]
        if len(needed) == 1:
            return self._loaded[needed[0]].gather(local, out, self._scratch if out else None)
        # a batch straddling pools: each pool's rows gathered, then placed by mask
        result = {}
        for key, (shape, dtype) in self._packing.shapes().items():
            if out is not None and key in out and out[key].shape == (idx.size, *shape):
                result[key] = out[key]
            else:
                result[key] = np.empty((idx.size, *shape), dtype)
        for p in needed:
            mask = pool == p
            for key, part in self._loaded[p].gather(local[mask]).items():
                result[key][mask] = part
        return result
