"""Pass 1 of staging an epoch: read this node's share of the row groups and send each row to
the buckets of its destinations.

Row groups are read in order (:data:`READ_AHEAD` decoded ahead, each by its own thread, while
the one before is routed); the rows of one row group bound for one bucket go out as one record
(:meth:`~feedline.loader.data.staging.exchange.Outbox.write`): one ``argsort`` and one
fancy-index copy per row group and bucket, no Python per row.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from feedline.errors import FeedlineError
from feedline.io.storage.local_files import open_regular
from feedline.loader.data.memory_cache import FileLayout, _checked, fill_arrays, read_rows
from feedline.loader.data.packed_columns import Packing, column_views
from feedline.loader.data.staging.exchange import Outbox, pack_rows
from feedline.loader.data.staging.report import StageReport
from feedline.loader.order.stage_routes import Routes, StagePlan, node_of, node_row_groups

__all__ = ["READ_AHEAD", "READ_SHARE", "Share", "read_ahead", "send_share"]

logger = logging.getLogger(__name__)

#: row groups decoded ahead (each by its own thread) while the stager routes one, at most
READ_AHEAD = 2
#: share of ``memory_budget`` pass 1's row groups may hold (the rest: buckets, write buffers)
READ_SHARE = 0.5


def read_ahead(row_group_bytes: int, budget: int) -> int:
    """Row groups decoded ahead in pass 1: :data:`READ_AHEAD`, fewer when that many would
    not fit :data:`READ_SHARE` of ``budget`` (each one ahead holds its arrays and its
    decoded Arrow buffers, the one routed its arrays: ``2 * ahead + 1`` row groups).

    Examples
    --------
    >>> read_ahead(6 << 20, 57 << 20), read_ahead(32 << 20, 57 << 20), read_ahead(0, 1)
    (1, 0, 2)
    """
    if row_group_bytes <= 0:
        return READ_AHEAD
    fits = int(budget * READ_SHARE) // row_group_bytes  # row groups held at once
    return max(0, min(READ_AHEAD, (fits - 1) // 2))


@dataclass(frozen=True)
class Share:
    """Where this node stands: its number among ``nodes``, ``ranks_per_node`` consecutive
    ranks each, ``world_size`` ranks in all; ``drop_pages``: its share is more than the page
    cache may hold, so each local shard's pages are dropped from it once its row groups are
    read (they would be evicted before the next epoch anyway; the bucket files written next
    keep the room)."""

    node: int
    nodes: int
    ranks_per_node: int
    world_size: int
    drop_pages: bool = False


def send_share(
    layout: FileLayout,
    packing: Packing,
    plan: StagePlan,
    share: Share,
    outboxes: Mapping[int, Outbox],
    cuts: Mapping[int, int],
    report: StageReport,
    check: Callable[[], None],
    budget: int,
    spill: int | None = None,
) -> None:
    """Read ``share.node``'s row groups and send each row of them to its buckets: to the
    ``outboxes`` (by destination node; a node without one was sent its rows before), cut as
    ``cuts`` says (each receiving node's rows per bucket). ``check()`` runs before each row
    group (it raises to stop). ``budget``: the loader's ``memory_budget`` (bounds the row
    groups decoded ahead, :func:`read_ahead`). ``spill``: the pseudo-rank whose bucket 0 gets
    the rows no plan names (to node 0; see :mod:`~feedline.loader.data.staging.recycle`),
    or ``None`` to leave them."""
    sizes = layout.row_group_sizes
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    groups = node_row_groups(sizes, share.nodes)[share.node]
    lo, hi = int(starts[groups.start]), int(starts[groups.stop])
    found = plan.routes(lo, hi)
    file_of, local, _ = layout.locate()
    names = [s.name for s in packing.specs]
    piece = read_rows(packing, layout.source.schema())
    row_bytes = max(1, packing.row_bytes)
    per_rank = np.array([cuts.get(node_of(r, share.ranks_per_node), 1)
                         for r in range(share.world_size)], dtype=np.int64)  # fmt: skip

    # the row groups' arrays, reused (READ_AHEAD decoding, one routed): fresh ones for every
    # row group would fault in the node's share once more per epoch
    largest = max((int(sizes[g]) for g in groups), default=0)
    ahead = read_ahead(largest * row_bytes, budget)
    if ahead < READ_AHEAD:
        logger.info("Staging: %d row group(s) decoded ahead, not %d (row groups of up to %d "
                    "bytes; memory_budget %d)", ahead, READ_AHEAD, largest * row_bytes,
                    budget)  # fmt: skip
    free: queue.SimpleQueue[dict[str, np.ndarray]] = queue.SimpleQueue()
    for _ in range(ahead + 1):
        free.put(packing.allocate(largest))

    def read(g: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        whole = free.get()
        storage = {k: v[: int(sizes[g])] for k, v in whole.items()}
        views = column_views(packing, storage)
        f, i = int(file_of[g]), int(local[g])
        where = f"shard {layout.files[f].url!r}, row group {i}"
        parts = _checked(layout.iter_read(f, [i], names, piece), int(sizes[g]), where)
        first = int(starts[g])
        fill_arrays(views, parts, packing.specs, 0, where, lambda r: first + r)
        pa.default_memory_pool().release_unused()  # the decode's buffers: not kept per thread
        return whole, storage

    todo = [g for g in groups if sizes[g]]
    last = {int(file_of[g]): g for g in todo}  # each file's last row group in the share
    readers = max(1, ahead)  # with none ahead, one reader waits for the arrays routed
    with ThreadPoolExecutor(readers, thread_name_prefix="feedline-stage-read") as pool:
        pending = deque(pool.submit(read, g) for g in todo[:readers])
        for k, g in enumerate(todo):
            check()
            whole, storage = pending.popleft().result()
            nxt = k + readers
            if nxt < len(todo):  # the next row groups decode meanwhile (with none ahead, the
                # next one waits in free.get() until this one's arrays are put back)
                pending.append(pool.submit(read, todo[nxt]))
            report.rows_read += int(sizes[g])
            report.bytes_read += int(sizes[g]) * row_bytes
            a, b = np.searchsorted(found.source, [starts[g], starts[g + 1]])
            sent = _route(found, int(a), int(b), int(starts[g]), storage, outboxes, per_rank,
                          share.ranks_per_node)  # fmt: skip
            if spill is not None and 0 in outboxes:
                sent += _spill(found.source[a:b], int(starts[g]), storage, outboxes[0], spill)
            report.bytes_sent += sent * row_bytes
            free.put(whole)
            f = int(file_of[g])
            if share.drop_pages and last[f] == g:
                _drop_pages(layout, f)


def _drop_pages(layout: FileLayout, file: int) -> None:
    """Drop a local shard's pages from the page cache (``posix_fadvise``; best effort)."""
    loc = layout.files[file]
    if not loc.is_local or not hasattr(os, "posix_fadvise"):
        return
    with contextlib.suppress(OSError, FeedlineError), open_regular(loc.path) as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _spill(routed: np.ndarray, first: int, storage: Mapping[str, np.ndarray], outbox: Outbox,
           spill: int) -> int:  # fmt: skip
    """Send the rows of one row group (its arrays ``storage``, its first row ``first``) that
    no plan names (``routed``: the rows that have a destination) to bucket 0 of ``spill``,
    keyed by their row indices; the rows sent."""
    rows = len(next(iter(storage.values()))) if storage else 0
    left = np.ones(rows, dtype=bool)
    left[routed - first] = False
    picked = np.flatnonzero(left)
    if picked.size:
        outbox.write(spill, 0, pack_rows(picked + first, storage, picked))
    return int(picked.size)


