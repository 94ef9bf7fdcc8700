"""``num_workers="auto"`` and ``prefetch="auto"``: the loader picks them while it runs.

The :class:`Autotuner` watches the training loop take batches (how long it waited for each)
and the pipeline's meters (the transform workers' busy time, the time the prefetch thread was
blocked on a full queue), in windows of at least :data:`WINDOW_BATCHES` batches and
:data:`WINDOW_S` seconds, and changes one knob at a time:

1. **Start** with 1 worker and a prefetch of 2 (without a transform, small batches travel in
   groups: one group ready; the prefetch counts hand-overs of ``batches_per_prefetch``
   batches) (the first window of each iteration is left
   out: it holds the start, workers starting and the cache filling; so are the first
   :data:`SETTLE_BATCHES` batches and :data:`SETTLE_S` seconds after each change, and the
   batches until every worker process has sent a chunk back: a new one imports the
   transform's module first).
2. **Add a worker** when the loop waited more than :data:`WAIT` of the window, the workers
   were busy (more than :data:`BUSY` of their time: they are the bound, not the queue), a CPU
   is left (never more workers than :func:`~feedline.host.cpus_available`: the CPUs this
   process may run on, within its cgroup's ``cpu.max``) and, for processes, memory is left
   (:data:`PROCESS_BYTES` of :func:`~feedline.host.memory_available` per new one). The
   worker is a trial: once settled, its throughput (batches/s at the loop, over a window
   :data:`TRIAL_WINDOWS` times as long) must beat the throughput before it (over the last
   :data:`BASE_WINDOWS` windows, at least two: one window on a shared machine is noisy) by
   more than :data:`GAIN`, else the worker is removed again (a thread transform that holds
   the GIL, a machine whose CPUs others use) and no worker is tried again for
   :data:`RETRY_WINDOWS` windows.
3. **Deepen the prefetch** (doubling, at most :data:`MAX_PREFETCH`) when the loop waited
   more than :data:`WAIT` although the prefetch thread was blocked on a full queue for more
   than :data:`BLOCKED` of the window: batches are made fast enough on average but unevenly
   (slow samples, epoch starts), which a deeper queue absorbs. The queue and the batches in
   flight in the workers stay within half of what ``memory_budget`` leaves beside the cache
   (measured batch bytes); a depth over that is lowered.
4. **Remove a worker** when the loop did not wait and the workers' busy time would fit in
   one worker fewer with half a worker to spare (the training step got slower: free a CPU
   for it).

What autotuning changes is *how many* workers and *how many* batches ready, never *which*
batches: the order is a pure function of ``(seed, epoch, rank)``, each sample's random
generator of ``(seed, epoch, row index)``, and the workers' results come back in submission
order, so the batches, their order and ``state_dict()`` are those of any fixed setting
(``tests/loader/test_autotune.py`` compares them). Its decisions are in
``loader.stats()["autotune"]`` and ``loader.profile().autotune``.

Examples
--------
>>> tuner = Autotuner(workers=True, prefetch=True, worker_type="thread", max_workers=4)
>>> tuner.num_workers, tuner.prefetch
(1, 2)
>>> tuner.report()["num_workers"], tuner.report()["history"]
(1, [])
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from feedline.host import cpus_available, memory_available
from feedline.loader.nodes.map import Map
from feedline.loader.nodes.node import Batch, Node, Stage
from feedline.loader.nodes.prefetch import Prefetch

__all__ = [
    "BASE_WINDOWS",
    "BLOCKED",
    "BUSY",
    "GAIN",
    "MAX_PREFETCH",
    "MAX_WORKERS",
    "PROCESS_BYTES",
    "RETRY_WINDOWS",
    "SETTLE_BATCHES",
    "SETTLE_S",
    "TRIAL_WINDOWS",
    "WAIT",
    "WINDOW_BATCHES",
    "WINDOW_S",
    "Autotuner",
    "Decision",
]

#: least batches of a measuring window
WINDOW_BATCHES = 16
#: least seconds of a measuring window (fast pipelines: windows of more batches)
WINDOW_S = 0.5
#: batches left out after a change (new workers starting, the queue filling)...
SETTLE_BATCHES = 8
#: ...and at least these seconds
SETTLE_S = 0.25
#: share of a window the loop waited for data above which the data is the bound
WAIT = 0.05
#: share of their time the workers must have been busy for another worker to be tried
BUSY = 0.5
#: windows (at most) whose throughput a trial is compared with; a trial runs this many less one
BASE_WINDOWS = 3
TRIAL_WINDOWS = BASE_WINDOWS - 1
#: throughput gain a tried worker must bring to stay
GAIN = 0.10
#: share of a window the prefetch thread was blocked on a full queue that says it has headroom
BLOCKED = 0.10
#: windows after a failed worker trial before another is tried
RETRY_WINDOWS = 32
#: most batches (hand-overs) the prefetch queue grows to
MAX_PREFETCH = 32
#: most workers, whatever the CPU count
MAX_WORKERS = 64
#: memory a new worker process needs free (``memory_available``) to be started
PROCESS_BYTES = 256 << 20
#: batches the workers hold in flight besides the queue (Map keeps two batches' chunks)
IN_FLIGHT = 2


@dataclass(frozen=True)
class Decision:
    """One change the tuner made: after ``batch`` batches (counted from the loader's first),
    ``knob`` went from ``old`` to ``new``, for ``reason`` (with the window's numbers)."""

    batch: int
    knob: str
    old: int
    new: int
    reason: str


def _nbytes(data: Any) -> int:
    if isinstance(data, Mapping):
        return sum(int(getattr(v, "nbytes", 0) or 0) for v in data.values())
    return int(getattr(data, "nbytes", 0) or 0)


class Autotuner:
    """Picks the transform's worker count and the prefetch depth while the loader runs.

    Parameters
    ----------
    workers, prefetch:
        Which knobs are ``"auto"``.
    worker_type:
        ``"thread"`` or ``"process"`` (processes need memory: :data:`PROCESS_BYTES`).
    max_workers:
        Most workers (default: :func:`~feedline.host.cpus_available`, at most
        :data:`MAX_WORKERS`).
    start_prefetch:
        The prefetch until a pipeline is attached; then the pipeline's own depth (hand-overs:
        small batches without a transform travel in groups, one group ready at a time).
    room_bytes:
        Bytes the prefetch queue and the batches in flight may hold together (``None``: no
        limit); the :class:`~feedline.loader.Loader` passes half of ``memory_budget`` less
        its cache.

    The loader calls :meth:`attach` with each new pipeline and :meth:`batch` for each batch
    its loop takes; see the module docstring for the policy.
    """

    def __init__(self, *, workers: bool, prefetch: bool, worker_type: str = "thread",
                 max_workers: int | None = None, room_bytes: int | None = None,
                 start_prefetch: int = 2) -> None:  # fmt: skip
        self.tune_workers, self.tune_prefetch = bool(workers), bool(prefetch)
        self.worker_type = worker_type
        cpus = cpus_available() if max_workers is None else int(max_workers)
        self.max_workers = max(1, min(MAX_WORKERS, cpus))
        self.room_bytes = room_bytes
        self.num_workers = 1
        self.prefetch = max(1, int(start_prefetch))
        self.max_prefetch = MAX_PREFETCH
        self.history: list[Decision] = []
        self.group = 1  # batches per hand-over of the prefetch queue
        self._adopt = True  # take the first pipeline's prefetch depth as the start
        self.batches = 0  # taken by the loop, every iteration together
        self.batch_bytes = 0  # of the last batch measured
        self._map: Map | None = None
        self._queue: Prefetch | None = None
        self._skip = SETTLE_BATCHES  # batches to leave out before the next window
        self._changed = time.perf_counter()  # when the last change (or attach) was
        self._trial: tuple[float, int] | None = None  # (rate before, workers before)
        self._recent: list[tuple[int, float]] = []  # (batches, seconds) at the current values
        self._windows = 0
        self._retry_at = 0
        self._start()

    # ------------------------------------------------------------------ the loader's calls

    def attach(self, top: Node) -> None:
        """Tune the pipeline ``top`` from now on: find its transform and prefetch nodes and
        give them the current values (a new iteration's first batches are left out)."""
        self._map = self._queue = None
        node: Any = top
        while node is not None:
            if isinstance(node, Map) and self._map is None:
                self._map = node
            elif isinstance(node, Prefetch) and self._queue is None:
                self._queue = node
            node = node.source if isinstance(node, Stage) else None
        if self._map is not None and self.tune_workers:
            self._map.workers.resize(self.num_workers)
        if self._queue is not None and self.tune_prefetch:
            if self._adopt:  # the pipeline's own start (1 group of small batches, else 2)
                self.prefetch, self._adopt = self._queue.depth, False
            self._queue.resize(self.prefetch)
            self.group = self._queue.group
        self._trial, self._skip, self._recent = None, SETTLE_BATCHES, []
        self._changed = time.perf_counter()
        self._start()

    def batch(self, wait_s: float, now: float, item: Batch) -> None:
        """The loop took ``item`` at ``now`` (``time.perf_counter``) after waiting ``wait_s``."""
        self.batches += 1
        if self._skip:
            self._skip -= 1
            if self._skip or now - self._changed < SETTLE_S or not self._ready():
                self._skip = max(1, self._skip)
                return
            self._skip = 0
            self._start(now)
            return
        self._count += 1
        self._wait += wait_s
        span = 1 if self._trial is None else TRIAL_WINDOWS  # a trial is measured longer
        if self._count >= WINDOW_BATCHES * span and now - self._t0 >= WINDOW_S * span:
            self.batch_bytes = _nbytes(item.data) * (self._queue.group if self._queue else 1)
            self._decide(now)

    def report(self) -> dict[str, Any]:
        """What ``stats()["autotune"]`` shows: the values now, their bounds and the history."""
        return {
            "num_workers": self.num_workers if self.tune_workers else None,
            "prefetch": self.prefetch if self.tune_prefetch else None,
            "batches_per_prefetch": self.group,
            "max_workers": self.max_workers,
            "max_prefetch": self._prefetch_bound(),
            "batch_bytes": self.batch_bytes,
            "batches_seen": self.batches,
            "history": [asdict(d) for d in self.history],
        }

    # ------------------------------------------------------------------ the policy

    def _start(self, now: float | None = None) -> None:
        """Open a window: the counts from ``now``."""
        self._t0 = time.perf_counter() if now is None else now
        self._count, self._wait = 0, 0.0
        self._busy0 = self._map.busy_s if self._map is not None else 0.0
        self._blocked0 = self._queue.blocked_s if self._queue is not None else 0.0

    def _change(self, knob: str, new: int, reason: str) -> None:
        old = self.num_workers if knob == "num_workers" else self.prefetch
        self.history.append(Decision(self.batches, knob, old, new, reason))
        if knob == "num_workers":
            self.num_workers = new
            if self._map is not None:
                self._map.workers.resize(new)
        else:
            self.prefetch = new
            if self._queue is not None:
                self._queue.resize(new)
        self._skip, self._changed = SETTLE_BATCHES, time.perf_counter()
        self._recent = []

    def _prefetch_bound(self) -> int:
        """Most hand-overs the queue may hold within ``room_bytes`` (measured batch bytes)."""
        if self.room_bytes is None or not self.batch_bytes:
            return self.max_prefetch
        fit = self.room_bytes // self.batch_bytes - IN_FLIGHT
        return max(1, min(self.max_prefetch, fit))

    def _decide(self, now: float) -> None:
        seconds = max(now - self._t0, 1e-9)
        rate = self._count / seconds
        wait = self._wait / seconds
        n = self.num_workers
        busy = (self._map.busy_s - self._busy0) / seconds if self._map is not None else 0.0
        blocked = (self._queue.blocked_s - self._blocked0) / seconds if self._queue else 0.0
        self._windows += 1
        numbers = (f"{rate:,.1f} batches/s, loop waited {wait:.0%}, workers busy "
                   f"{busy / max(1, n):.0%}, queue full {blocked:.0%}")  # fmt: skip
        trial, self._trial = self._trial, None
        self._recent = [*self._recent[1 - BASE_WINDOWS :], (self._count, seconds)]
        bound = self._prefetch_bound()
        if self.tune_prefetch and self.prefetch > bound:
            self._change("prefetch", bound,
                         f"the memory budget holds {bound} batches of {self.batch_bytes:,} "
                         f"bytes beside those in flight")  # fmt: skip
            return self._start(now)
        if trial is not None:  # this window ran with the worker tried
            before, old = trial
            if rate > before * (1 + GAIN):
                kept = f"kept: {rate / before:.2f}x ({numbers})"
                self.history.append(Decision(self.batches, "num_workers", n, n, kept))
            else:
                self._retry_at = self._windows + RETRY_WINDOWS
                self._change("num_workers", old,
                             f"the worker added gave {rate / before:.2f}x, not over "
                             f"{1 + GAIN:.2f}x ({numbers})")  # fmt: skip
                return self._start(now)
        waits = wait > WAIT
        measured = len(self._recent) >= BASE_WINDOWS - 1  # a base to compare a trial with
        if (self.tune_workers and waits and self._map is not None and busy >= BUSY * n
                and n < self.max_workers and self._windows >= self._retry_at and measured
                and self._memory_for_worker()):  # fmt: skip
            batches, spent = map(sum, zip(*self._recent, strict=True))
            base = batches / spent  # the throughput now, over the last windows
            self._change("num_workers", n + 1, f"trying one more over {base:,.1f} batches/s: "
                         f"{numbers}")  # fmt: skip
            self._trial = (base, n)
        elif self.tune_prefetch and waits and self._queue is not None and blocked > BLOCKED \
                and self.prefetch < bound:  # fmt: skip
            self._change("prefetch", min(bound, 2 * self.prefetch),
                         f"uneven batches: {numbers}")  # fmt: skip
        elif self.tune_workers and n > 1 and not waits and busy <= n - 1.5:
            self._change("num_workers", n - 1, f"workers idle: {numbers}")
        self._start(now)

    def _ready(self) -> bool:
        """Whether the workers have started (a new process takes a while: it imports the
        transform's module) and so may be measured."""
        return self._map is None or getattr(self._map.workers, "ready", True)

    def _memory_for_worker(self) -> bool:
        return self.worker_type != "process" or memory_available() >= PROCESS_BYTES
