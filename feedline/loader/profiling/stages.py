"""Per-stage accounting of a node pipeline: time working and waiting, samples, bytes, queues.

:meth:`StageMeters.instrument` puts a :class:`Meter` around every node of a pipeline (the
top node and, down the chain of ``source`` attributes, each node's source). A meter adds
the time spent inside its node's ``next()`` / ``next_group()`` / ``take()`` (*inclusive*:
the node and everything before it in the same thread) and counts the batches and samples
through it. What a stage did on its own follows when the numbers are read
(:func:`stage_rows`): its input wait is its source's inclusive time (when the source runs in
the same thread), its work the rest. A group of batches' samples are counted from its first
and last batch (:func:`_group_samples`; checked against the sum every 256th group).

The node the training loop pulls from gets no meter: the loop's own clock times it
(``loader.timeline()``), so the meters run where batches are made, once per hand-over of a
group of small batches. The cost per call is two ``time.perf_counter()`` readings and a few
additions; bytes are estimated from every 16th call's first batch (``nbytes`` of its arrays)
and the queue of a :class:`~feedline.loader.nodes.Prefetch` is looked at (by the node
feeding it) every 8th call, so the meters stay on (``bench/profile_overhead.py`` measures
what they cost).

When PyTorch is imported and its profiler is recording as an iteration starts, the meters
also open a ``torch.profiler.record_function`` range per call (named ``feedline.<stage>``),
so the stages appear in PyTorch's profiler and TensorBoard traces. Torch is never imported
here: the check is ``sys.modules``.

Examples
--------
>>> import feedline as fl
>>> loader = fl.range(64).loader(batch_size=8, shuffle=False, prefetch=0)
>>> meters = StageMeters()
>>> node = meters.instrument(loader.source_node())
>>> _ = list(node)
>>> [(s.name, s.batches, s.samples) for s in meters.stages.values()]  # the top: the loop's
[('gather', 0, 0), ('order', 8, 64)]
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from feedline.loader.nodes.node import Batch, Node, Stage

__all__ = ["STAGE_NAMES", "Meter", "StageMeters", "StageStats", "profiler_active"]

#: what each node of the default pipeline is called in reports (others: the class name)
STAGE_NAMES = {
    "Order": "order",
    "Gather": "gather",
    "Map": "transform",
    "Collate": "collate",
    "Format": "format",
    "Pin": "pin",
    "Prefetch": "prefetch",
    "CopyToDevice": "device copy",
    "ToDevice": "device copy",
    "AwaitDevice": "device wait",
}
#: calls between two byte counts, and between two looks at a prefetch queue (powers of 2)
BYTES_EVERY, QUEUE_EVERY = 16, 8
#: groups between two exact sums of their samples (see _group_samples; a power of 2)
CHECK_EVERY = 256


@dataclass(slots=True)
class StageStats:
    """The counters of one stage, summed over every iteration the meters saw.

    ``seconds`` is inclusive (the node and the nodes before it in its thread); ``bytes`` is
    estimated as ``samples * sampled_bytes / sampled_samples``.
    """

    name: str
    kind: str
    depth: int
    thread: str = "loop"
    calls: int = 0
    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    sampled_bytes: int = 0
    sampled_samples: int = 0
    queue_sum: int = 0
    queue_looks: int = 0
    depth_of_queue: int = 0
    #: the queue's depth summed over the looks (``prefetch="auto"`` changes it as it runs)
    queue_capacity: int = 0
    busy_s: float = 0.0
    workers: int | None = None
    worker_type: str | None = None
    #: timed by the loop (the loader's timeline), not by a meter: the node the loop pulls
    from_loop: bool = False

    @property
    def bytes(self) -> int:
        """Bytes through the stage, estimated from the sampled batches."""
        if not self.sampled_samples:
            return 0
        return int(self.samples * self.sampled_bytes / self.sampled_samples)

    @property
    def queue_occupancy(self) -> float | None:
        """Mean share of the prefetch queue that was full (``None``: not a queue)."""
        if not self.queue_looks or not self.depth_of_queue:
            return None
        return self.queue_sum / (self.queue_capacity or self.queue_looks * self.depth_of_queue)


#: the counters :meth:`StageMeters.since` subtracts
_COUNTS = ("calls", "batches", "samples", "seconds", "sampled_bytes", "sampled_samples",
           "queue_sum", "queue_looks", "queue_capacity", "busy_s")  # fmt: skip


def _nbytes(data: Any) -> int:
    if isinstance(data, Mapping):
        return sum(int(getattr(v, "nbytes", 0) or 0) for v in data.values())
    return int(getattr(data, "nbytes", 0) or 0)


def _group_samples(items: list[Batch]) -> int:
    """The samples of a group of batches from the order: its first batch's times the others
    but the last, plus the last (the order makes every batch full but an epoch's last, which
    ends its group). Two lengths instead of one per batch: a group of 64 batches of 32 small
    rows takes about 0.2 ms to gather, so a few microseconds count. The first group and every
    :data:`CHECK_EVERY`-th are summed and checked against this: a meter that finds a difference
    sums every group from then on."""
    return len(items[0].indices) * (len(items) - 1) + len(items[-1].indices)


def profiler_active() -> bool:
    """Whether PyTorch is imported and its profiler records now (torch is never imported).

    Examples
    --------
    >>> profiler_active() in (True, False)
    True
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except AttributeError:  # a torch without the flag: no ranges
        return False


