"""Worker processes for :class:`~feedline.loader.nodes.Map` (see :mod:`feedline.loader.nodes.
workers`): each with a pipe for small messages, the data through shared memory."""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, FeedlineError, UserFunctionError
from feedline.loader.nodes import shm
from feedline.loader.nodes.progress import Progress, stuck_message
from feedline.loader.nodes.samples import add_note, takes_index
from feedline.loader.nodes.worker_task import (
    INDICES,
    OBJECTS,
    Chunk,
    Pending,
    process_main,
    split_columns,
)

__all__ = ["PER_WORKER", "POLL_S", "STOP_S", "ProcessWorkers"]

#: tasks queued at one worker process (one running, one waiting)
PER_WORKER = 2
#: seconds a worker process gets to stop before it is terminated
STOP_S = 2.0
#: longest wait between two looks at the workers' progress while a timeout is set
POLL_S = 0.1


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        # the server imports the worker module once; each worker forks from it already loaded
        context.set_forkserver_preload(["feedline.loader.nodes.worker_task"])
        return context
    return multiprocessing.get_context("spawn")


@dataclass(eq=False)
class _Task(Pending):
    pool: _Processes
    task_id: int
    worker: int
    in_name: str | None
    indices: np.ndarray
    batched: bool = False
    epoch: int = 0
    reply: tuple[Any, ...] | None = None
    abandoned: bool = False

    def result(self) -> Chunk:
        while self.reply is None:
            self.pool.pump()
        return self.pool.chunk_of(self)

    def abandon(self) -> None:
        self.abandoned = True
        if self.reply is not None:
            self.pool.discard(self)