def _route(found: Routes, a: int, b: int, first: int, storage: Mapping[str, np.ndarray],
           outboxes: Mapping[int, Outbox], per_rank: np.ndarray, ranks_per_node: int,
           ) -> int:  # fmt: skip
    """Send rows ``found[a:b]`` of one row group (its arrays ``storage``, its first row
    ``first``) to their buckets (``per_rank``: each rank's rows per bucket); the rows sent."""
    if a == b:
        return 0
    rank, pos = found.rank[a:b], found.position[a:b]
    rows = found.source[a:b] - first
    size = per_rank[rank]
    buckets = (rank << 32) | (pos // size)
    order = np.argsort(buckets, kind="stable")
    ends = np.flatnonzero(np.diff(buckets[order])) + 1
    # every row in the order of its bucket, in the bucket files' layout: one gather per array,
    # then one write per bucket (not one per array and bucket: ~4 rows per bucket a row group)
    block = pack_rows(pos[order], storage, rows[order])
    sent = 0
    for lo, hi in zip(np.concatenate([[0], ends]), np.concatenate([ends, [len(order)]]),
                      strict=True):  # fmt: skip
        head = int(order[lo])
        r = int(rank[head])
        box = outboxes.get(node_of(r, ranks_per_node))
        if box is None:  # delivered by an earlier run of this node
            continue
        box.write(r, int(pos[head]) // int(size[head]), block[lo:hi])
        sent += int(hi - lo)
    return sent
