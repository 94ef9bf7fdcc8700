"""Run a user transform over every batch, in parallel workers, in a deterministic order."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline.errors import UserFunctionError
from feedline.loader.nodes.node import Batch, Node, Stage
from feedline.loader.nodes.samples import Stacker, as_error
from feedline.loader.nodes.worker_pools import make_workers
from feedline.loader.nodes.worker_task import Chunk, Pending

__all__ = ["Map"]


class Map(Stage):
    """Apply ``fn`` to each sample (or each batch, ``batched=True``) and stack the results.

    Parameters
    ----------
    source:
        A node whose batches hold a dict of columns (a :class:`~feedline.loader.nodes.Gather`).
    fn:
        ``fn(sample: dict, rng: np.random.Generator) -> dict`` (a function with an ``index``
        parameter also gets the sample's global row index), or with ``batched=True``
        ``fn(batch: dict, rngs) -> dict`` (see :mod:`feedline.loader.nodes.samples`). ``rng``
        is seeded by ``(seed, epoch, row index)``: augmentation differs per epoch, repeats on
        a re-run and survives an exact resume, whatever the workers. Returning a
        :class:`~feedline.preprocess.vision.augment.Skipped` marker drops the sample: its batch is
        shorter and the marker is in ``Batch.skipped`` (the Loader counts it).
    num_workers, worker_type:
        0 runs ``fn`` in the calling thread; otherwise ``num_workers`` threads or processes
        (:mod:`feedline.loader.nodes.worker_pools`), started on first use and kept until
        :meth:`close`. Each batch is split into ``num_workers`` chunks (per-sample mode), and
        about two batches' chunks are in flight; results come back in order. Threads stack
        their chunk's samples straight into the batch's arrays (no copy to join them).
    seed:
        The seed of the per-sample generators (the loader's seed).
    workers:
        A pool to use instead of starting one (the Loader shares one across epochs); it is
        not closed by :meth:`close`.
    timeout:
        Seconds one call of ``fn`` (one sample; one batch with ``batched=True``) may run in
        a worker before :class:`~feedline.errors.UserFunctionError` names its sample; a
        stuck process is killed, a stuck thread abandoned (see
        :mod:`feedline.loader.nodes.worker_pools`). ``None``: no limit. Needs workers.

    A batch whose every sample the transform skipped comes out with no rows (its markers in
    ``Batch.skipped``), so that positions stay exact; the Loader counts it and does not yield
    it.

    Results are stacked per batch: arrays and numbers become one array per key (the same
    shape for every sample), anything else a list.

    Examples
    --------
    >>> import feedline as fl
    >>> loader = fl.range(6).loader(batch_size=3, shuffle=False)
    >>> node = Map(loader.source_node(), lambda s, rng: {"y": s["id"] * 10})
    >>> [b.data["y"].tolist() for b in node]
    [[0, 10, 20], [30, 40, 50]]
    """

    def __init__(
        self,
        source: Node,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        num_workers: int = 0,
        worker_type: str = "thread",
        seed: int = 0,
        workers: Any = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(source)
        self.fn, self.batched, self.seed = fn, bool(batched), int(seed)
        self._own = workers is None
        if workers is None:
            workers = make_workers(fn, num_workers, worker_type, timeout)
        self.workers = workers
        self._pending: deque[tuple[Batch, list[tuple[int, Pending]]]] = deque()
        self._inflight = 0
        self._exhausted = False
        self._spec: dict[str, Any] | None = None
        #: seconds the workers spent on this node's chunks, all workers together
        self.busy_s = 0.0

    def clear(self) -> None:
        for _, tasks in self._pending:
            for _, task in tasks:
                task.abandon()
        self._pending.clear()
        self._inflight, self._exhausted = 0, False

    def close(self) -> None:
        super().close()
        if self._own:
            self.workers.close()

    def _submit(self, item: Batch) -> list[tuple[int, Pending]]:
        columns, indices, n = item.data, item.indices, len(item.indices)
        if not isinstance(columns, dict):
            raise UserFunctionError(
                f"Map got a batch whose data is {type(columns).__name__}, not a dict of "
                "columns. Fix: put Map right after Gather (or a node yielding dicts of columns)."
            )
        if n == 0:
            return []
        parts = 1 if self.batched else max(1, min(self.workers.num_workers, n))
        bounds = np.linspace(0, n, parts + 1).astype(int)
        stacker = None if self.batched else Stacker(n)  # the chunks fill the batch's arrays
        tasks = []
        for a, b in itertools.pairwise(bounds.tolist()):
            part = {k: v[a:b] for k, v in columns.items()}
            into = None if stacker is None else (stacker, int(a))
            task = self.workers.submit(part, indices[a:b], batched=self.batched, seed=self.seed,
                                       epoch=item.epoch, into=into)  # fmt: skip
            tasks.append((int(a), task))
        return tasks

    def _fill(self) -> None:
        n = self.workers.num_workers  # read per fill: autotuning may resize the pool
        window = 2 * n if n else 1  # chunks in flight
        while not self._exhausted and (not self._pending or self._inflight < window):
            try:
                item = self.source.next()
            except StopIteration:
                self._exhausted = True
                break
            tasks = self._submit(item)
            self._pending.append((item, tasks))
            self._inflight += len(tasks)

    def produce(self) -> Batch:
        self._fill()
        if not self._pending:
            raise StopIteration
        item, tasks = self._pending.popleft()
        self._inflight -= len(tasks)
        chunks: list[tuple[int, Chunk]] = []
        try:
            for start, task in tasks:
                chunks.append((start, task.result()))
            self._assemble(item, chunks)
        except Exception as exc:
            for _, task in tasks:
                task.abandon()
            for _, chunk in chunks:
                chunk.release()
            self.clear()
            error = as_error(exc)
            if error is exc:
                raise
            raise error from exc
        return item

    def _assemble(self, item: Batch, chunks: list[tuple[int, Chunk]]) -> None:
        """The batch from its chunks: skipped samples out, arrays stacked, lists joined."""
        skipped = [start + pos for start, chunk in chunks for pos in chunk.skipped]
        if skipped:
            keep = np.ones(len(item.indices), dtype=bool)
            keep[skipped] = False
            item.indices = item.indices[keep]
            if item.padded is not None:
                item.padded = item.padded[keep]
            item.skipped = tuple(m for _, chunk in chunks for m in chunk.markers)
        self.busy_s += sum(chunk.seconds for _, chunk in chunks)
        live = [chunk for _, chunk in chunks if chunk.rows]
        try:
            item.data = _join(live) if live else self._empty()
        finally:
            for _, chunk in chunks:
                chunk.release()
        self._spec = {k: (v.shape[1:], v.dtype) if isinstance(v, np.ndarray) else None
                      for k, v in item.data.items()}  # fmt: skip

    def _empty(self) -> dict[str, Any]:
        """A batch with no samples left: empty arrays shaped like the last batch's."""
        if self._spec is None:
            return {}
        return {k: [] if spec is None else np.empty((0, *spec[0]), spec[1])
                for k, spec in self._spec.items()}  # fmt: skip


def _join(chunks: list[Chunk]) -> dict[str, Any]:
    first = chunks[0]
    for chunk in chunks[1:]:
        if set(chunk.arrays) != set(first.arrays) or set(chunk.lists) != set(first.lists):
            raise UserFunctionError(
                f"The loader's transform returned different keys or kinds within one batch "
                f"(arrays {sorted(first.arrays)} / lists {sorted(first.lists)} vs arrays "
                f"{sorted(chunk.arrays)} / lists {sorted(chunk.lists)}). Fix: return the same "
                "keys for every sample, each always an array (one shape) or never."
            )
    out: dict[str, Any] = {}
    for key in first.keys:
        if key in first.lists:
            out[key] = [v for chunk in chunks for v in chunk.lists[key]]
            continue
        parts = [chunk.arrays[key] for chunk in chunks]
        if len(parts) == 1 and not first.shared:
            out[key] = parts[0]
            continue
        whole = _filled(parts)
        if whole is not None:  # the chunks filled one array in place (a Stacker)
            out[key] = whole
            continue
        shapes = {p.shape[1:] for p in parts}
        dtypes = {p.dtype for p in parts}
        if len(shapes) > 1 or len(dtypes) > 1:
            raise UserFunctionError(
                f"The loader's transform returned {key!r} with different shapes or dtypes in "
                f"one batch ({sorted(map(str, shapes))}, {sorted(map(str, dtypes))}). Fix: "
                "return one shape and dtype per key (e.g. crop images to a fixed size)."
            )
        joined = np.empty((sum(len(p) for p in parts), *parts[0].shape[1:]), parts[0].dtype)
        np.concatenate(parts, out=joined)
        out[key] = joined
    return out


def _filled(parts: list[np.ndarray]) -> np.ndarray | None:
    """The array ``parts`` are consecutive row ranges of, when together they are all of it."""
    base = parts[0].base
    if not isinstance(base, np.ndarray) or sum(len(p) for p in parts) != len(base):
        return None
    step, at = base.strides[0], base.__array_interface__["data"][0]
    for part in parts:
        if part.base is not base or part.__array_interface__["data"][0] != at:
            return None
        at += len(part) * step
    return base
