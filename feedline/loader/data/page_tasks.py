"""The page copies of a memory cache fill, run in the background: a batch's pages first.

A memory cache must be filled before its rows are served, and with an exact shuffle every
batch takes rows from everywhere, so the first batch used to wait for the whole fill: 100k x
uint8[3, 64, 64] (1.2 GB, 2 cores, fresh processes) took 0.66-0.97 s with the files in the
page cache and 1.50-1.89 s with them evicted (the disk reads about 0.75 GB/s). But 512 rows
(the loader gathers two batches at a time) lie in about a third of the pages when pages are
about 1 MiB (:data:`feedline.store.shards.PAGE_BYTES`). So the fill reads what is small (the
columns pyarrow decodes, every page header) before the loader is handed its cache, and copies
the data pages (:func:`~feedline.store.page_copy.copy_page`: one copy, CRC-32 checked where the
bytes land) in background threads, in file order; a gather (:meth:`PageTasks.ensure`) puts
the pages its rows lie in first in line, helps copy them and waits for them. Same data and
machine: first batch 0.35-0.69 s warm, 0.75-0.99 s evicted. A row is served only once its
page's checksum was checked; a page that fails raises :class:`~feedline.errors.DataError` at
the gather that waits for it and at every later one (so a damaged page may now be reported
after the first batches, never served). A cache dropped while it fills stops its threads;
after a ``fork`` (a child process given the cache) the child copies what is left itself.

Examples
--------
>>> import feedline as fl, numpy as np, pyarrow as pa, tempfile
>>> from feedline.store.shard_source import open_shard_source
>>> from feedline.loader.data.memory_cache import load_cache
>>> from feedline.loader.data.columns import column_specs
>>> out = tempfile.mkdtemp() + "/ds"
>>> _ = fl.from_arrow(pa.table({"x": np.arange(1000.0)})).write(
...     out, row_group_rows=100, compression=None)
>>> source = open_shard_source(out)
>>> cache = load_cache(source, column_specs(source.schema()), background=True)
>>> cache.gather(np.array([999, 3]))["x"].tolist()
[999.0, 3.0]
>>> cache.wait().arrays["x"][:3].tolist()
[0.0, 1.0, 2.0]
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from feedline.errors import DataError
from feedline.loader.data.bulk_arrays import prefault
from feedline.store.page_copy import ChunkCopy, PageCopy, copy_page

__all__ = ["PageTask", "PageTasks"]

_TODO, _RUNNING, _DONE = 0, 1, 2


@dataclass(frozen=True)
class PageTask:
    """One page to copy: from the open file ``fd`` into its rows of the cache."""

    fd: int
    chunk: ChunkCopy
    page: PageCopy
    #: the column chunk's bytes in the cache, and the column's cache array (to prefault)
    dest: memoryview
    array: np.ndarray
    #: the dataset row of the chunk's first row; the column's name; the shard, for errors
    start: int
    column: str
    where: str

    def run(self) -> None:
        first = self.start + self.page.row
        prefault(self.array, first, first + self.page.rows)
        if not copy_page(self.fd, self.chunk, self.page, self.dest, self.where):
            raise DataError(
                f"Shard {self.where} ended inside page {self.page.index} of column "
                f"{self.chunk.column!r} in row group {self.chunk.group} while the cache was "
                "filled: it was truncated or replaced. Fix: restore the shard (fl.verify(path) "
                "checks every shard) or re-run the write."
            )


class PageTasks:
    """Copies ``tasks`` with ``threads`` background threads; :meth:`ensure` serves a gather.

    ``on_done`` runs once no task runs any more (every page copied, or a failure): it closes
    the files the tasks read.
    """

    def __init__(self, tasks: Sequence[PageTask], threads: int, on_done: Callable[[], None]):
        self._tasks = list(tasks)
        self._state = np.zeros(len(self._tasks), np.int8)
        self._left = len(self._tasks)
        self._cond = threading.Condition()
        self._next = 0  # the first task (file order) that may still be to do
        self._wanted: deque[int] = deque()  # tasks a gather waits for: taken first
        self._busy = 0
        self._error: BaseException | None = None
        self._cancelled = False
        self._on_done: Callable[[], None] | None = on_done
        self._pid = os.getpid()
        #: ``True`` once every page is in place (read without the lock: a gather's fast path)
        self.complete = not self._tasks
        self._by_column = self._index()
        for n in range(threads if self._tasks else 0):
            name = f"feedline-fill-{n}"
            threading.Thread(target=self._work, name=name, daemon=True).start()
        if not self._tasks:
            self._finish()

    def _index(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per column: its pages' first dataset rows (sorted) and their task numbers."""
        out = []
        for column in dict.fromkeys(t.column for t in self._tasks):
            ids = np.array([i for i, t in enumerate(self._tasks) if t.column == column])
            firsts = np.array([self._tasks[i].start + self._tasks[i].page.row for i in ids])
            order = np.argsort(firsts, kind="stable")
            out.append((firsts[order], ids[order]))
        return out

    def ensure(self, rows: np.ndarray) -> None:
        """Return once the pages of ``rows`` (dataset rows) are copied and checked; raise
        the fill's error, if any."""
        if self.complete:
            return
        if os.getpid() != self._pid:  # a forked child: no fill threads here
            self._adopt()
            return
        rows = np.asarray(rows, dtype=np.int64).ravel()
        at = [(ids, np.searchsorted(firsts, rows, "right") - 1) for firsts, ids in self._by_column]
        need = np.unique(np.concatenate([ids[np.maximum(i, 0)] for ids, i in at]))
        with self._cond:
            self._raise()
            waiting = need[self._state[need] != _DONE]
            self._wanted.extendleft(int(t) for t in waiting[::-1] if self._state[t] == _TODO)
        while True:
            with self._cond:
                self._raise()
                if (self._state[need] == _DONE).all():
                    return
                task = self._take(wanted_only=True)
                if task is None:  # the rest are being copied by the fill threads
                    self._cond.wait(0.5)
                    continue
            self._run(task)

    def wait(self) -> None:
        """Return once every page is copied (helping copy them); raise the fill's error, if
        any."""
        if self.complete:
            return
        if os.getpid() != self._pid:
            self._adopt()
            return
        while True:
            with self._cond:
                self._raise()
                if self.complete:
                    return
                task = self._take()
                if task is None:  # the last pages are being copied
                    self._cond.wait(0.5)
                    continue
            self._run(task)

    def cancel(self) -> None:
        """Start no more pages (the cache is gone); the files close once the running ones
        are done."""
        if os.getpid() != self._pid:  # a forked child: no fill threads (and maybe a held lock)
            return
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()
            if self._busy == 0:
                self._finish()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _take(self, wanted_only: bool = False) -> int | None:
        """The next task to run (a gather's first), marked running; under the lock."""
        if self._error is not None or self._cancelled:
            return None
        task = None
        while self._wanted:
            candidate = self._wanted.popleft()
            if self._state[candidate] == _TODO:
                task = candidate
                break
        if task is None and not wanted_only:
            while self._next < len(self._tasks) and self._state[self._next] != _TODO:
                self._next += 1
            task = self._next if self._next < len(self._tasks) else None
        if task is not None:
            self._state[task] = _RUNNING
            self._busy += 1
        return task

    def _run(self, task: int) -> None:
        try:
            self._tasks[task].run()
        except BaseException as exc:  # noqa: BLE001 - raised at the gathers, in their thread
            with self._cond:
                self._error = self._error or exc
                self._busy -= 1
                self._state[task] = _TODO
                self._cond.notify_all()
                if self._busy == 0:
                    self._finish()
            return
        with self._cond:
            self._state[task] = _DONE
            self._left -= 1
            self._busy -= 1
            if self._left == 0:
                self.complete = True
            self._cond.notify_all()
            if self._busy == 0 and (self.complete or self._cancelled or self._error is not None):
                self._finish()

    def _work(self) -> None:
        while True:
            with self._cond:
                task = self._take()
            if task is None:
                return
            self._run(task)

    def _finish(self) -> None:
        """Under the lock, once nothing runs: close the files (once)."""
        done, self._on_done = self._on_done, None
        if done is not None:
            done()

    def _adopt(self) -> None:
        """In a child forked while the fill ran: copy every page not known done, here."""
        self._cond = threading.Condition()  # the parent's may have been held at the fork
        self._pid, self._wanted, self._busy = os.getpid(), deque(), 0
        self._raise()
        for task in np.flatnonzero(self._state != _DONE):
            self._tasks[int(task)].run()
            self._state[task] = _DONE
        self.complete = True
        self._finish()