@dataclass(eq=False)
class _Processes:
    """The processes, pipes and segments of a :class:`ProcessWorkers` (what its finalizer
    closes: it must not refer to the pool itself)."""

    fn_name: str
    timeout: float | None = None
    procs: list[Any] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)
    inputs: list[shm.Segments] = field(default_factory=list)
    outputs: shm.Attached = field(default_factory=shm.Attached)
    output_names: set[str] = field(default_factory=set)
    load: list[int] = field(default_factory=list)
    done: list[int] = field(default_factory=list)  # chunks each worker has sent back
    tasks: dict[int, _Task] = field(default_factory=dict)
    next_id: int = 0

    def pump(self) -> None:
        """Wait for at least one reply (or a worker's death) and file what came; with a
        timeout, a worker whose call has run past it is killed (see :meth:`reap`)."""
        sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
        if self.timeout is None:
            ready = wait([*self.conns, *sentinels])
        else:
            ready = wait([*self.conns, *sentinels], timeout=min(POLL_S, self.timeout / 4))
            if not ready:
                self.reap()
                return
        for obj in ready:
            if obj in sentinels:
                self._died(sentinels[obj])
        for obj in ready:
            if isinstance(obj, Connection):
                i = self.conns.index(obj)
                try:
                    while obj.poll():
                        self._file(i, obj.recv())
                except (EOFError, OSError):
                    self._died(i)
        if self.timeout is not None:  # another worker's replies must not hide a stuck one
            self.reap()

    def reap(self) -> None:
        """Kill a worker whose call has run past the timeout, stop the others, and raise
        :class:`~feedline.errors.UserFunctionError` naming its sample (the pool restarts on
        its next use)."""
        assert self.timeout is not None
        now = time.monotonic()
        for i, progress in enumerate(self.progress):
            running = progress.running()
            task = self.tasks.get(running[0]) if running is not None else None
            if running is None or task is None or now - running[2] <= self.timeout:
                continue
            proc = self.procs[i]
            proc.kill()
            proc.join(STOP_S)
            message = stuck_message(
                self.fn_name, self.timeout, now - running[2], task.indices, running[1],
                task.batched, task.epoch, f"worker process {i} (pid {proc.pid})",
            )  # fmt: skip
            self.close()
            raise UserFunctionError(
                message + " The process was killed; the workers restart on the next iteration. "
                "Fix: find why the transform hangs on it (call it on that sample alone, e.g. "
                "with num_workers=0), make it give up by itself, or raise timeout= if it is "
                "only slow."
            )

    def _died(self, i: int) -> None:
        proc = self.procs[i]
        proc.join(0.5)
        code = proc.exitcode
        self.close()
        raise UserFunctionError(
            f"Loader worker process {i} (pid {proc.pid}) running the transform {self.fn_name} "
            f"exited unexpectedly (exit code {code}; negative: killed by that signal, e.g. -9 "
            "by the out-of-memory killer). Fix: check the machine's memory and the transform "
            "(a crash in native code ends the process), lower num_workers or the batch size, "
            "or use worker_type='thread'; the workers restart on the next iteration."
        )

    def _file(self, i: int, reply: tuple[Any, ...]) -> None:
        task = self.tasks.pop(reply[1], None)
        if task is None:
            if reply[0] == "error" and reply[1] == -1:
                self.close()
                raise ConfigurationError(
                    f"A loader worker process could not load the transform {self.fn_name}: "
                    f"{reply[3]}: {reply[4]}. Fix: define it at module level in an importable "
                    "module (not in __main__ of an interactive session, not a lambda), or use "
                    "worker_type='thread'.\n" + reply[5]
                )
            return
        self.load[i] -= 1
        self.done[i] += 1
        if task.in_name is not None:
            self.inputs[i].release([task.in_name])
        if reply[0] == "ok":
            if reply[3] is not None:
                self.output_names.add(reply[3])
            retired = reply[6]
            if retired:
                self.outputs.forget(retired)
                for name in retired:
                    shm.unlink_name(name)
                    self.output_names.discard(name)
        task.reply = reply
        if task.abandoned:
            self.discard(task)

    def discard(self, task: _Task) -> None:
        if task.reply is not None and task.reply[0] == "ok" and task.reply[3] is not None:
            self._free(task.worker, task.reply[3])

    def _free(self, worker: int, name: str) -> None:
        if worker < len(self.conns):
            with contextlib.suppress(OSError, ValueError):
                self.conns[worker].send(("free", [name], []))

    def chunk_of(self, task: _Task) -> Chunk:
        reply = task.reply
        assert reply is not None
        if reply[0] == "error":
            raise _remote_error(reply, self.fn_name)
        _, _, rows, name, layout, skipped, *rest = reply
        views = shm.read(self.outputs.get(name), layout)
        raw = views.pop(OBJECTS, None)
        lists, markers = pickle.loads(raw.tobytes()) if raw is not None else ({}, [])
        released = False

        def release() -> None:
            nonlocal released
            if not released and name is not None:
                released = True
                self._free(task.worker, name)

        seconds = float(rest[1]) if len(rest) > 1 else 0.0  # the worker's time on the chunk
        return Chunk(
            rows, views, lists, list(skipped), markers, release, shared=True, seconds=seconds
        )

    def _drain(self, conn: Connection) -> None:
        """Read what a stopping worker still sends, keeping the segment names it reports."""
        with contextlib.suppress(EOFError, OSError, ValueError):
            while conn.poll(STOP_S):
                reply = conn.recv()
                if reply[0] == "bye":
                    self.output_names.update(reply[2])
                    return
                if reply[0] == "ok":
                    self.output_names.update(n for n in (reply[3], *reply[6]) if n)

    def close(self) -> None:
        """Stop the processes (terminate them after ``STOP_S``) and unlink every segment."""
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        for conn in self.conns:  # replies still in flight, then the names of every segment
            self._drain(conn)
        for proc in self.procs:
            proc.join(STOP_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(STOP_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        for segments in self.inputs:
            segments.close(unlink=True)
        self.outputs.close()
        for name in self.output_names:
            shm.unlink_name(name)
        for task in self.tasks.values():
            task.reply = ("error", task.task_id, None, "RuntimeError",
                          "the worker processes were stopped", "")  # fmt: skip
        for held in (self.procs, self.conns, self.inputs, self.load, self.done,
                     self.output_names, self.tasks, self.progress):  # fmt: skip
            held.clear()


def _remote_error(reply: tuple[Any, ...], fn_name: str) -> BaseException:
    _, _, payload, type_name, message, text = reply
    original = None
    if payload is not None:
        try:
            original = pickle.loads(payload)
        except Exception:  # noqa: BLE001 - fall back to the text
            original = None
    note = "Traceback in the loader's worker process:\n" + text
    if isinstance(original, FeedlineError):
        add_note(original, note)
        return original
    error = UserFunctionError(
        f"The loader's transform {fn_name} raised {type_name}: {message} in a worker "
        f"process.\n{note}Fix: correct the transform (run it with worker_type='thread' or "
        "num_workers=0 to debug it in this process), or drop bad samples by returning a "
        "feedline.preprocess.vision.augment.Skipped marker."
    )
    if isinstance(original, BaseException):
        error.__cause__ = original
    return error


class ProcessWorkers:
    """``num_workers`` processes running ``fn`` (see the module docstring; ``timeout``: see
    :mod:`feedline.loader.nodes.worker_pools`)."""

    kind = "process"

    def __init__(self, fn: Callable[..., Any], num_workers: int,
                 timeout: float | None = None) -> None:  # fmt: skip
        self.num_workers, self.timeout = int(num_workers), timeout
        self.fn_name = getattr(fn, "__qualname__", None) or type(fn).__name__
        try:
            self._fn_bytes = pickle.dumps(fn)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigurationError(
                f"worker_type='process' needs a transform it can send to the worker processes, "
                f"but {self.fn_name} cannot be pickled ({exc}). Fix: define it at module level "
                "(a function, or an instance of a module-level class; not a lambda or a nested "
                "function), or use worker_type='thread'."
            ) from exc
        self._with_index = takes_index(fn)
        self._state: _Processes | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty until started)."""
        return [] if self._state is None else [p.pid for p in self._state.procs]

    def start(self) -> None:
        """Start the processes now (they start on first use otherwise)."""
        self._start()

    def _start(self) -> _Processes:
        if self._state is not None and self._state.procs:
            state = self._state
            if len(state.procs) < self.num_workers:  # resized: more processes
                self._spawn(state, self.num_workers)
            return state
        state = _Processes(self.fn_name, self.timeout)
        self._spawn(state, self.num_workers)
        self._state = state
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, state.close)
        return state

    def _spawn(self, state: _Processes, count: int) -> None:
        """Start processes until ``state`` has ``count``."""
        context = _context()
        for i in range(len(state.procs), count):
            parent, child = context.Pipe(duplex=True)
            slots = context.RawArray("d", 3)  # the worker's Progress, in shared memory
            proc = context.Process(target=process_main, args=(child, self._fn_bytes,
                                                              self._with_index, slots),
                                   name=f"feedline-worker-{i}", daemon=True)  # fmt: skip
            proc.start()
            child.close()
            state.procs.append(proc)
            state.progress.append(Progress(slots))
            state.conns.append(parent)
            state.inputs.append(shm.Segments())
            state.load.append(0)
            state.done.append(0)

    @property
    def ready(self) -> bool:
        """Whether each of the ``num_workers`` processes has sent a chunk back (a process just
        started is not ready: the autotuner waits for it before it measures)."""
        state = self._state
        if state is None or len(state.done) < self.num_workers:
            return False
        return all(state.done[: self.num_workers])

    def resize(self, num_workers: int) -> None:
        """Give chunks to ``num_workers`` processes from the next :meth:`submit` on: more are
        started there (in the submitting thread); the others are parked (no new chunks; they
        stay alive, idle, until :meth:`close`, and are the first used again)."""
        self.num_workers = max(1, int(num_workers))

    def submit(self, columns: Mapping[str, Any], indices: np.ndarray, *, batched: bool,
               seed: int, epoch: int, into: Any = None) -> Pending:  # fmt: skip
        """Send a chunk to the least busy worker (``into``, a batch's Stacker, is for the
        workers that share this process's memory: ignored)."""
        state = self._start()
        active = max(1, min(self.num_workers, len(state.load)))  # the rest are parked
        while min(state.load[:active]) >= PER_WORKER:
            state.pump()
        i = int(np.argmin(state.load[:active]))
        arrays, objects = split_columns(columns)
        arrays = {INDICES: np.ascontiguousarray(indices, dtype=np.int64), **arrays}
        if objects:
            arrays[OBJECTS] = np.frombuffer(pickle.dumps(objects, protocol=5), dtype=np.uint8)
        layout, nbytes = shm.plan_layout(arrays)
        segment = state.inputs[i].acquire(nbytes)
        shm.write(segment, arrays, layout)
        forget = state.inputs[i].take_retired()
        task_id, state.next_id = state.next_id, state.next_id + 1
        task = _Task(state, task_id, i, segment.name, np.asarray(indices), batched, epoch)
        state.tasks[task_id] = task
        state.load[i] += 1
        conn = state.conns[i]
        if forget:
            for name in forget:
                shm.unlink_name(name)
            conn.send(("free", [], forget))
        conn.send(("task", task_id, batched, seed, epoch, segment.name, layout))
        return task

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._state = None