class Meter(Node):
    """A node that times and counts another (see the module docstring); otherwise the same.

    It forwards ``reset``, ``get_state``, ``close`` and any other attribute (``upcoming``)
    to the node it wraps, and ``take`` where that node has one (an
    :class:`~feedline.loader.nodes.Order`).

    It holds no reference back to itself or to the prefetch node it feeds (a weak one):
    each epoch's pipeline is freed when the epoch ends, not at the next cyclic garbage
    collection (until then its batch buffers stayed: ~19 MB an epoch of 3 MB batches, enough
    to get a loader OOM-killed in a tight memory cgroup after some epochs).
    """

    def __init__(self, inner: Node, stats: StageStats, queue: Any = None) -> None:
        self.inner, self.stats = inner, stats
        self._busy_base = stats.busy_s
        self._watch_busy = hasattr(inner, "busy_s")
        # (the prefetch node this node feeds, weakly: it holds this node; its stats)
        self._queue = None if queue is None else (weakref.ref(queue[0]), queue[1])
        self._exact = False  # sum every group's samples (a group broke _group_samples' rule)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # during unpickling or before __init__: no recursion
            raise AttributeError(name)
        if name == "take" and hasattr(self.inner, "take"):  # metered (bound anew: no cycle)
            return self._take
        return getattr(self.inner, name)

    def _count(self, items: list[Batch], seconds: float) -> None:
        s = self.stats
        s.seconds += seconds
        s.calls = calls = s.calls + 1
        n = len(items)
        s.batches += n
        if n > 2 and not self._exact and calls & (CHECK_EVERY - 1) != 1:
            # a group is full batches but its last (see _group_samples)
            s.samples += len(items[0].indices) * (n - 1) + len(items[-1].indices)
        else:
            samples = sum(len(item.indices) for item in items)
            if n > 2 and not self._exact:  # the shortcut above would have counted this
                self._exact = samples != _group_samples(items)
            s.samples += samples
        if calls & (QUEUE_EVERY - 1) == 1 or self._watch_busy:  # BYTES_EVERY: a multiple
            self._rare(items)

    def _rare(self, items: list[Batch]) -> None:
        """The counts taken now and then: bytes, the prefetch queue, the workers' time."""
        s = self.stats
        if s.calls & (BYTES_EVERY - 1) == 1:  # the first call, then every 16th
            first = items[0]  # one batch of the group: the group's are alike
            s.sampled_bytes += _nbytes(first.data)
            s.sampled_samples += len(first.indices)
        queue = self._queue
        prefetch = None if queue is None else queue[0]()
        if queue is not None and prefetch is not None and s.calls & (QUEUE_EVERY - 1) == 1:
            stats = queue[1]
            stats.queue_sum += prefetch.occupancy()
            stats.queue_looks += 1
            depth = getattr(prefetch, "depth", 0)  # resized by prefetch="auto"
            stats.depth_of_queue, stats.queue_capacity = depth, stats.queue_capacity + depth
        if self._watch_busy:
            s.busy_s = self._busy_base + self.inner.busy_s  # type: ignore[attr-defined]
            s.workers = self.inner.workers.num_workers  # type: ignore[attr-defined]

    def next(self) -> Batch:
        start = time.perf_counter()
        try:
            item = self.inner.next()
        except StopIteration:
            self.stats.seconds += time.perf_counter() - start
            raise
        s = self.stats
        s.seconds += time.perf_counter() - start
        s.calls += 1
        s.batches += 1
        s.samples += len(item.indices)
        if s.calls & (QUEUE_EVERY - 1) == 1 or self._watch_busy:
            self._rare([item])
        return item

    def next_group(self) -> list[Batch]:
        start = time.perf_counter()
        try:
            items = self.inner.next_group()
        except StopIteration:
            self.stats.seconds += time.perf_counter() - start
            raise
        self._count(items, time.perf_counter() - start)
        return items

    def _take(self, count: int) -> tuple[list[Batch], Any]:
        start = time.perf_counter()
        try:
            batches, rows = self.inner.take(count)  # type: ignore[attr-defined]
        except StopIteration:
            self.stats.seconds += time.perf_counter() - start
            raise
        self._count(batches, time.perf_counter() - start)
        return batches, rows

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        self.inner.reset(initial_state)

    def get_state(self) -> dict[str, int]:
        return self.inner.get_state()

    def close(self) -> None:
        self.inner.close()


