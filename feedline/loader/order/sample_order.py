"""The loader's sample order: pure functions of (row-group sizes, seed, epoch, rank, world).

No hidden random state, globals or environment variables, so resume and re-sharding are exact.
Rank layout (batch-granularity interleave): the global order is cut into steps of ``step =
world_size * batch_size`` positions; in step ``k``, rank ``r`` takes positions ``k*step +
r*batch_size`` up to ``+ batch_size`` as its ``k``-th batch. All ranks' ``k``-th batches thus come
from the same region of the global order (memory locality for the two-level shuffle), and after
``k`` batches per rank exactly the first ``k*step`` positions are consumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.checks import checked_int
from feedline.loader.order.lazy_block_order import LazyBlockOrder
from feedline.loader.order.lazy_permutation import LazyPermutation, LazyRemaining

__all__ = [
    "LAZY_ROWS",
    "EpochPlan",
    "Order",
    "block_shuffle_order",
    "block_shuffle_pools",
    "elastic_split",
    "epoch_permutation",
    "global_order",
    "lazy_block_shuffle_order",
    "resume_order",
    "samples_seen",
    "seen_runs",
    "sequential_order",
    "shuffle_quality",
    "split_for_rank",
]

#: exact shuffles of more rows than this use the lazily evaluated
#: :class:`~feedline.loader.order.lazy_permutation.LazyPermutation` (a rank evaluates only its
#: own positions: memory for its share, not ``8 * num_rows`` bytes per order array); smaller
#: ones keep :func:`epoch_permutation`, so the orders of every dataset below this size are
#: those of earlier releases (and their checkpoints resume exactly). 2**26 rows: a drawn
#: order of 512 MiB.
LAZY_ROWS = 1 << 26

#: an epoch's global order: drawn (an int64 array) or evaluated lazily per position (after
#: an elastic resume: the lazy order less the positions seen)
Order = np.ndarray | LazyPermutation | LazyRemaining | LazyBlockOrder
_LAZY = (LazyPermutation, LazyRemaining, LazyBlockOrder)

# Domain-separation tags mixed into the seed, so the streams of different uses never coincide.
_EXACT, _GROUPS, _POOL = 0, 1, 2


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """One rank's share of an epoch's global order.

    ``indices`` (int64 global row indices, in yield order) and ``padded`` (bool, True where the
    sample repeats another to pad the epoch) are ``num_batches * batch_size`` long, or shorter
    when the last batch is short (``drop_last=False, pad_last=False``: only that batch, the
    rank's last, holds fewer than ``batch_size`` samples, never none: a rank with no sample
    left for it gets one repeat); ``num_batches`` is the same on every rank.
    """

    indices: np.ndarray
    padded: np.ndarray
    num_batches: int
    batch_size: int

    def batch(self, k: int) -> np.ndarray:
        """Global row indices of this rank's ``k``-th batch (a view)."""
        if not 0 <= k < self.num_batches:
            raise IndexError(f"batch {k} out of range: this plan has {self.num_batches} batches")
        return self.indices[k * self.batch_size : (k + 1) * self.batch_size]


def _int(where: str, name: str, value: Any, minimum: int, fix: str) -> int:
    """``value`` as an int >= ``minimum`` (:func:`~feedline.loader.checks.checked_int`), or a
    ConfigurationError naming ``where`` and ``name``."""

    def fail(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"{where}: {name} must be {expected}, got {value!r} ({type(value).__name__}). "
            f"Fix: {fix}"
        )

    return checked_int(value, minimum, fail=fail)


def _order(where: str, order: Any) -> np.ndarray:
    """``order`` as an int64 array (a lazy permutation drawn whole: O(n) memory)."""
    arr = np.asarray(order)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ConfigurationError(
            f"{where}: order must be a 1-D integer array of row indices, got shape {arr.shape} "
            f"dtype {arr.dtype}. Fix: pass the output of global_order()."
        )
    return arr.astype(np.int64, copy=False)


