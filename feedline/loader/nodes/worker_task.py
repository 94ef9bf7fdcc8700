"""What a loader worker runs: a transform over one chunk of a batch, then the chunk stacked.

:func:`run_chunk` serves every path (inline, threads, processes). :func:`process_main` is the
loop of a worker process: it receives tasks through a pipe (small messages: row indices,
object columns such as encoded image bytes, and the layout of numeric input columns placed
in shared memory), runs :func:`run_chunk`, writes the stacked arrays into a shared-memory
segment of its own (reused once the loader has copied them out) and replies with their
layout; only lists (strings, ragged values) and skip markers are pickled back.

A worker says where it stands in a :class:`~feedline.loader.nodes.progress.Progress`: the
task and the position in its chunk of the transform call running, and since when. The loader
reads it to enforce ``timeout=`` (a call running longer names its sample; see
:mod:`feedline.loader.nodes.worker_pools`); a worker process keeps it in three float64 slots
of shared memory.

Per-sample results are stacked into the batch's own arrays when the worker shares the loader's
memory (threads, inline): a :class:`~feedline.loader.nodes.samples.Stacker` per batch, so the
chunks of a batch need no second copy to be joined (see :class:`~feedline.loader.nodes.Map`).
"""

from __future__ import annotations

import pickle
import signal
import time
import traceback
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from feedline.loader.nodes import shm
from feedline.loader.nodes.progress import Progress
from feedline.loader.nodes.samples import Stacker, apply_batch, apply_samples, collate_samples

__all__ = [
    "Chunk",
    "Pending",
    "process_main",
    "run_chunk",
    "split_columns",
]

#: input/output keys in a segment: the row indices, and the pickle of the non-array values
INDICES, OBJECTS = "__indices__", "__objects__"


@dataclass
class Chunk:
    """A transformed, stacked part of a batch.

    ``arrays`` (stackable outputs) and ``lists`` (the rest) hold ``rows`` rows, in input
    order without the ``skipped`` positions (relative to the chunk's input), whose markers
    are in ``markers``. Arrays from a worker process are views of a shared-memory segment:
    copy them before :meth:`release`.
    """

    rows: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    markers: list[Any] = field(default_factory=list)
    release: Callable[[], None] = lambda: None
    shared: bool = False
    #: seconds the worker spent running the transform and stacking (``loader.profile()``)
    seconds: float = 0.0

    @property
    def keys(self) -> list[str]:
        return [*self.arrays, *self.lists]


def split_columns(data: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(numeric arrays, everything else)``: what can go through shared memory, and not."""
    arrays, others = {}, {}
    for key, value in data.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            arrays[key] = value
        else:
            others[key] = value.tolist() if isinstance(value, np.ndarray) else value
    return arrays, others


def run_chunk(
    fn: Callable[..., Any],
    columns: Mapping[str, Any],
    indices: np.ndarray,
    *,
    batched: bool,
    seed: int,
    epoch: int,
    with_index: bool,
    progress: Progress | None = None,
    task: int = 0,
    into: tuple[Stacker, int] | None = None,
) -> Chunk:
    """Apply ``fn`` to the chunk's samples (or the chunk, ``batched``) and stack them.

    ``progress`` (if given) follows each call (task ``task``); ``into`` is the batch's
    :class:`~feedline.loader.nodes.samples.Stacker` and the chunk's first row in the batch:
    the samples' arrays are stacked straight into the batch's arrays where they fit.
    """
    skipped: list[int]
    markers: list[Any]
    started = time.perf_counter()
    if progress is not None:
        progress.start_task(task)
    try:
        if batched:
            data = apply_batch(fn, columns, indices, seed=seed, epoch=epoch, progress=progress)
            skipped, markers = [], []
        else:
            kept, skipped, markers = apply_samples(
                fn, columns, indices, seed=seed, epoch=epoch, with_index=with_index,
                progress=progress,
            )  # fmt: skip
            data = collate_samples(kept, into=into)
    finally:
        if progress is not None:
            progress.end()
    arrays, lists = split_columns(data)
    chunk = Chunk(len(indices) - len(skipped), arrays, lists, skipped, markers)
    chunk.seconds = time.perf_counter() - started
    return chunk


def _error_reply(task_id: int, exc: BaseException) -> tuple[Any, ...]:
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)
    except Exception:  # noqa: BLE001 - any unpicklable exception: its text still goes
        payload = None
    text = "".join(traceback.format_exception(exc))
    return ("error", task_id, payload, type(exc).__name__, str(exc), text)


def _run(fn: Callable[..., Any], with_index: bool, inputs: shm.Attached, outputs: shm.Segments,
         message: tuple[Any, ...],
         progress: Progress | None = None) -> tuple[Any, ...]:  # fmt: skip
    """One task: read the inputs, run the chunk, write the outputs; the reply message."""
    _, task_id, batched, seed, epoch, in_name, in_layout = message
    columns = shm.read(inputs.get(in_name), in_layout)
    indices = columns.pop(INDICES)
    raw = columns.pop(OBJECTS, None)
    if raw is not None:
        columns |= pickle.loads(raw.data)
    chunk = run_chunk(fn, columns, indices, batched=batched, seed=seed, epoch=epoch,
                      with_index=with_index, progress=progress, task=task_id)  # fmt: skip
    del columns, indices, raw
    arrays = dict(chunk.arrays)
    if chunk.lists or chunk.markers:
        extra = pickle.dumps((chunk.lists, chunk.markers), protocol=5)
        arrays[OBJECTS] = np.frombuffer(extra, dtype=np.uint8)
    layout, nbytes = shm.plan_layout(arrays)
    segment = outputs.acquire(nbytes) if nbytes else None
    if segment is not None:
        shm.write(segment, arrays, layout)
    name = None if segment is None else segment.name
    return (
        "ok",
        task_id,
        chunk.rows,
        name,
        layout,
        chunk.skipped,
        outputs.take_retired(),
        chunk.seconds,
    )


def process_main(
    conn: Connection, fn_bytes: bytes, with_index: bool,
    slots: MutableSequence[float] | None = None,
) -> None:  # fmt: skip
    """The loop of a worker process (see the module docstring); ends on "stop" or EOF.

    ``slots`` (shared memory) receive the worker's
    :class:`~feedline.loader.nodes.progress.Progress`.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader process's to handle
    progress = Progress(slots) if slots is not None else None
    outputs, inputs = shm.Segments(), shm.Attached()
    try:
        try:
            fn = pickle.loads(fn_bytes)
        except BaseException as exc:  # noqa: BLE001 - reported, then the worker ends
            conn.send(_error_reply(-1, exc))
            return
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "stop":  # every segment this worker made, for the loader to unlink
                conn.send(("bye", -2, [*outputs.names(), *outputs.take_retired()]))
                return
            if kind == "free":
                outputs.release(message[1])
                inputs.forget(message[2])
                continue
            try:
                conn.send(_run(fn, with_index, inputs, outputs, message, progress))
            except BaseException as exc:  # noqa: BLE001 - handed to the loader process
                conn.send(_error_reply(message[1], exc))
    finally:
        outputs.close(unlink=False)  # the loader process unlinks (see feedline.loader.nodes.shm)
        inputs.close()


class Pending:
    """A submitted chunk; :meth:`result` waits for it."""

    def result(self) -> Chunk:
        raise NotImplementedError

    def abandon(self) -> None:
        """The result is no longer wanted (a reset or a break): drop it when it comes."""
