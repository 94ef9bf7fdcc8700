"""Read the rows of each batch from the loader's backend (the memory cache or the stream)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.adapters.torch import batch_buffers, import_torch
from feedline.loader.data.backend import Backend
from feedline.loader.data.buffers import BufferPool
from feedline.loader.nodes.gather_threads import GatherThreads, batch_cuts
from feedline.loader.nodes.node import Batch, Node, Stage

__all__ = ["Gather"]


class Gather(Stage):
    """Fill each batch's ``data`` with its rows: a dict of column arrays (strings as lists).

    Parameters
    ----------
    source:
        A node yielding batches of row indices (an :class:`~feedline.loader.nodes.Order`).
    backend:
        Where rows come from (``Loader``'s backend: see :func:`~feedline.loader.data.backend.
        open_backend`); a session per epoch serves ``gather(indices, out=None)``.
    shuffle, seed:
        The order's, so a streaming backend reads its pools in the order's sequence.
    group:
        Batches gathered with one take per column (their arrays are row slices of it): one
        hand-over costs more than gathering a small batch, so small batches travel in groups.
    pin:
        Gather straight into page-locked torch tensors (one copy, not two; needs CUDA).
    objects:
        ``"list"`` turns object (string, bytes) columns into Python lists; ``"array"`` keeps
        the object arrays (what a :class:`~feedline.loader.nodes.Map` indexes).
    fmt:
        ``"torch"``: yield ``torch.Tensor`` columns, made once per group and column
        (``torch.from_numpy`` of the gathered group, split into the batches' row ranges in
        one call): a group of small batches costs a few tensor views, not a conversion per
        batch and column. ``None`` (default): NumPy arrays (convert later with
        :class:`~feedline.loader.nodes.Format`).
    threads:
        Threads a group's gather is split across, whole batches per thread, when the backend
        gathers into fresh arrays with GIL-free copies (windows; see :mod:`~feedline.loader.
        nodes.gather_threads`). Default: the CPUs this process may use (within its cgroup's
        quota), at most 2, while the other processes leave a CPU idle (else 1). The batches
        are the same, in the same order, whatever the count.

    Examples
    --------
    >>> import feedline as fl
    >>> loader = fl.range(6).loader(batch_size=4, shuffle=False, drop_last=False)
    >>> [b.data["id"].tolist() for b in loader.source_node()]
    [[0, 1, 2, 3], [4, 5]]
    """

    def __init__(
        self,
        source: Node,
        backend: Backend,
        *,
        shuffle: bool,
        seed: int,
        group: int = 1,
        pin: bool = False,
        objects: str = "list",
        fmt: str | None = None,
        threads: int | None = None,
    ) -> None:
        super().__init__(source)
        self._threads = GatherThreads(threads)
        self.backend, self.shuffle, self.seed = backend, bool(shuffle), int(seed)
        self.group, self.pin, self.objects = max(1, int(group)), bool(pin), objects
        self._from_numpy = None
        if fmt == "torch":
            self._from_numpy = import_torch().from_numpy
        elif fmt is not None:
            raise ConfigurationError(
                f"Gather: fmt={fmt!r}; it is 'torch' or None. Fix: pass fmt='torch', or None "
                "and a Format node after it."
            )
        self._ready: deque[Batch] = deque()
        self._session: Any = None
        self._session_epoch: int | None = None
        self._pool: BufferPool | None = None
        self._sample_bytes: int | None = None

    def clear(self) -> None:
        self._ready.clear()
        self._session = self._session_epoch = None

    def _session_for(self, epoch: int) -> Any:
        if self._session is None or self._session_epoch != epoch:
            upcoming = getattr(self.source, "upcoming", None)
            self._session = self.backend.session(
                shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                indices=upcoming() if upcoming is not None else None,
            )  # fmt: skip
            self._session_epoch = epoch
        return self._session

    def _out(
        self, session: Any, rows: int, capacity: int
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(tensors to take the batches from, arrays to gather ``rows`` rows into)."""
        if not self.pin and not getattr(session, "fills_buffers", True):
            return {}, {}  # it gathers into fresh arrays (windows: see loader.windows)
        shapes = getattr(self.backend, "buffer_shapes", self.backend.shapes)()
        if self.pin:  # straight into page-locked tensors
            return batch_buffers(shapes, rows, pin=True)
        # unpinned groups go into reused buffers (see BufferPool): the batches in flight,
        # the one the caller holds and the one being gathered each hold a set
        if self._pool is None or self._pool.rows < rows:
            self._pool = BufferPool(shapes, max(rows, capacity), keep=4)
        return {}, self._pool.get(rows)

    def _fill(self) -> None:
        take = getattr(self.source, "take", None)
        if take is not None:  # an Order: the group's indices are one slice of its plan
            self._gather(*take(self.group))
            return
        batches: list[Batch] = []
        for _ in range(self.group):
            try:
                batches.append(self.source.next())
            except StopIteration:
                break
            if batches[-1].epoch != batches[0].epoch:  # never gather across epochs
                break
        if not batches:
            raise StopIteration
        tail = batches.pop() if batches[-1].epoch != batches[0].epoch else None
        if batches:
            self._gather(batches)
        if tail is not None:
            self._gather([tail])

    def _gather(self, batches: list[Batch], indices: np.ndarray | None = None) -> None:
        session = self._session_for(batches[0].epoch)
        if indices is None:
            indices = (batches[0].indices if len(batches) == 1
                       else np.concatenate([b.indices for b in batches]))  # fmt: skip
        tensors, out = self._out(session, len(indices), len(batches[0].indices) * self.group)
        sizes = [len(b.indices) for b in batches]
        bounds = list(itertools.accumulate(sizes, initial=0))  # Python ints: no NumPy call
        cuts = [0, len(batches)]
        if not out and not tensors and getattr(session, "thread_safe_gather", False):
            cuts = batch_cuts(sizes, self._threads.threads, self._row_bytes())
        if len(cuts) > 2:  # whole batches per thread, each part into its own fresh arrays
            spans = [(bounds[a], bounds[b]) for a, b in itertools.pairwise(cuts)]
            got = self._threads.map(lambda k: session.gather(indices[slice(*spans[k])]),
                                    range(len(spans)))  # fmt: skip
        else:
            got = [session.gather(indices, out=out)]
        self._assign(batches, cuts, got, tensors)

    def _assign(self, batches: list[Batch], cuts: list[int], got: list[dict[str, Any]],
                tensors: dict[str, Any]) -> None:  # fmt: skip
        sizes = [len(b.indices) for b in batches]
        for (a, b), arrays in zip(itertools.pairwise(cuts), got, strict=True):
            part = sizes[a:b]
            ends = itertools.accumulate(part, initial=0)
            rows = [slice(x, y) for x, y in itertools.pairwise(ends)]
            # per column: each batch's part (views of the group's arrays or tensors)
            parts = [self._split(tensors.get(name, array), part, rows) for name, array in
                     arrays.items()]  # fmt: skip
            names = list(arrays)
            for batch, *values in zip(batches[a:b], *parts, strict=True):
                batch.data = dict(zip(names, values, strict=True))
        self._ready.extend(batches)

    def _row_bytes(self) -> int:
        """Bytes a sample takes in the gathered arrays."""
        if self._sample_bytes is None:
            shapes = self.backend.shapes().values()
            self._sample_bytes = sum(int(np.prod(s)) * d.itemsize for s, d in shapes)
        return self._sample_bytes

    def _split(self, values: Any, sizes: list[int], rows: list[slice]) -> Sequence[Any]:
        """``values`` (a group's column) cut into the batches' parts."""
        if isinstance(values, np.ndarray) and values.dtype.kind == "O":
            return [values[r] if self.objects == "array" else values[r].tolist() for r in rows]
        if self._from_numpy is not None and isinstance(values, np.ndarray):
            tensor = self._from_numpy(values)  # one conversion per group and column
            return tensor.split(sizes) if len(sizes) > 1 else (tensor,)
        return [values[r] for r in rows]

    def close(self) -> None:
        super().close()
        self._threads.close()

    def produce(self) -> Batch:
        if not self._ready:
            self._fill()
        return self._ready.popleft()

    def produce_group(self) -> list[Batch]:
        if not self._ready:
            self._fill()
        items = list(self._ready)
        self._ready.clear()
        return items
