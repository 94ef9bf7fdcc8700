"""Loader checkpoints: where a restored loader stands and the epoch plan it implies.

The state itself (a tiny JSON-safe dict) and its validation live in
:mod:`feedline.loader.order.state`.

An epoch may be split into *segments*: a resume under a different world layout (elastic)
closes the old segment, recording how many samples each old rank had yielded, and the new
world splits what remains (:func:`remaining_after` of every segment, each under its own
layout, then :func:`~feedline.loader.order.sample_order.split_for_rank`: the semantics of
:func:`~feedline.loader.order.sample_order.elastic_split`). The plan of any rank at any point is
therefore a pure function of (order, segments, layout, batches yielded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.order import sample_order
from feedline.loader.order.lazy_block_order import LazyBlockOrder
from feedline.loader.order.lazy_permutation import LazyPermutation, LazyRemaining
from feedline.loader.order.sample_order import (
    EpochPlan,
    Order,
    samples_seen,
    seen_runs,
    split_for_rank,
)
from feedline.loader.order.state import (
    Segment,
    State,
    check_position,
    parse_states,
    real_samples,
    remaining_samples,
)

__all__ = ["Position", "epoch_plan", "merge_states", "remaining_after", "restore"]


def remaining_after(order: Order, segment: Segment) -> Order:
    """The samples of ``order`` that no rank of ``segment`` yielded, in global order.

    A lazy order (:mod:`~feedline.loader.order.lazy_permutation`) stays lazy: the seen
    positions are removed as runs (:func:`~feedline.loader.order.sample_order.seen_runs`),
    in memory for the ranks, not the rows.

    Examples
    --------
    >>> remaining_after(np.arange(8), Segment(2, 2, True, (2, 0))).tolist()
    [2, 3, 4, 5, 6, 7]
    """
    if isinstance(order, LazyPermutation | LazyRemaining | LazyBlockOrder):
        return LazyRemaining(order, seen_runs(
            len(order), consumed_per_rank=segment.consumed, world_size=segment.world_size,
            batch_size=segment.batch_size, drop_last=segment.drop_last,
        ))  # fmt: skip
    seen = samples_seen(
        order,
        consumed_per_rank=segment.consumed,
        world_size=segment.world_size,
        batch_size=segment.batch_size,
        drop_last=segment.drop_last,
    )
    arr = np.asarray(order, dtype=np.int64)
    unseen = np.ones(int(arr.max()) + 1 if arr.size else 0, dtype=bool)  # by row index: O(n)
    unseen[seen] = False
    return arr[unseen[arr]]


def epoch_plan(
    order: Order,
    segments: Sequence[Segment],
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    pad_last: bool = True,
) -> EpochPlan:
    """This rank's plan for the rest of an epoch after the finished ``segments``.

    ``pad_last=False`` leaves the padding repeats out: the rank's last batch is short (see
    :func:`~feedline.loader.order.sample_order.split_for_rank`).

    Examples
    --------
    >>> plan = epoch_plan(np.arange(12), [Segment(4, 1, True, (2, 2, 2, 2))], rank=0,
    ...                   world_size=2, batch_size=2, drop_last=True)
    >>> plan.indices.tolist()
    [8, 9]
    """
    for segment in segments:  # each with its own layout (drop_last included)
        order = remaining_after(order, segment)
    return split_for_rank(
        order,
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        drop_last=drop_last,
        pad_last=pad_last,
    )


def merge_states(states: Any) -> tuple[State, list[int]]:
    """One state (or one per old rank), validated, as ``(reference state, batches per rank)``.

    A single state stands for every old rank having yielded the same number of batches,
    which is what lock-step data-parallel training does; pass all ranks' states otherwise.

    Examples
    --------
    >>> state = {"version": 2, "seed": 0, "epoch": 2, "batches": 3, "rank": 0,
    ...          "world_size": 2, "batch_size": 4, "drop_last": True, "shuffle": True,
    ...          "shuffle_window": None, "num_samples": 100, "history": [], "fingerprint": None}
    >>> ref, counts = merge_states(state)
    >>> ref.epoch, counts
    (2, [3, 3])
    """
    items = parse_states(states)
    if len(items) == 1:
        return items[0], [items[0].batches] * items[0].world_size
    return items[0], [s.batches for s in sorted(items, key=lambda s: s.rank)]


@dataclass(frozen=True)
class Position:
    """Where a restored loader stands: the order's key and its progress through the epoch."""

    seed: int
    shuffle: bool
    window: int | None
    epoch: int
    segments: tuple[Segment, ...]
    batches: int


