"""Loader checkpoints: the tiny JSON-safe state and the epoch plan it implies.

An epoch may be split into *segments*: a resume under a different world layout (elastic)
closes the old segment, recording how many samples each old rank had yielded, and the new
world splits what remains (:func:`feedline.loader.order.elastic_split`). The plan of any
rank at any point is therefore a pure function of (order, segments, layout, batches yielded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.order import EpochPlan, elastic_split, samples_seen, split_for_rank

__all__ = [
    "STATE_VERSION",
    "Position",
    "Segment",
    "epoch_plan",
    "merge_states",
    "remaining_after",
    "restore",
]

STATE_VERSION = 1
_KEYS = ("version", "seed", "epoch", "batches", "rank", "world_size", "batch_size", "drop_last")


@dataclass(frozen=True)
class Segment:
    """A finished part of an epoch: a world layout and the samples each of its ranks yielded."""

    world_size: int
    batch_size: int
    drop_last: bool
    consumed: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "consumed": list(self.consumed),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Segment:
        return cls(
            int(doc["world_size"]),
            int(doc["batch_size"]),
            bool(doc["drop_last"]),
            tuple(int(c) for c in doc["consumed"]),
        )


def remaining_after(order: np.ndarray, segment: Segment) -> np.ndarray:
    """The samples of ``order`` that no rank of ``segment`` yielded, in global order.

    Examples
    --------
    >>> remaining_after(np.arange(8), Segment(2, 2, True, (2, 0))).tolist()
    [2, 3, 4, 5, 6, 7]
    """
    seen = samples_seen(
        order,
        consumed_per_rank=segment.consumed,
        world_size=segment.world_size,
        batch_size=segment.batch_size,
        drop_last=segment.drop_last,
    )
    arr = np.asarray(order, dtype=np.int64)
    return arr[~np.isin(arr, seen, assume_unique=True)]


def epoch_plan(
    order: np.ndarray,
    segments: Sequence[Segment],
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
) -> EpochPlan:
    """This rank's plan for the rest of an epoch after the finished ``segments``.

    Examples
    --------
    >>> plan = epoch_plan(np.arange(12), [Segment(4, 1, True, (2, 2, 2, 2))], rank=0,
    ...                   world_size=2, batch_size=2, drop_last=True)
    >>> plan.indices.tolist()
    [8, 9]
    """
    if not segments:
        return split_for_rank(
            order, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=drop_last
        )
    for segment in segments[:-1]:
        order = remaining_after(order, segment)
    last = segments[-1]
    return elastic_split(
        order,
        consumed_per_rank=last.consumed,
        old_world_size=last.world_size,
        old_batch_size=last.batch_size,
        new_rank=rank,
        new_world_size=world_size,
        batch_size=batch_size,
        drop_last=drop_last,
    )


def _check(state: Any) -> Mapping[str, Any]:
    if not isinstance(state, Mapping) or any(k not in state for k in _KEYS):
        raise ConfigurationError(
            f"Not a feedline loader state: expected a dict with keys {list(_KEYS)}, got "
            f"{state!r:.200}. Fix: pass what Loader.state_dict() returned."
        )
    if state["version"] != STATE_VERSION:
        raise ConfigurationError(
            f"Loader state version {state['version']!r} is not supported (this feedline writes "
            f"version {STATE_VERSION}). Fix: resume with the feedline version that saved it."
        )
    return state


def merge_states(
    states: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> tuple[Mapping[str, Any], list[Segment], Segment | None, int]:
    """Combine one state (or one per old rank) into what a loader resumes from.

    Returns ``(reference state, earlier segments, closed segment or None, batches)``: with
    the same layout and equal counts the position is ``batches`` into the current segment;
    otherwise the old segment is closed (``closed``) and the new world starts at batch 0. A
    single state stands for every old rank having yielded the same number of batches, which
    is what lock-step data-parallel training does; pass all ranks' states otherwise.

    Examples
    --------
    >>> state = {"version": 1, "seed": 0, "epoch": 2, "batches": 3, "rank": 0,
    ...          "world_size": 2, "batch_size": 4, "drop_last": True}
    >>> _, history, closed, batches = merge_states(state)
    >>> history, closed.consumed, batches
    ([], (12, 12), 3)
    """
    items = [_check(states)] if isinstance(states, Mapping) else [_check(s) for s in states]
    if not items:
        raise ConfigurationError(
            "load_state_dict() got an empty list of states. Fix: pass the state_dict() of "
            "every rank (or one state)."
        )
    first = items[0]
    for s in items[1:]:
        for key in ("seed", "epoch", "world_size", "batch_size", "drop_last", "history"):
            if s.get(key) != first.get(key):
                raise ConfigurationError(
                    f"The loader states disagree on {key!r} ({s.get(key)!r} vs "
                    f"{first.get(key)!r}). Fix: pass the states of one checkpoint, one per rank."
                )
    history = [Segment.from_dict(d) for d in first.get("history", [])]
    world, bs = int(first["world_size"]), int(first["batch_size"])
    if len(items) == 1:
        counts = [int(first["batches"])] * world
    else:
        by_rank = {int(s["rank"]): int(s["batches"]) for s in items}
        if sorted(by_rank) != list(range(world)):
            raise ConfigurationError(
                f"Got states for ranks {sorted(by_rank)} of a world of {world}. Fix: pass one "
                "state per old rank (or a single state when all ranks yielded as many batches)."
            )
        counts = [by_rank[r] for r in range(world)]
    closed = Segment(world, bs, bool(first["drop_last"]), tuple(c * bs for c in counts))
    return first, history, closed, counts[0]


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
    states: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    num_samples: int,
    streaming: bool,
    world_size: int,
    batch_size: int,
    drop_last: bool,
) -> Position:
    """The position a loader with this layout resumes at from ``states`` (see merge_states).

    With the checkpoint's layout and equal progress on every rank, the loader continues at
    the same batch; otherwise the old layout becomes a finished segment and the new world
    starts the rest of the epoch at its batch 0 (elastic resume).

    Examples
    --------
    >>> state = {"version": 1, "seed": 0, "epoch": 2, "batches": 3, "rank": 0,
    ...          "world_size": 2, "batch_size": 4, "drop_last": True, "shuffle": True}
    >>> restore(state, num_samples=100, streaming=False, world_size=2, batch_size=4,
    ...         drop_last=True).batches
    3
    >>> len(restore(state, num_samples=100, streaming=False, world_size=3, batch_size=4,
    ...             drop_last=True).segments)
    1
    """
    ref, history, closed, batches = merge_states(states)
    if ref.get("num_samples", num_samples) != num_samples:
        raise ConfigurationError(
            f"The loader state is for {ref['num_samples']} samples but this dataset has "
            f"{num_samples}. Fix: resume on the dataset the checkpoint was taken on."
        )
    window = ref.get("shuffle_window")
    shuffle = bool(ref.get("shuffle", True))
    if streaming and window is None and shuffle:
        raise ConfigurationError(
            "The loader state was taken with an exact in-memory shuffle, but this loader "
            "streams (the data is over memory_budget). Fix: pass cache='memory' or a larger "
            "memory_budget to resume it."
        )
    layout = (closed.world_size, closed.batch_size, closed.drop_last)
    same = layout == (world_size, batch_size, drop_last) and len(set(closed.consumed)) <= 1
    segments = tuple(history) if same else (*history, closed)
    return Position(
        int(ref["seed"]), shuffle, window, int(ref["epoch"]), segments, batches if same else 0
    )