class RangedMeter(Meter):
    """A :class:`Meter` that also opens a ``torch.profiler.record_function`` range per call."""

    def __init__(self, inner: Node, stats: StageStats, queue: Any = None) -> None:
        super().__init__(inner, stats, queue)
        torch = sys.modules["torch"]
        self._range, self._label = torch.profiler.record_function, f"feedline.{stats.name}"

    def next(self) -> Batch:
        with self._range(self._label):
            return super().next()

    def next_group(self) -> list[Batch]:
        with self._range(self._label):
            return super().next_group()

    def _take(self, count: int) -> tuple[list[Batch], Any]:
        with self._range(self._label):
            return super()._take(count)


class StageMeters:
    """The stage counters of one loader, kept across its iterations.

    ``enabled = False`` leaves pipelines as they are (what ``bench/profile_overhead.py``
    compares against).
    """

    def __init__(self) -> None:
        self.enabled = True
        self.stages: dict[tuple[int, str], StageStats] = {}

    def reset(self) -> None:
        """Forget every count."""
        self.stages.clear()

    def since(self, before: dict[tuple[int, str], StageStats]) -> list[StageStats]:
        """The counts taken after ``before`` (a :meth:`snapshot`), stage by stage."""
        out = []
        for key, now in self.stages.items():
            old = before.get(key)
            if old is None:
                out.append(now)
                continue
            counts = {name: getattr(now, name) - getattr(old, name) for name in _COUNTS}
            out.append(replace(now, **counts))
        return out

    def snapshot(self) -> dict[tuple[int, str], StageStats]:
        """A copy of every stage's counts now (see :meth:`since`)."""
        return {key: replace(stats) for key, stats in self.stages.items()}

    def _stats(self, depth: int, node: Node, thread: str) -> StageStats:
        kind = type(node).__name__
        key = (depth, kind)
        stats = self.stages.get(key)
        if stats is None:
            stats = StageStats(STAGE_NAMES.get(kind, kind.lower()), kind, depth, thread)
            self.stages[key] = stats
        workers = getattr(node, "workers", None)
        if workers is not None:
            stats.workers, stats.worker_type = workers.num_workers, workers.kind
        queue_depth = getattr(node, "depth", None)
        if isinstance(queue_depth, int) and hasattr(node, "occupancy"):
            stats.depth_of_queue = queue_depth
        return stats

    def instrument(self, node: Node) -> Node:
        """``node`` with a meter around it and around each node before it (its sources).

        Nodes before a :class:`~feedline.loader.nodes.Prefetch` run in its thread
        (``thread="prefetch"``); the others in the training loop's (``"loop"``).
        """
        if not self.enabled:
            return node
        meter = RangedMeter if profiler_active() else Meter
        thread, depth, queue = "loop", 0, None
        current: Node = node
        parent: Stage | None = None
        while True:
            stats = self._stats(depth, current, thread)
            if parent is None:  # the loop's own clock times the top node (loader.timeline)
                stats.from_loop = True
            else:
                parent.source = meter(current, stats, queue)
            if not isinstance(current, Stage):
                break
            occupancy = getattr(current, "occupancy", None)
            queue = None if occupancy is None else (current, stats)
            if occupancy is not None:  # a prefetching node: its sources run apart
                thread = "prefetch"
            parent, current, depth = current, current.source, depth + 1
        return node
