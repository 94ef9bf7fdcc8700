"""Worker pools for :class:`~feedline.loader.nodes.Map`: threads or processes, started once.

Both take chunks of a batch (:meth:`submit`) and hand back :class:`~feedline.loader.nodes.
worker.Chunk` results through a :class:`Pending` (its :meth:`~Pending.result` blocks); the
caller asks for results in submission order, so the output order never depends on timing.

- :class:`ThreadWorkers`: a ``ThreadPoolExecutor`` (GIL-releasing work: Pillow decode,
  NumPy, tokenizers). An exception reaches the caller as the same object, traceback intact.
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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.checks import checked_int
from feedline.loader.nodes.process_pool import ProcessWorkers
from feedline.loader.nodes.samples import takes_index
from feedline.loader.nodes.worker_task import Chunk, Pending, run_chunk

__all__ = [
    "WORKER_TYPES",
    "InlineWorkers",
    "ThreadWorkers",
    "check_workers",
    "make_workers",
]

WORKER_TYPES = ("thread", "process")


class _Done(Pending):
    def __init__(self, chunk: Chunk | None = None, error: BaseException | None = None) -> None:
        self._chunk, self._error = chunk, error

    def result(self) -> Chunk:
        if self._error is not None:
            raise self._error
        assert self._chunk is not None
        return self._chunk


class _Future(Pending):
    def __init__(self, future: Future) -> None:
        self._future = future

    def result(self) -> Chunk:
        return self._future.result()

    def abandon(self) -> None:
        self._future.cancel()


class InlineWorkers:
    """No workers: each chunk runs in the calling thread."""

    kind, num_workers = "inline", 0

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.with_index = fn, takes_index(fn)

    def submit(self, columns: Mapping[str, Any], indices: np.ndarray, *, batched: bool,
               seed: int, epoch: int) -> Pending:  # fmt: skip
        try:
            return _Done(run_chunk(self.fn, columns, indices, batched=batched, seed=seed,
                                   epoch=epoch, with_index=self.with_index))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - raised from result(), in order
            return _Done(error=exc)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (none: no processes)."""
        return []

    def start(self) -> None:
        """Start the workers now (they start on first use otherwise)."""

    def close(self) -> None:
        """Stop the workers (a later :meth:`submit` starts new ones)."""


class ThreadWorkers(InlineWorkers):
    """``num_workers`` threads, started on first use and kept until :meth:`close`."""

    kind = "thread"

    def __init__(self, fn: Callable[..., Any], num_workers: int) -> None:
        super().__init__(fn)
        self.num_workers = int(num_workers)
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, columns: Mapping[str, Any], indices: np.ndarray, *, batched: bool,
               seed: int, epoch: int) -> Pending:  # fmt: skip
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.num_workers, "feedline-map")
        future = self._executor.submit(
            run_chunk, self.fn, columns, indices, batched=batched, seed=seed, epoch=epoch,
            with_index=self.with_index,
        )  # fmt: skip
        return _Future(future)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def make_workers(fn: Callable[..., Any], num_workers: int, worker_type: str) -> Any:
    """The pool for ``Map``: inline (0 workers), threads or processes.

    Examples
    --------
    >>> make_workers(lambda s, rng: s, 0, "thread").kind
    'inline'
    """
    num_workers = check_workers(num_workers, worker_type)
    if num_workers == 0:
        return InlineWorkers(fn)
    if worker_type == "thread":
        return ThreadWorkers(fn, num_workers)

    return ProcessWorkers(fn, num_workers)


def check_workers(num_workers: int, worker_type: str) -> int:
    """``num_workers`` as an int, when it is one >= 0 and ``worker_type`` is one of
    :data:`WORKER_TYPES`; else :class:`~feedline.errors.ConfigurationError` saying what to pass.

    Examples
    --------
    >>> check_workers(2, "process")
    2
    >>> check_workers(-1, "thread")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: num_workers=-1 must be an int >= 0. Fix: 0 runs ...
    """
    if worker_type not in WORKER_TYPES:
        raise ConfigurationError(
            f"worker_type={worker_type!r} is not one of {WORKER_TYPES}. Fix: 'thread' for "
            "GIL-releasing work (Pillow, NumPy, tokenizers), 'process' for Python-heavy "
            "transforms."
        )

    def fail(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"num_workers={num_workers!r} must be {expected}. Fix: 0 runs the transform in "
            "the loader's own thread; N > 0 starts N workers."
        )

    return checked_int(num_workers, 0, fail=fail)