def _sizes(where: str, row_group_sizes: Sequence[int]) -> np.ndarray:
    sizes = np.asarray(row_group_sizes, dtype=np.int64).reshape(-1)
    if sizes.size and sizes.min() < 0:
        raise ConfigurationError(
            f"{where}: row group sizes must be >= 0, got {int(sizes.min())} at row group "
            f"{int(sizes.argmin())}. Fix: pass the row counts from the dataset manifest."
        )
    return sizes


def _key(where: str, seed: int, epoch: int) -> tuple[int, int]:
    fix = "pass non-negative integers for seed and epoch."
    return _int(where, "seed", seed, 0, fix), _int(where, "epoch", epoch, 0, fix)


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(key))))


def sequential_order(num_rows: int) -> np.ndarray:
    """Rows in storage order: ``arange(num_rows)`` as int64.

    Examples
    --------
    >>> sequential_order(4)
    array([0, 1, 2, 3])
    """
    n = _int("sequential_order", "num_rows", num_rows, 0, "pass the dataset's row count.")
    return np.arange(n, dtype=np.int64)


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """Exact uniform permutation of ``range(num_rows)`` for ``(seed, epoch)``, as int64.

    Drawn from a Philox generator keyed by ``SeedSequence([seed, epoch, 0])``: platform
    independent, and a different permutation every epoch.

    Examples
    --------
    >>> p = epoch_permutation(5, seed=0, epoch=0)
    >>> sorted(p.tolist()), bool((p == epoch_permutation(5, seed=0, epoch=0)).all())
    ([0, 1, 2, 3, 4], True)
    """
    n = _int("epoch_permutation", "num_rows", num_rows, 0, "pass the dataset's row count.")
    rng = _rng(*_key("epoch_permutation", seed, epoch), _EXACT)
    return rng.permutation(n).astype(np.int64, copy=False)


def block_shuffle_pools(
    row_group_sizes: Sequence[int], seed: int, epoch: int, window: int
) -> list[np.ndarray]:
    """Row-group ids of each pool of the two-level shuffle, in yield order.

    The row groups are permuted globally, then cut into pools of ``window`` consecutive groups;
    a streaming reader loads one pool at a time (:func:`block_shuffle_order` yields its rows).

    Examples
    --------
    >>> pools = block_shuffle_pools([10, 10, 10, 10, 10], seed=0, epoch=0, window=2)
    >>> [len(p) for p in pools], sorted(int(g) for p in pools for g in p)
    ([2, 2, 1], [0, 1, 2, 3, 4])
    """
    sizes = _sizes("block_shuffle_order", row_group_sizes)
    key = _key("block_shuffle_order", seed, epoch)
    w = _int("block_shuffle_order", "window", window, 1, "pass a window of >= 1 row groups.")
    groups = _rng(*key, _GROUPS).permutation(sizes.size).astype(np.int64)
    return [groups[i : i + w] for i in range(0, groups.size, w)]


def block_shuffle_order(
    row_group_sizes: Sequence[int], seed: int, epoch: int, window: int
) -> np.ndarray:
    """Two-level shuffle for data larger than memory; returns global row indices (int64).

    Row groups are permuted, then the rows of each pool of ``window`` consecutive row groups
    (:func:`block_shuffle_pools`) are permuted inside it. Group ``g`` holds rows ``offsets[g]:
    offsets[g+1]``, ``offsets = [0, *cumsum(sizes)]``. Streaming holds ``window`` row groups in
    memory; ``window >= len(row_group_sizes)`` gives an exact uniform permutation.

    Examples
    --------
    >>> o = block_shuffle_order([3, 3, 3], seed=0, epoch=0, window=1)
    >>> (o // 3).tolist()  # window=1: each row group's rows stay together
    [0, 0, 0, 2, 2, 2, 1, 1, 1]
    """
    pools = block_shuffle_pools(row_group_sizes, seed, epoch, window)
    sizes = _sizes("block_shuffle_order", row_group_sizes)
    groups = np.concatenate(pools) if pools else np.zeros(0, dtype=np.int64)
    lengths = sizes[groups]
    seg_starts = np.cumsum(lengths) - lengths  # concatenated aranges, vectorized
    shift = np.repeat((np.cumsum(sizes) - sizes)[groups] - seg_starts, lengths)
    out = np.arange(int(lengths.sum()), dtype=np.int64) + shift
    bounds = np.cumsum([0] + [int(sizes[pool].sum()) for pool in pools])
    for i in range(len(pools)):  # one generator per pool: any pool can be made on its own
        _rng(int(seed), int(epoch), _POOL, i).shuffle(out[bounds[i] : bounds[i + 1]])
    return out


