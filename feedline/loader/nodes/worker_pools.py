"""Worker pools for :class:`~feedline.loader.nodes.Map`: threads or processes, started once.

Both take chunks of a batch (:meth:`submit`) and hand back :class:`~feedline.loader.nodes.
worker.Chunk` results through a :class:`Pending` (its :meth:`~Pending.result` blocks); the
caller asks for results in submission order, so the output order never depends on timing.

- :class:`ThreadWorkers`: ``num_workers`` daemon threads (GIL-releasing work: Pillow decode,
  NumPy, tokenizers). An exception reaches the caller as the same object, traceback intact.
  Each chunk's samples are stacked straight into the batch's arrays (a
  :class:`~feedline.loader.nodes.samples.Stacker`), so joining a batch's chunks copies
  nothing.
- :class:`~feedline.loader.nodes.process_pool.ProcessWorkers`: ``num_workers`` processes
  (``forkserver``, or ``spawn`` where there is none), each with a pipe that carries only
  small messages: the inputs (row indices, numeric columns, and the pickle of object
  columns such as encoded bytes) and the outputs (stacked arrays; lists and skip markers
  pickled) travel through shared memory (:mod:`feedline.loader.nodes.shm`). The transform
  is pickled once, when the workers start (so it must be importable: a module-level
  function or an instance of a module-level class). An exception in a worker comes back
  with its traceback text; a worker that dies (killed, crashed) raises
  :class:`~feedline.errors.UserFunctionError` and the pool starts afresh on next use. The
  processes end on ``close()``, when the pool is garbage collected, or at interpreter exit.

``timeout`` (seconds, ``None``: no limit) bounds one call of the transform: one sample, or one
batch with ``batched=True``. Every worker reports the call it is running
(:class:`~feedline.loader.nodes.progress.Progress`); while the loader waits for a result it
checks them, and a call running longer raises :class:`~feedline.errors.UserFunctionError`
naming the sample's row index (the batch's, batched) and epoch. A stuck worker process is
killed and the pool restarts on the next iteration. A thread cannot be stopped: it is
abandoned (a daemon thread, so it never holds up the interpreter's exit), a new thread takes
its place, and the stuck call keeps its CPU and memory until it returns, when its result is
dropped and the thread ends.

:meth:`~ThreadWorkers.resize` changes the number of workers between chunks (what
``num_workers="auto"`` does, :mod:`feedline.loader.profiling.autotune`): threads are started
or told to end once their current chunk is done; processes are started (in the thread that
submits the next chunk) or parked (given no more chunks; they stay alive, idle, until
:meth:`close`, and are used again first when the count grows). Which worker runs a chunk never
changes what it computes: a sample's generator depends on ``(seed, epoch, row index)`` only.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, UserFunctionError
from feedline.loader.checks import checked_int
from feedline.loader.nodes.process_pool import ProcessWorkers
from feedline.loader.nodes.progress import Progress, stuck_message
from feedline.loader.nodes.samples import Stacker, takes_index
from feedline.loader.nodes.worker_task import Chunk, Pending, run_chunk

__all__ = [
    "WORKER_TYPES",
    "InlineWorkers",
    "ThreadWorkers",
    "check_timeout",
    "check_workers",
    "make_workers",
]

WORKER_TYPES = ("thread", "process")
#: longest wait between two looks at the workers' progress while a timeout is set
POLL_S = 0.1


class _Done(Pending):
    def __init__(self, chunk: Chunk | None = None, error: BaseException | None = None) -> None:
        self._chunk, self._error = chunk, error

    def result(self) -> Chunk:
        if self._error is not None:
            raise self._error
        assert self._chunk is not None
        return self._chunk


class InlineWorkers:
    """No workers: each chunk runs in the calling thread."""

    kind, num_workers = "inline", 0

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.with_index = fn, takes_index(fn)
        #: seconds one call may run (see the module docstring); inline: no limit
        self.timeout: float | None = None

    def submit(self, columns: Mapping[str, Any], indices: np.ndarray, *, batched: bool,
               seed: int, epoch: int,
               into: tuple[Stacker, int] | None = None) -> Pending:  # fmt: skip
        try:
            return _Done(run_chunk(self.fn, columns, indices, batched=batched, seed=seed,
                                   epoch=epoch, with_index=self.with_index, into=into))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - raised from result(), in order
            return _Done(error=exc)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (none: no processes)."""
        return []

    def start(self) -> None:
        """Start the workers now (they start on first use otherwise)."""

    def resize(self, num_workers: int) -> None:
        """Use ``num_workers`` workers from the next chunk on (inline: always none)."""

    def close(self) -> None:
        """Stop the workers (a later :meth:`submit` starts new ones)."""


@dataclass(eq=False)
class _Job:
    """One chunk for a thread: its arguments and its future."""

    task: int
    columns: Mapping[str, Any]
    indices: np.ndarray
    batched: bool
    seed: int
    epoch: int
    into: tuple[Stacker, int] | None
    future: Future = field(default_factory=Future)


