"""Where each row goes when an epoch is staged: pure functions of the ranks' plans.

``cache="staged"`` (:mod:`feedline.loader.data.staging.stager`) puts each rank's samples
of an epoch in the order the rank reads them, bucket by bucket. A *node* is a group of
``ranks_per_node`` consecutive ranks (rank ``r`` is on node ``r // ranks_per_node``, as
torchrun numbers them); node ``n`` reads only its share of the row groups
(:func:`node_row_groups`: contiguous, balanced by rows) and sends each row to the
destinations the plans give it: every ``(rank, position)`` whose plan names that row
(:func:`routes`; a padding repeat is one more destination). Destinations are cut into
buckets of ``bucket_rows`` consecutive positions of one rank (:func:`bucket_of`), so a bucket
can be put in order in memory.

Examples
--------
>>> node_row_groups([4, 4, 4, 4], nodes=2)
[range(0, 2), range(2, 4)]
>>> r = routes([np.array([3, 0]), np.array([1, 2])], lo=0, hi=2)
>>> r.source.tolist(), r.rank.tolist(), r.position.tolist()
([0, 1], [0, 1], [1, 0])
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.order.lazy_permutation import LazyPermutation
from feedline.loader.order.resume import epoch_plan
from feedline.loader.order.sample_order import Order, global_order
from feedline.loader.order.state import Segment

__all__ = [
    "Routes",
    "StagePlan",
    "bucket_of",
    "check_nodes",
    "lazy_routes",
    "node_of",
    "node_row_groups",
    "routes",
    "stage_plan",
]


def node_of(rank: int, ranks_per_node: int) -> int:
    """The node of ``rank`` when each node runs ``ranks_per_node`` consecutive ranks.

    Examples
    --------
    >>> [node_of(r, 4) for r in (0, 3, 4, 7)]
    [0, 0, 1, 1]
    """
    return int(rank) // int(ranks_per_node)


def check_nodes(world_size: int, ranks_per_node: int) -> int:
    """The number of nodes: ``world_size / ranks_per_node``, which must divide evenly.

    Examples
    --------
    >>> check_nodes(8, 4)
    2
    """
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ConfigurationError(
            f"Loader: ranks_per_node={ranks_per_node} does not divide world_size={world_size}; "
            "a node runs ranks_per_node consecutive ranks. Fix: pass the number of training "
            "processes per machine (torchrun's LOCAL_WORLD_SIZE)."
        )
    return world_size // ranks_per_node


def node_row_groups(sizes: Sequence[int], nodes: int) -> list[range]:
    """Each node's share of the row groups: contiguous runs of about equally many rows.

    Node ``n`` takes the row groups whose first row falls in ``[n * total / nodes, (n + 1) *
    total / nodes)``, so each row group is read by exactly one node.

    Examples
    --------
    >>> node_row_groups([10, 1, 1, 10], nodes=2)
    [range(0, 2), range(2, 4)]
    >>> node_row_groups([5], nodes=3)
    [range(0, 1), range(1, 1), range(1, 1)]
    """
    counts = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1]
    total = int(counts.sum())
    cuts = [0]
    for n in range(1, nodes):
        bound = -(-n * total // nodes)  # rows of the nodes before n
        cuts.append(max(cuts[-1], int(np.searchsorted(starts, bound, side="left"))))
    cuts.append(len(counts))
    return [range(cuts[n], cuts[n + 1]) for n in range(nodes)]


@dataclass(frozen=True)
class Routes:
    """Destinations of rows ``[lo, hi)``: sorted by source row (then rank, position)."""

    source: np.ndarray
    rank: np.ndarray
    position: np.ndarray


def routes(plans: Sequence[np.ndarray], lo: int, hi: int) -> Routes:
    """Every ``(rank, position)`` whose plan names a row in ``[lo, hi)``, by source row.

    ``plans[r]`` is rank ``r``'s row indices in read order (its
    :class:`~feedline.loader.order.sample_order.EpochPlan` ``indices``). Memory: three
    int64 per destination in the range.
    """
    src, rank, pos = [], [], []
    for r, plan in enumerate(plans):
        plan = np.asarray(plan, dtype=np.int64)
        mine = np.flatnonzero((plan >= lo) & (plan < hi))
        src.append(plan[mine])
        rank.append(np.full(mine.size, r, dtype=np.int64))
        pos.append(mine.astype(np.int64))
    s = np.concatenate(src) if src else np.zeros(0, np.int64)
    k = np.concatenate(rank) if rank else np.zeros(0, np.int64)
    p = np.concatenate(pos) if pos else np.zeros(0, np.int64)
    order = np.argsort(s, kind="stable")
    return Routes(s[order], k[order], p[order])


def bucket_of(rank: np.ndarray, position: np.ndarray, bucket_rows: int) -> np.ndarray:
    """Each destination's bucket, as ``(rank, bucket number)`` pairs packed in one int64.

    Examples
    --------
    >>> bucket_of(np.array([0, 1]), np.array([5, 0]), 4).tolist()
    [1, 4294967296]
    """
    return (np.asarray(rank, np.int64) << 32) | (np.asarray(position, np.int64) // bucket_rows)


@dataclass(frozen=True, eq=False)
class StagePlan:
    """An epoch's plans for every rank (each rank's evaluated when asked for), and a key
    naming them (the order's inputs).

    ``order`` is the epoch's global order: a drawn permutation, or over
    :data:`~feedline.loader.order.sample_order.LAZY_ROWS` rows a
    :class:`~feedline.loader.order.lazy_permutation.LazyPermutation`, whose routes for a
    node's rows are found by inverting it at those rows (:func:`lazy_routes`), so a node holds
    its share of the destinations and its own ranks' plans, never every rank's.
    """

    epoch: int
    key: str
    order: Order
    segments: tuple[Segment, ...]
    world_size: int
    batch_size: int
    drop_last: bool
    pad_last: bool
    _plans: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def plan(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s row indices in read order (its ``EpochPlan.indices``), as int64."""
        got = self._plans.get(rank)
        if got is None:
            got = np.asarray(epoch_plan(self.order, self.segments, rank=rank,
                                        world_size=self.world_size, batch_size=self.batch_size,
                                        drop_last=self.drop_last, pad_last=self.pad_last).indices,
                             dtype=np.int64)  # fmt: skip
            self._plans[rank] = got
        return got

    def length(self, rank: int) -> int:
        """``len(self.plan(rank))``, without evaluating the plan over a lazy order."""
        if isinstance(self.order, LazyPermutation) and not self.segments:
            return int(_rank_lengths(len(self.order), self.world_size, self.batch_size,
                                     self.drop_last, self.pad_last)[rank])  # fmt: skip
        return len(self.plan(rank))

    def routes(self, lo: int, hi: int) -> Routes:
        """Every ``(rank, position)`` whose plan names a row in ``[lo, hi)``, by source row
        (then rank, then position)."""
        if isinstance(self.order, LazyPermutation) and not self.segments:
            return lazy_routes(self.order, lo, hi, world_size=self.world_size,
                               batch_size=self.batch_size, drop_last=self.drop_last,
                               pad_last=self.pad_last)  # fmt: skip
        return routes([self.plan(r) for r in range(self.world_size)], lo, hi)


def lazy_routes(order: LazyPermutation, lo: int, hi: int, *, world_size: int, batch_size: int,
                drop_last: bool, pad_last: bool) -> Routes:  # fmt: skip
    """:func:`routes` of the ranks' plans of ``order`` (no finished segments) for rows
    ``[lo, hi)``, found by inverting ``order`` at those rows: memory for the rows' destinations,
    not for the plans.

    In the layout of :func:`~feedline.loader.order.sample_order.split_for_rank` global
    position ``g`` is rank ``(g // batch_size) % world_size``'s sample
    ``(g // step) * batch_size + g % batch_size`` (``step = world_size * batch_size``);
    positions past the order's end repeat it cyclically (the padding of ``drop_last=False``;
    with ``pad_last=False`` a rank keeps only the repeat that saves it an empty last batch).

    Examples
    --------
    >>> from feedline.loader.order.sample_order import split_for_rank
    >>> order = LazyPermutation(10, seed=0, epoch=0)
    >>> plans = [split_for_rank(order, rank=r, world_size=2, batch_size=2,
    ...                         drop_last=False).indices for r in range(2)]
    >>> a, b = lazy_routes(order, 3, 8, world_size=2, batch_size=2, drop_last=False,
    ...                    pad_last=True), routes(plans, 3, 8)
    >>> all((x == y).all() for x, y in zip((a.source, a.rank, a.position),
    ...                                     (b.source, b.rank, b.position)))
    True
    """
    n, w, bs = len(order), int(world_size), int(batch_size)
    step = w * bs
    batches = n // step if drop_last else -(-n // step)
    total = batches * step
    rows = np.arange(lo, hi, dtype=np.int64)
    g = order.inverse(rows)
    kept = g < min(n, total)  # drop_last leaves out the last partial step
    g, src = g[kept], rows[kept]
    if total > n:  # the padding: positions [n, total) repeat the order from its start
        pad = np.arange(n, total, dtype=np.int64)
        again = order.take(pad % n)
        inside = (again >= lo) & (again < hi)
        pad, again = pad[inside], again[inside]
        if not pad_last:  # a rank keeps a repeat only where its last batch is otherwise empty
            keep = _rank_lengths(n, w, bs, drop_last, pad_last)
            at = (pad // step) * bs + pad % bs
            stays = at < keep[(pad // bs) % w]
            pad, again = pad[stays], again[stays]
        g, src = np.concatenate([g, pad]), np.concatenate([src, again])
    rank = (g // bs) % w
    position = (g // step) * bs + g % bs
    by = np.lexsort((position, rank, src))
    return Routes(src[by], rank[by], position[by])


def _rank_lengths(n: int, world: int, bs: int, drop_last: bool, pad_last: bool) -> np.ndarray:
    """Each rank's plan length over an order of ``n`` rows (``split_for_rank``'s layout): its
    batches in full, or with ``pad_last=False`` its real samples (a repeat where its last
    batch would otherwise be empty).

    Examples
    --------
    >>> _rank_lengths(10, 2, 2, drop_last=False, pad_last=False).tolist()
    [6, 5]
    """
    step = world * bs
    batches = n // step if drop_last else -(-n // step)
    lengths = np.full(world, batches * bs, dtype=np.int64)
    if pad_last or batches * step <= n or not batches:
        return lengths
    full, rest = divmod(n, step)
    real = full * bs + np.clip(rest - np.arange(world) * bs, 0, bs)
    return np.maximum(real, (batches - 1) * bs + 1)


def stage_plan(
    sizes: Sequence[int],
    *,
    epoch: int,
    shuffle: bool,
    seed: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    pad_last: bool,
    segments: Sequence[Segment] = (),
) -> StagePlan:
    """Every rank's row indices of epoch ``epoch``, exactly as ``cache="memory"`` orders them
    (the exact permutation, after the finished ``segments`` of an elastic resume).

    Examples
    --------
    >>> p = stage_plan([3, 3], epoch=0, shuffle=False, seed=0, world_size=2, batch_size=2,
    ...                drop_last=True, pad_last=False)
    >>> [p.plan(r).tolist() for r in range(2)], len(p.key)
    ([[0, 1], [2, 3]], 24)
    """
    order = global_order(sizes, shuffle=shuffle, seed=seed, epoch=epoch, window=None)
    doc = {"rows": [int(s) for s in sizes], "shuffle": bool(shuffle), "seed": int(seed),
           "world_size": world_size, "batch_size": batch_size, "drop_last": bool(drop_last),
           "pad_last": bool(pad_last), "segments": [s.as_dict() for s in segments]}  # fmt: skip
    key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]
    return StagePlan(int(epoch), key, order, tuple(segments), int(world_size), int(batch_size),
                     bool(drop_last), bool(pad_last))  # fmt: skip