def global_order(
    row_group_sizes: Sequence[int], *, shuffle: bool, seed: int, epoch: int, window: int | None
) -> Order:
    """Return the epoch's global order over all rows of the given row groups.

    ``shuffle=False`` gives :func:`sequential_order`, ``window=None`` the exact
    :func:`epoch_permutation` (over :data:`LAZY_ROWS` rows: the exact, lazily evaluated
    :class:`~feedline.loader.order.lazy_permutation.LazyPermutation`, which
    :func:`split_for_rank` evaluates at the rank's positions only), ``window=k`` the
    two-level :func:`block_shuffle_order`.

    Examples
    --------
    >>> global_order([2, 2], shuffle=False, seed=0, epoch=0, window=None).tolist()
    [0, 1, 2, 3]
    """
    total = int(_sizes("global_order", row_group_sizes).sum())
    if not shuffle:
        return sequential_order(total)
    if window is None and total > LAZY_ROWS:
        return LazyPermutation(total, *_key("global_order", seed, epoch))
    if window is None:
        return epoch_permutation(total, seed, epoch)
    if total > LAZY_ROWS:
        return lazy_block_shuffle_order(row_group_sizes, seed, epoch, window)
    return block_shuffle_order(row_group_sizes, seed, epoch, window)


def lazy_block_shuffle_order(
    row_group_sizes: Sequence[int], seed: int, epoch: int, window: int
) -> LazyBlockOrder:
    """:func:`block_shuffle_order`, value for value, evaluated lazily pool by pool (memory:
    the row groups' ids and one pool's rows; see
    :mod:`~feedline.loader.order.lazy_block_order`).

    Examples
    --------
    >>> lazy = lazy_block_shuffle_order([3, 2, 0, 4], 7, 3, 2)
    >>> lazy.take(range(9)).tolist() == block_shuffle_order([3, 2, 0, 4], 7, 3, 2).tolist()
    True
    """
    pools = block_shuffle_pools(row_group_sizes, seed, epoch, window)
    s, e = int(seed), int(epoch)

    def shuffle_pool(i: int, rows: np.ndarray) -> None:  # as block_shuffle_order draws it
        _rng(s, e, _POOL, i).shuffle(rows)

    return LazyBlockOrder(_sizes("block_shuffle_order", row_group_sizes), pools, shuffle_pool)