@dataclass(eq=False)
class _Thread:
    """A worker thread, what it runs and whether the pool gave up on it."""

    number: int
    progress: Progress = field(default_factory=Progress)
    job: _Job | None = None
    abandoned: bool = False
    thread: threading.Thread | None = None


class _ThreadTask(Pending):
    def __init__(self, pool: ThreadWorkers, job: _Job) -> None:
        self.pool, self.job = pool, job

    def result(self) -> Chunk:
        future, pool = self.job.future, self.pool
        if pool.timeout is None:
            return future.result()
        wait = min(POLL_S, pool.timeout / 4)
        while True:
            try:
                return future.result(timeout=wait)
            except FutureTimeout:
                pool.reap()

    def abandon(self) -> None:
        self.job.future.cancel()  # a chunk not started yet never runs


class ThreadWorkers(InlineWorkers):
    """``num_workers`` daemon threads, started on first use and kept until :meth:`close`
    (see the module docstring for ``timeout``)."""

    kind = "thread"

    def __init__(self, fn: Callable[..., Any], num_workers: int,
                 timeout: float | None = None) -> None:  # fmt: skip
        super().__init__(fn)
        self.num_workers, self.timeout = int(num_workers), timeout
        self.fn_name = getattr(fn, "__qualname__", None) or type(fn).__name__
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[_Thread] = []
        self._lock = threading.Lock()
        self._started = 0
        self._next_task = 0
        self._retiring = 0  # threads told to end (resize) that have not yet
        #: threads given up on (stuck past the timeout), kept to be told apart in tests
        self.abandoned: list[threading.Thread] = []

    def _spawn(self) -> _Thread:
        worker = _Thread(self._started)
        self._started += 1
        name = f"feedline-map-{worker.number}"
        worker.thread = threading.Thread(target=self._loop, args=(worker, self._queue),
                                         daemon=True, name=name)  # fmt: skip
        worker.thread.start()
        return worker

    def start(self) -> None:
        with self._lock:
            while len(self._threads) < self.num_workers:
                self._threads.append(self._spawn())

    def resize(self, num_workers: int) -> None:
        """Run ``num_workers`` threads: more start at the next :meth:`submit`; each one too
        many ends when it takes its next job (after the chunks queued before it).

        Examples
        --------
        >>> pool = ThreadWorkers(lambda s, rng: s, 1)
        >>> pool.resize(3)
        >>> pool.num_workers
        3
        >>> pool.close()
        """
        n = max(1, int(num_workers))
        with self._lock:
            for _ in range(len(self._threads) - n - self._retiring):
                self._queue.put(None)  # the thread that takes it ends
                self._retiring += 1
            self.num_workers = n

    def submit(self, columns: Mapping[str, Any], indices: np.ndarray, *, batched: bool,
               seed: int, epoch: int,
               into: tuple[Stacker, int] | None = None) -> Pending:  # fmt: skip
        self.start()
        job = _Job(self._next_task, columns, indices, batched, seed, epoch, into)
        self._next_task += 1
        self._queue.put(job)
        return _ThreadTask(self, job)

    def _loop(self, worker: _Thread, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = jobs.get()
            if job is None or not job.future.set_running_or_notify_cancel():
                if job is None:
                    self._retire(worker)
                    return
                continue
            worker.job = job
            outcome: Chunk | BaseException
            try:
                outcome = run_chunk(
                    self.fn, job.columns, job.indices, batched=job.batched, seed=job.seed,
                    epoch=job.epoch, with_index=self.with_index, progress=worker.progress,
                    task=job.task, into=job.into,
                )  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 - handed to the caller by the future
                outcome = exc
            with self._lock:
                worker.job = None
                if worker.abandoned:  # the pool gave up on this call: drop it, end the thread
                    return
                try:
                    if isinstance(outcome, BaseException):
                        job.future.set_exception(outcome)
                    else:
                        job.future.set_result(outcome)
                except InvalidStateError:  # pragma: no cover - set once, under the lock
                    pass
            del outcome, job

    def _retire(self, worker: _Thread) -> None:
        """A thread ends: out of the pool's list when :meth:`resize` told it to."""
        with self._lock:
            if worker in self._threads:  # else close() took the list (or reap replaced it)
                self._threads.remove(worker)
                self._retiring = max(0, self._retiring - 1)

    def reap(self) -> None:
        """Give up on every thread whose call has run past the timeout: its chunk fails
        with a :class:`~feedline.errors.UserFunctionError`, a new thread takes its place."""
        if self.timeout is None:
            return
        now = time.monotonic()
        with self._lock:
            for k, worker in enumerate(self._threads):
                running, job = worker.progress.running(), worker.job
                if running is None or job is None or running[0] != job.task:
                    continue
                seconds = now - running[2]
                if seconds <= self.timeout:
                    continue
                worker.abandoned = True
                assert worker.thread is not None
                self.abandoned.append(worker.thread)
                self._threads[k] = self._spawn()
                error = UserFunctionError(
                    stuck_message(self.fn_name, self.timeout, seconds, job.indices, running[1],
                                  job.batched, job.epoch, f"worker thread {worker.number}")
                    + " The thread cannot be stopped: it is abandoned (it keeps running, as a "
                    "daemon thread, until the call returns; its result is dropped) and a new "
                    "thread replaces it. Fix: find why the transform hangs on it (call it on "
                    "that sample alone, e.g. with num_workers=0), make it give up by itself, "
                    "or raise timeout= if it is only slow."
                )  # fmt: skip
                if not job.future.done():
                    job.future.set_exception(error)

    def close(self) -> None:
        """Stop the threads: chunks not started are cancelled, running ones finish (a
        thread still running after the timeout is abandoned)."""
        with self._lock:
            threads, self._threads = self._threads, []
            jobs, self._queue = self._queue, queue.SimpleQueue()  # new threads, new queue
            self._retiring = 0
        while True:  # the chunks still queued never start
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.cancel()
        for _ in threads:
            jobs.put(None)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for worker in threads:
            assert worker.thread is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            worker.thread.join(left)
            if worker.thread.is_alive():
                worker.abandoned = True
                self.abandoned.append(worker.thread)


def make_workers(
    fn: Callable[..., Any], num_workers: int | str, worker_type: str,
    timeout: float | None = None,
) -> Any:  # fmt: skip
    """The pool for ``Map``: inline (0 workers), threads or processes (``"auto"``: one, for
    :mod:`~feedline.loader.profiling.autotune` to :meth:`~ThreadWorkers.resize`).

    ``timeout``: seconds one call of ``fn`` may run (see the module docstring); it needs
    workers (:func:`check_timeout`).

    Examples
    --------
    >>> make_workers(lambda s, rng: s, 0, "thread").kind
    'inline'
    >>> make_workers(lambda s, rng: s, 2, "thread", timeout=30).timeout
    30.0
    """
    checked = check_workers(num_workers, worker_type)
    num_workers = 1 if checked == "auto" else int(checked)  # "auto" starts with one
    timeout = check_timeout(timeout, num_workers)
    if num_workers == 0:
        return InlineWorkers(fn)
    if worker_type == "thread":
        return ThreadWorkers(fn, num_workers, timeout)

    return ProcessWorkers(fn, num_workers, timeout)


def check_timeout(timeout: Any, num_workers: int) -> float | None:
    """``timeout`` as a float > 0 (or ``None``: no limit), given ``num_workers`` >= 1;
    else :class:`~feedline.errors.ConfigurationError` saying what to pass.

    Examples
    --------
    >>> check_timeout(2, 1), check_timeout(None, 0)
    (2.0, None)
    >>> check_timeout(5, 0)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: timeout=5 needs worker threads or processes: ...
    """
    if timeout is None:
        return None
    ok = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if not ok or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigurationError(
            f"timeout={timeout!r} must be a number of seconds > 0 (or None: no limit). Fix: "
            "e.g. timeout=60, the longest one call of the transform (one sample; one batch "
            "with batched=True) may run."
        )
    if num_workers == 0:
        raise ConfigurationError(
            f"timeout={timeout!r} needs worker threads or processes: with num_workers=0 the "
            "transform runs in the loader's own thread, which nothing can stop or abandon. "
            "Fix: pass num_workers=1 (or more) with the timeout, or no timeout."
        )
    return float(timeout)


def check_workers(num_workers: int | str, worker_type: str) -> int | str:
    """``num_workers`` as an int, when it is one >= 0 (or ``"auto"``, kept) and
    ``worker_type`` is one of :data:`WORKER_TYPES`; else
    :class:`~feedline.errors.ConfigurationError` saying what to pass.

    Examples
    --------
    >>> check_workers(2, "process"), check_workers("auto", "thread")
    (2, 'auto')
    >>> check_workers(-1, "thread")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: num_workers=-1 must be an int >= 0 or 'auto'. Fix: ...
    """
    if worker_type not in WORKER_TYPES:
        raise ConfigurationError(
            f"worker_type={worker_type!r} is not one of {WORKER_TYPES}. Fix: 'thread' for "
            "GIL-releasing work (Pillow, NumPy, tokenizers), 'process' for Python-heavy "
            "transforms."
        )
    if num_workers == "auto":
        return "auto"

    def fail(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"num_workers={num_workers!r} must be {expected} or 'auto'. Fix: 0 runs the "
            "transform in the loader's own thread; N > 0 starts N workers; 'auto' starts one "
            "and adds more while they help (feedline.loader.profiling.autotune)."
        )

    return checked_int(num_workers, 0, fail=fail)