def restore(
    states: Mapping[str, Any] | State | Sequence[Mapping[str, Any] | State],
    *,
    num_samples: int,
    streaming: bool,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    fingerprint: str | None = None,
    seed: int | None = None,
    shuffle: bool | None = None,
    window: int | None = None,
    check_dataset: bool = True,
) -> Position:
    """The position a loader with this layout resumes at from ``states`` (see merge_states).

    Every state is validated (:mod:`feedline.loader.order.state`) and must have been taken on this
    dataset (``fingerprint``, ``num_samples``). With the checkpoint's layout and equal
    progress on every rank, the loader continues at the same batch; otherwise the old layout
    becomes a finished segment and the new world starts the rest of the epoch at its batch 0
    (elastic resume). The order (seed, shuffle, window) is always the checkpoint's; a
    ``seed``, ``shuffle`` or ``window`` (``shuffle_window``) the loader was given explicitly
    must be the checkpoint's (another one is another order, so its positions would name other
    samples): ``None`` means not given. ``check_dataset=False`` accepts a state without a
    fingerprint or of another one (see :func:`~feedline.loader.order.state.check_position`).

    Examples
    --------
    >>> state = {"version": 2, "seed": 0, "epoch": 2, "batches": 3, "rank": 0,
    ...          "world_size": 2, "batch_size": 4, "drop_last": True, "shuffle": True,
    ...          "shuffle_window": None, "num_samples": 100, "history": [], "fingerprint": "fp"}
    >>> restore(state, num_samples=100, streaming=False, world_size=2, batch_size=4,
    ...         drop_last=True, fingerprint="fp").batches
    3
    >>> len(restore(state, num_samples=100, streaming=False, world_size=3, batch_size=4,
    ...             drop_last=True, fingerprint="fp").segments)
    1
    >>> restore(state, num_samples=100, streaming=False, world_size=2, batch_size=4,
    ...         drop_last=True, fingerprint="fp", seed=1)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader state field 'seed' differs: ... seed=0 but ...
    >>> restore(state, num_samples=100, streaming=False, world_size=2, batch_size=4,
    ...         drop_last=True, fingerprint="fp", shuffle=False)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader state field 'shuffle' differs: ... shuffle=True ...
    """
    items = parse_states(states)
    for state in items:
        check_position(state, num_samples=num_samples, fingerprint=fingerprint,
                       check_dataset=check_dataset)  # fmt: skip
    ref, counts = merge_states(items)
    given = {"seed": seed, "shuffle": shuffle, "shuffle_window": window}
    saved = {"seed": ref.seed, "shuffle": ref.shuffle, "shuffle_window": ref.shuffle_window}
    for name, value in given.items():
        if value is not None and value != saved[name]:
            raise ConfigurationError(
                f"Loader state field {name!r} differs: the checkpoint was taken with "
                f"{name}={saved[name]!r} but this loader was given {name}={value!r}, whose "
                "order names other samples at the same positions. Fix: build the loader with "
                f"{name}={saved[name]!r} (or leave {name} unset to adopt the checkpoint's), or "
                "start the epoch over without the state."
            )
    exact = ref.shuffle and ref.shuffle_window is None
    if (
        exact
        and ref.version < 3
        and num_samples > sample_order.LAZY_ROWS
        and (ref.batches or ref.history)
    ):
        raise ConfigurationError(
            f"The loader state (version {ref.version}) was taken mid-epoch {ref.epoch} of an "
            f"exact shuffle over {num_samples} rows; this feedline shuffles more than "
            f"{sample_order.LAZY_ROWS} rows with another (lazily evaluated) permutation, so its "
            "positions would name other samples. Fix: finish this epoch with the feedline that "
            f"saved the state, or start epoch {ref.epoch + 1} (loader.set_epoch) without it."
        )
    if streaming and exact:
        raise ConfigurationError(
            "The loader state was taken with an exact in-memory shuffle, but this loader "
            "streams (the data is over memory_budget). Fix: pass cache='memory' or a larger "
            "memory_budget to resume it."
        )
    layout = (ref.world_size, ref.batch_size, ref.drop_last)
    if layout == (world_size, batch_size, drop_last) and len(set(counts)) <= 1:
        segments, batches = ref.history, counts[0]
    else:  # padding repeats left out of ``consumed``: a huge padded layout costs nothing
        left, bs = remaining_samples(num_samples, ref.history), ref.batch_size
        consumed = tuple(real_samples(left, r, c * bs, ref.world_size, bs)
                         for r, c in enumerate(counts))  # fmt: skip
        segments, batches = (*ref.history, Segment(*layout, consumed)), 0
    return Position(ref.seed, ref.shuffle, ref.shuffle_window, ref.epoch, segments, batches)