def _num_batches(where: str, n: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    w = _int(where, "world_size", world_size, 1, "pass the number of training processes.")
    b = _int(where, "batch_size", batch_size, 1, "pass a per-rank batch size >= 1.")
    return n // (w * b) if drop_last else -(-n // (w * b))


def _positions(rank: int, count: int, world_size: int, batch_size: int) -> np.ndarray:
    """Global-order positions of the first ``count`` samples of ``rank``'s share."""
    j = np.arange(count, dtype=np.int64)
    return (j // batch_size) * (world_size * batch_size) + rank * batch_size + j % batch_size


def _split(
    where: str,
    order: Any,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    pad_last: bool = True,
) -> EpochPlan:
    lazy = order if isinstance(order, _LAZY) else None
    arr = _order(where, order) if lazy is None else np.zeros(0, dtype=np.int64)
    n = arr.size if lazy is None else len(lazy)
    num_batches = _num_batches(where, n, world_size, batch_size, drop_last)
    r = _int(where, "rank", rank, 0, "pass this process's rank, 0 <= rank < world_size.")
    if r >= world_size:
        raise ConfigurationError(
            f"{where}: rank={r} is out of range for world_size={world_size} (ranks are "
            f"0..{world_size - 1}). Fix: pass this process's rank (e.g. torch.distributed."
            "get_rank()) and the total number of processes as world_size."
        )
    total = num_batches * world_size * batch_size
    if total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return EpochPlan(empty, np.zeros(0, dtype=bool), 0, int(batch_size))
    steps = (num_batches, world_size, batch_size)
    if lazy is not None:  # evaluated at this rank's positions only: memory for its share
        pos = _positions(r, num_batches * int(batch_size), world_size, batch_size)
        indices, padded = lazy.take(pos % n), pos >= n
    else:
        # the _positions layout as a strided view: step k of the global order holds every
        # rank's k-th batch; padding repeats the order cyclically (np.resize), as
        # arr[pos % arr.size]
        full = arr[:total] if total <= n else np.resize(arr, total)
        indices = full.reshape(steps)[:, r, :].reshape(-1)  # a view when world_size == 1
        padded = np.zeros(indices.size, dtype=bool)
        if total > n:
            padded = (np.arange(total).reshape(steps)[:, r, :] >= n).reshape(-1)
    if total > n and not pad_last:  # the repeats all sit at the end of the rank's last
        # batch: cut them, but one, when the batch holds nothing else (an empty batch breaks
        # a training step: the mean of a loss over no sample is NaN; DDP needs every rank's)
        real = int(indices.size - np.count_nonzero(padded))
        keep = max(real, (num_batches - 1) * int(batch_size) + 1)
        indices, padded = indices[:keep], padded[:keep]
    return EpochPlan(indices, padded, num_batches, int(batch_size))


def split_for_rank(
    order: Order,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    pad_last: bool = True,
) -> EpochPlan:
    """Rank ``rank``'s share of the global ``order`` (see the module docstring for the layout).

    Every rank gets the same number of batches; the ranks are disjoint. ``drop_last=True``
    truncates ``order`` to a multiple of ``step = world_size * batch_size`` (drops fewer than
    ``step`` samples); ``drop_last=False`` pads it to a multiple of ``step`` by repeating samples
    from its start, cyclically, and marks the repeats in ``EpochPlan.padded``; with
    ``pad_last=False`` the repeats are left out instead, so each rank's last batch is short:
    the last step's samples fill the ranks' last batches in rank order (rank 0's first), and
    a rank past them gets a last batch of one repeat (marked in ``padded``), never an empty
    one, so every rank still takes ``num_batches`` training steps. The positions of the real
    samples are the same either way, so resuming and elastic re-sharding treat both alike.

    Raises
    ------
    ConfigurationError
        If ``world_size < 1``, ``batch_size < 1``, ``rank`` is not in ``[0, world_size)`` or
        ``order`` is not a 1-D integer array.

    Examples
    --------
    >>> plan = split_for_rank(list(range(10)), rank=1, world_size=2, batch_size=2, drop_last=False)
    >>> plan.num_batches, plan.indices.tolist(), plan.padded.tolist()
    (3, [2, 3, 6, 7, 0, 1], [False, False, False, False, True, True])
    >>> short = split_for_rank(list(range(10)), rank=1, world_size=2, batch_size=2,
    ...                        drop_last=False, pad_last=False)
    >>> short.num_batches, [short.batch(k).tolist() for k in range(3)], short.padded.tolist()
    (3, [[2, 3], [6, 7], [0]], [False, False, False, False, True])
    """
    return _split("split_for_rank", order, rank, world_size, batch_size, drop_last, pad_last)


def resume_order(order: np.ndarray, *, consumed_global: int) -> np.ndarray:
    """Return what remains of the global ``order`` after ``consumed_global`` positions.

    In the :func:`split_for_rank` layout ``consumed_global = batches_per_rank * world_size *
    batch_size``; counts past the end (padding) give an empty array.

    Examples
    --------
    >>> resume_order([5, 3, 1, 0, 2, 4], consumed_global=4).tolist()
    [2, 4]
    """
    c = _int("resume_order", "consumed_global", consumed_global, 0, "pass a count >= 0.")
    return _order("resume_order", order)[c:]


def _counts(
    where: str, n: int, counts: Sequence[int], world: int, bs: int, drop: bool
) -> list[int]:
    """The old ranks' sample counts, checked against their layout's share."""
    share = _num_batches(where, n, world, bs, drop) * bs
    if len(counts) != world:
        raise ConfigurationError(
            f"{where}: consumed_per_rank has {len(counts)} entries but the world had {world} "
            "ranks. Fix: pass one count per old rank, in rank order."
        )
    out = []
    for r, c in enumerate(counts):
        count = _int(where, f"consumed_per_rank[{r}]", c, 0, "pass sample counts >= 0.")
        if count > share:
            raise ConfigurationError(
                f"{where}: consumed_per_rank[{r}]={count} exceeds rank {r}'s share of {share} "
                f"samples (batch_size={bs}, world_size={world}, drop_last={drop}). Fix: pass the "
                "old world's layout and the counts of this epoch."
            )
        out.append(count)
    return out


def _seen(where: str, n: int, counts: Sequence[int], world: int, bs: int, drop: bool) -> np.ndarray:
    """Sorted global-order positions (< n, so padding excluded) already yielded by the ranks."""
    checked = _counts(where, n, counts, world, bs, drop)
    parts = [np.zeros(0, dtype=np.int64)]
    parts += [_positions(r, count, world, bs) for r, count in enumerate(checked)]
    pos = np.sort(np.concatenate(parts))
    return pos[pos < n]


def seen_runs(
    num_rows: int,
    *,
    consumed_per_rank: Sequence[int],
    world_size: int,
    batch_size: int,
    drop_last: bool,
) -> list[tuple[int, int]]:
    """The positions :func:`samples_seen` covers, as ``(start, length)`` runs (padding
    positions, ``>= num_rows``, included: a consumer clips them): the batches every rank
    yielded are one run from 0, then one run per batch a rank yielded beyond the others.
    Memory is ``O(world_size)`` after a lock-step checkpoint, whatever ``num_rows``.

    Examples
    --------
    >>> seen_runs(100, consumed_per_rank=[6, 4], world_size=2, batch_size=2, drop_last=True)
    [(0, 8), (8, 2)]
    """
    where, b = "seen_runs", int(batch_size)
    counts = _counts(where, num_rows, consumed_per_rank, world_size, b, drop_last)
    step = world_size * b
    common = min((c // b for c in counts), default=0)  # batches every rank yielded
    runs = [(0, common * step)] if common else []
    for r, c in enumerate(counts):
        for k in range(common, -(-c // b)):
            runs.append((k * step + r * b, min(b, c - k * b)))
    return runs


def samples_seen(
    order: Order,
    *,
    consumed_per_rank: Sequence[int],
    world_size: int,
    batch_size: int,
    drop_last: bool,
) -> np.ndarray:
    """Global row indices already yielded, in global-order position, padding repeats left out.

    Rank ``r`` has yielded the first ``consumed_per_rank[r]`` samples of its
    :func:`split_for_rank` share.

    Examples
    --------
    >>> order = [9, 8, 7, 6, 5, 4, 3, 2]
    >>> samples_seen(order, consumed_per_rank=[2, 0], world_size=2, batch_size=2,
    ...              drop_last=True).tolist()
    [9, 8]
    """
    where = "samples_seen"
    if isinstance(order, _LAZY):  # evaluated at the seen positions only
        pos = _seen(where, len(order), consumed_per_rank, world_size, batch_size, drop_last)
        return order.take(pos)
    arr = _order(where, order)
    return arr[_seen(where, arr.size, consumed_per_rank, world_size, batch_size, drop_last)]


def elastic_split(
    order: np.ndarray,
    *,
    consumed_per_rank: Sequence[int],
    old_world_size: int,
    old_batch_size: int,
    new_rank: int,
    new_world_size: int,
    batch_size: int,
    drop_last: bool,
    pad_last: bool = True,
) -> EpochPlan:
    """Elastic resume: split the samples no old rank has seen over a new world.

    Old rank ``r`` had yielded ``consumed_per_rank[r]`` samples (usually equal multiples of
    ``old_batch_size``) of its :func:`split_for_rank` share under ``old_world_size``,
    ``old_batch_size`` and ``drop_last``. The unseen samples, in global order (those the old
    layout would have dropped included), are split with :func:`split_for_rank` semantics, padding
    repeating from the start of the unseen ones (left out with ``pad_last=False``). Seen plus
    the new ranks' non-padded samples is the whole epoch without repeats (with
    ``drop_last=True``, minus fewer than ``new_world_size * batch_size`` samples).

    Examples
    --------
    >>> plan = elastic_split(list(range(12)), consumed_per_rank=[2, 2, 2, 2], old_world_size=4,
    ...                      old_batch_size=1, new_rank=0, new_world_size=2, batch_size=2,
    ...                      drop_last=True)
    >>> plan.indices.tolist()  # positions 0..7 were seen; 8..11 remain
    [8, 9]
    """
    arr, where = _order("elastic_split", order), "elastic_split"
    unseen = np.ones(arr.size, dtype=bool)
    unseen[_seen(where, arr.size, consumed_per_rank, old_world_size, old_batch_size, drop_last)] = 0
    return _split(where, arr[unseen], new_rank, new_world_size, batch_size, drop_last, pad_last)


def shuffle_quality(
    order: np.ndarray, labels: np.ndarray | None = None, batch_size: int = 256
) -> dict[str, float]:
    """Measures of how well ``order`` is shuffled, for reporting (NaN where undefined).

    ``mean_jump``: mean ``|order[i+1] - order[i]|`` over ``num_rows / 3`` (its expectation for a
    uniform permutation, ``num_rows = max(order) + 1``): ~1 ideal, ~0 sequential.
    ``batch_spread``: mean over batches of the std of their positions over ``num_rows /
    sqrt(12)`` (a uniform draw's): ~1 ideal, ~0 sequential. With ``labels`` (indexed by row):
    ``label_diversity``, mean over batches of ``distinct labels / min(len(batch), num_classes)``
    (~1 ideal), and ``label_tv``, mean total-variation distance between each batch's label
    histogram and that of all of ``order`` (~0 ideal). Batches: chunks of ``batch_size``.

    Examples
    --------
    >>> q = shuffle_quality(sequential_order(10_000), labels=np.arange(10_000) // 1000)
    >>> round(q["mean_jump"], 4), round(q["label_diversity"], 2)
    (0.0003, 0.12)
    """
    arr = _order("shuffle_quality", order)
    b = _int("shuffle_quality", "batch_size", batch_size, 1, "pass a batch size >= 1.")
    names = ["mean_jump", "batch_spread", "label_diversity", "label_tv"]
    out = dict.fromkeys(names[: 2 if labels is None else 4], float("nan"))
    if arr.size == 0:
        return out
    num_rows, starts = int(arr.max()) + 1, np.arange(0, arr.size, b)
    if arr.size >= 2:
        out["mean_jump"] = float(np.abs(np.diff(arr)).mean() / (num_rows / 3))
    spread = np.mean([arr[s : s + b].std() for s in starts])
    out["batch_spread"] = float(spread / (num_rows / np.sqrt(12)))
    if labels is None:
        return out
    lab = np.asarray(labels)
    if lab.ndim != 1 or lab.size < num_rows:
        raise ConfigurationError(
            f"shuffle_quality: labels must be 1-D with one entry per row (>= {num_rows}), got "
            f"shape {lab.shape}. Fix: pass labels indexed by original row position."
        )
    classes, codes = np.unique(lab[arr], return_inverse=True)
    hist_all = np.bincount(codes, minlength=classes.size) / arr.size
    div, tv = [], []
    for s in starts:
        hist = np.bincount(codes[s : s + b], minlength=classes.size)
        size = int(hist.sum())
        div.append(np.count_nonzero(hist) / min(size, classes.size))
        tv.append(0.5 * np.abs(hist / size - hist_all).sum())
    out["label_diversity"], out["label_tv"] = float(np.mean(div)), float(np.mean(tv))
    return out
