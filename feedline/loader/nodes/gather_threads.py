"""A group's gather split across a few threads: whole batches per thread, one array each.

A window batch is gathered by indexing a strided view of every window with the windows'
start rows (:mod:`feedline.loader.data.windows`). NumPy releases the GIL for that copy (fancy
indexing of a numeric array), so two threads gathering two batches copy at once. Measured
on this project's 2-core machine: during one 164 ms fancy-index copy of 40,000 windows
another Python thread kept running (its longest pause 25 ms, the loaded machine's
scheduling, not 164 ms); ``np.take`` into ``out=`` releases it too (but copies row by row,
1.4x slower). A loop of per-window slice copies runs Python between 3 KB copies: it holds
the GIL most of the time, so it cannot run in parallel.

Each thread gathers whole batches into fresh arrays (no shared output, no second copy); the
batches stay views of their thread's arrays, in order, bit-identical to one thread's.

A split pays only where a CPU is idle, and only for parts large enough that the hand-overs
(each a GIL round trip, worth a few hundred microseconds when another thread is running Python)
are few. Measured on this project's 2-core VM (``bench/window_groups.py``: case W, windows of
96 + 8 rows of 8 float32, batch 256, the loader prefetching, 3 x 3,000 batches, the loop
having run a torch op): groups
of ~1 MiB (two batches, one a thread) gave 0.92-1.10M windows/s split against 1.36-1.60M on one
thread; groups of ~8 MiB (nine batches) gave **2.29-2.36M** split (4 MiB: 1.32-1.98M; 16 MiB:
2.00-2.27M). So a loader whose gathers can be split gathers groups of about
:data:`~feedline.loader.pipeline.SPLIT_GROUP_BYTES` (see
:func:`~feedline.loader.pipeline.group_size`), and the automatic count (:func:`auto_threads`)
splits while the machine has a CPU to spare: the CPUs left idle over the last
:data:`CHECK_S` seconds (``/proc/stat``), plus what the pool's own threads used, must give
each extra thread :data:`HELPER_NEED` of a CPU. A prefetching loader's training loop mostly
waits, so on 2 idle CPUs its prefetch thread and one more gather thread fit; a loop computing
on both CPUs, or another busy process, keeps it at one. (The 1-minute load average, used
before, lags by a minute: the bench's back-to-back runs split or not by chance, 1.22-2.37M.)
At most :data:`MAX_GATHER_THREADS`: on a 16-core host four threads gathering one batch each
ran 3.4x slower than one (the raw ceiling of ``bench/loader.py --case W``: 477k against
1.62M windows/s).

:class:`GatherThreads` is the small persistent pool: started on first use, its threads
named ``feedline-gather``, joined by :meth:`GatherThreads.close` (the :class:`~feedline.
loader.nodes.Gather` node closes it with itself, at the end of every loop, break included).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from feedline.host import cpus_available

__all__ = [
    "CHECK_S",
    "FIRST_CHECK_S",
    "HELPER_NEED",
    "MAX_GATHER_THREADS",
    "MIN_PART_BYTES",
    "GatherThreads",
    "auto_threads",
    "batch_cuts",
    "cpu_ticks",
    "gather_threads",
]  # fmt: skip

#: most threads a group's gather is split across (the copy is memory bound beyond a few)
MAX_GATHER_THREADS = 2
#: least bytes a thread's part gathers: a hand-over to a thread costs tens of microseconds
MIN_PART_BYTES = 256 << 10
#: seconds between two looks at the machine's idle CPU time (automatic thread count)
CHECK_S = 0.25
#: seconds before the first look (clock ticks are 10 ms: 20 ticks on 2 CPUs)
FIRST_CHECK_S = 0.1
#: idle CPU an extra gather thread needs (its own use counted as idle: see auto_threads)
HELPER_NEED = 0.75

T = TypeVar("T")


def gather_threads() -> int:
    """Threads to split a group's gather across: the CPUs this process may use
    (:func:`~feedline.host.cpus_available`: its affinity, within its cgroup's CPU quota), at
    most :data:`MAX_GATHER_THREADS`.

    Examples
    --------
    >>> 1 <= gather_threads() <= MAX_GATHER_THREADS
    True
    """
    return max(1, min(MAX_GATHER_THREADS, cpus_available()))


def cpu_ticks() -> tuple[int, int] | None:
    """``(idle, total)`` clock ticks of all CPUs since boot (``/proc/stat``); ``None`` where
    there is no such file (not Linux).

    Examples
    --------
    >>> ticks = cpu_ticks()
    >>> ticks is None or 0 <= ticks[0] <= ticks[1]
    True
    """
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)  # idle + iowait


def auto_threads(idle_cpus: float | None, helpers_busy: float = 0.0) -> int:
    """:func:`gather_threads` while the machine has CPU to spare for the extra threads, else 1.

    ``idle_cpus`` is the CPUs left idle lately (``None``: unknown), ``helpers_busy`` the
    CPUs the pool's own threads used meanwhile (idle but for the split itself). Each extra
    thread needs :data:`HELPER_NEED` of a CPU from them.

    Examples
    --------
    >>> auto_threads(0.0)  # every CPU busy
    1
    >>> auto_threads(None)  # unknown: no split
    1
    """
    most = gather_threads()
    if idle_cpus is None:
        return 1
    return most if idle_cpus + helpers_busy >= (most - 1) * HELPER_NEED else 1


def batch_cuts(sizes: Sequence[int], parts: int, row_bytes: int) -> list[int]:
    """Batch numbers where a group of batches of ``sizes`` rows is cut into parts.

    At most ``parts`` parts, each of whole batches and at least :data:`MIN_PART_BYTES`
    (``row_bytes`` a row), as even in rows as batch boundaries allow. Returns the cut
    points, ``0`` first and ``len(sizes)`` last (``[0, len(sizes)]``: one part).

    Examples
    --------
    >>> batch_cuts([256, 256, 256, 256], 2, row_bytes=4096)
    [0, 2, 4]
    >>> batch_cuts([256, 256, 100], 4, row_bytes=4096)
    [0, 1, 2, 3]
    >>> batch_cuts([256, 256], 2, row_bytes=8)  # 2 KiB a batch: not worth a thread
    [0, 2]
    """
    total = int(sum(sizes))
    parts = min(parts, len(sizes), total * row_bytes // MIN_PART_BYTES)
    if parts <= 1:
        return [0, len(sizes)]
    ends = np.cumsum(sizes)
    targets = total * np.arange(1, parts) / parts
    cuts = np.searchsorted(ends, targets, side="left") + 1  # the batch holding each target
    return sorted({0, *(min(int(c), len(sizes)) for c in cuts), len(sizes)})


class GatherThreads:
    """A persistent pool of ``threads - 1`` threads; the caller's thread does one part too.

    ``threads=None``: :func:`auto_threads`, first looked at :data:`FIRST_CHECK_S` after the
    pool is made (one thread until then), then at most every :data:`CHECK_S`.

    Examples
    --------
    >>> with GatherThreads(2) as pool:
    ...     pool.map(lambda x: x * 10, [1, 2, 3])
    [10, 20, 30]
    """

    def __init__(self, threads: int | None) -> None:
        self._fixed = None if threads is None else max(1, int(threads))
        # (when, the machine's (idle, total) CPU ticks then, the pool threads' CPU time then)
        self._auto, self._checked = 1, (time.monotonic(), cpu_ticks(), 0.0)
        self._interval = FIRST_CHECK_S
        self._finalizing = sys.is_finalizing  # held: usable while the interpreter exits
        #: CPU seconds the pool's threads spent on parts (approximate: unlocked adds)
        self._helper_cpu = 0.0
        self._executor: ThreadPoolExecutor | None = None

    @property
    def threads(self) -> int:
        """Threads the next group is split across."""
        if self._fixed is not None:
            return self._fixed
        now, (then, ticks_then, helpers_then) = time.monotonic(), self._checked
        if now - then >= min(self._interval, CHECK_S):
            ticks, helpers = cpu_ticks(), self._helper_cpu
            idle = None
            if ticks is not None and ticks_then is not None and ticks[1] > ticks_then[1]:
                cpus = os.cpu_count() or 1
                idle = cpus * (ticks[0] - ticks_then[0]) / (ticks[1] - ticks_then[1])
            self._auto = auto_threads(idle, (helpers - helpers_then) / (now - then))
            self._checked, self._interval = (now, ticks, helpers), CHECK_S
        return self._auto

    def _timed(self, fn: Callable[[int], T], x: int) -> T:
        """``fn(x)`` in a pool thread, its CPU time counted in ``_helper_cpu``."""
        start = time.thread_time()
        try:
            return fn(x)
        finally:
            self._helper_cpu += time.thread_time() - start

    def map(self, fn: Callable[[int], T], items: Sequence[int]) -> list[T]:
        """``[fn(x) for x in items]``, the first in this thread, the rest in the pool.

        Every part is finished before this returns or raises; an exception (the first in
        ``items`` order) reaches the caller as the same object, its traceback intact.
        """
        if len(items) <= 1:
            return [fn(x) for x in items]
        if self._executor is None:  # sized for the most threads an automatic count may give
            most = self._fixed if self._fixed is not None else gather_threads()
            self._executor = ThreadPoolExecutor(max(1, most - 1), "feedline-gather")
        futures: list[Future[T]] = [self._executor.submit(self._timed, fn, x) for x in items[1:]]
        try:
            first = fn(items[0])
        finally:
            for future in futures:  # never leave a part running behind the caller's back
                future.exception()
        return [first, *(f.result() for f in futures)]

    def close(self) -> None:
        """Stop and join the threads (a later :meth:`map` starts new ones)."""
        executor, self._executor = self._executor, None
        # at interpreter exit (a loop broken off and never closed) the executor's own exit
        # hook has already stopped its threads, and module globals may be gone (None)
        if executor is not None and not self._finalizing():
            executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GatherThreads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
