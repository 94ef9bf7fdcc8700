"""Move batches toward the accelerator: page-locked memory (``Pin``), the device (``ToDevice``).

Copies are issued per *group* of batches: the loader gathers small batches several at a time
into one buffer (:class:`~feedline.loader.nodes.Gather`), and when a group's tensors are
consecutive slices of one buffer they travel in one ``to(device, non_blocking=True)`` per
column, then are cut into the batches' views on the device. On CUDA the copies run on a side
stream; the caller's stream waits for a group's copy (a CUDA event) the first time it takes a
batch of it, and the group's device memory is recorded on that stream so the caching allocator
never hands it out early.

* :class:`ToDevice` does it all in the caller's thread, one group ahead.
* :class:`CopyToDevice` issues the copies wherever it is pulled: placed before a
  :class:`~feedline.loader.nodes.Prefetch`, in its background thread, so the training loop's
  thread only waits on an event (the :class:`~feedline.loader.Loader`'s default pipeline with
  ``device=`` and ``prefetch > 0``); :class:`AwaitDevice` after the prefetch does that wait.

All import torch only when they have work to do, so a pipeline on a machine without CUDA
(or without torch, for ``ToDevice(None)``) builds and runs: ``Pin`` then passes batches
through with a warning, ``ToDevice`` to ``"cpu"`` or ``None`` is a no-op.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline.loader.adapters.formats import can_pin
from feedline.loader.nodes.node import Batch, Node, Stage

__all__ = ["AwaitDevice", "CopyToDevice", "Pin", "ToDevice"]


class Pin(Stage):
    """Copy each batch's tensors (or arrays) into page-locked memory, for fast async copies.

    Tensors already pinned (the Loader gathers straight into pinned buffers when it can)
    pass as they are. Without CUDA it warns once and passes batches through.

    Examples
    --------
    >>> import warnings
    >>> import feedline as fl
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     node = Pin(fl.range(4).loader(batch_size=2, format="torch").source_node())
    >>> len(list(node))
    2
    """

    def __init__(self, source: Node) -> None:
        super().__init__(source)
        self.active = can_pin("torch", stacklevel=3)

    def produce(self) -> Batch:
        item = self.source.next()
        if self.active and isinstance(item.data, Mapping):
            item.data = {k: _pinned(v) for k, v in item.data.items()}
        return item


def _pinned(value: Any) -> Any:
    import torch

    if isinstance(value, np.ndarray) and value.dtype.kind != "O":
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor) and not value.is_pinned():
        return value.pin_memory()
    return value


class _Pending:
    """A group's copy in flight: its event, its device tensors, the stream that waited last."""

    __slots__ = ("event", "stream", "tensors")

    def __init__(self, event: Any, tensors: list[Any]) -> None:
        self.event, self.tensors, self.stream = event, tensors, None


def _span(values: Sequence[Any]) -> Any:
    """One CPU tensor over ``values`` when they are consecutive rows of one buffer, else None."""
    import torch

    first = values[0]
    if len(values) < 2 or not isinstance(first, torch.Tensor) or first.dim() == 0:
        return None
    if first.device.type != "cpu" or not first.is_contiguous():
        return None
    storage, row = first.untyped_storage().data_ptr(), first[0].numel()
    offset = first.storage_offset() + first.numel()
    for value in values[1:]:
        if not (isinstance(value, torch.Tensor) and value.dtype == first.dtype
                and value.shape[1:] == first.shape[1:] and value.is_contiguous()
                and value.untyped_storage().data_ptr() == storage
                and value.storage_offset() == offset):  # fmt: skip
            return None
        offset += value.numel()
    rows = (offset - first.storage_offset()) // max(row, 1)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


class _Copier:
    """Issues a group's copies (on a side stream on CUDA) and makes the caller's stream wait."""

    def __init__(self, device: Any, non_blocking: bool) -> None:
        import torch

        self.device = torch.device(device)
        self.non_blocking = bool(non_blocking)
        self.stream: Any = None
        self.index: int | None = None
        if self.device.type == "cuda":
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.index = self.device.index
            self.stream = torch.cuda.Stream(device=self.device)

    @property
    def active(self) -> bool:
        return self.device.type != "cpu"

    def _to(self, value: Any) -> Any:
        import torch

        if isinstance(value, np.ndarray) and value.dtype.kind != "O":
            value = torch.from_numpy(value)
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=self.non_blocking)
        return value

    def _move(self, items: list[Batch]) -> list[Any]:
        """Replace each item's data by device tensors; the device tensors made (to record)."""
        keys = list(items[0].data) if isinstance(items[0].data, Mapping) else []
        same = all(isinstance(i.data, Mapping) and list(i.data) == keys for i in items)
        made: list[Any] = []
        if not same:  # batches of different keys: one by one
            for item in items:
                if isinstance(item.data, Mapping):
                    item.data = {k: self._to(v) for k, v in item.data.items()}
                    made.extend(item.data.values())
            return made
        columns: dict[str, list[Any]] = {}
        for key in keys:
            values = [item.data[key] for item in items]
            span = _span(values)
            if span is None:
                columns[key] = [self._to(v) for v in values]
                made.extend(columns[key])
            else:
                moved = self._to(span)
                columns[key] = list(moved.split([len(v) for v in values]))
                made.append(moved)
        for i, item in enumerate(items):
            item.data = {key: columns[key][i] for key in keys}
        return made

    def copy(self, items: list[Batch]) -> list[Batch]:
        """Start copying ``items`` to the device; on CUDA each one's ``pending`` is set."""
        if self.stream is None:  # another accelerator: no side stream
            self._move(items)
            return items
        import torch

        with torch.cuda.stream(self.stream):
            made = self._move(items)
            event = torch.cuda.Event()
            event.record(self.stream)
        pending = _Pending(event, [t for t in made if isinstance(t, torch.Tensor)])
        for item in items:
            item.pending = pending
        return items

    def wait(self, item: Batch) -> Batch:
        """Make the caller's current stream wait for ``item``'s copy (once per group and stream)."""
        pending, item.pending = item.pending, None
        if pending is None:
            return item
        import torch

        current = torch.cuda.current_stream(self.index)
        if pending.stream != current:
            current.wait_event(pending.event)
            for tensor in pending.tensors:
                tensor.record_stream(current)
            pending.stream = current
        return item


class CopyToDevice(Stage):
    """Start each group's copy to ``device`` where this node is pulled (see the module doc).

    Its batches hold device tensors whose copy may still be running: deliver them through an
    :class:`AwaitDevice` (or use :class:`ToDevice`, which does both). ``device=None`` or a
    CPU device: batches pass unchanged.

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.loader.nodes.collate import Format
    >>> from feedline.loader.nodes.prefetch import Prefetch
    >>> loader = fl.range(8).loader(batch_size=2, shuffle=False, format="torch")
    >>> node = AwaitDevice(Prefetch(CopyToDevice(loader.source_node(), "cpu")), "cpu")
    >>> [b.data["id"].tolist() for b in node]
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    """

    def __init__(self, source: Node, device: Any = None, *, non_blocking: bool = True) -> None:
        super().__init__(source)
        self._copier = _Copier(device, non_blocking) if device is not None else None
        self._ready: deque[Batch] = deque()

    @property
    def active(self) -> bool:
        """Whether batches are moved at all (not for ``None`` or a CPU device)."""
        return self._copier is not None and self._copier.active

    def clear(self) -> None:
        self._ready.clear()

    def _next_group(self) -> list[Batch]:
        items = self.source.next_group()
        return self._copier.copy(items) if self.active else items  # type: ignore[union-attr]

    def produce(self) -> Batch:
        if not self._ready:
            self._ready.extend(self._next_group())
        return self._ready.popleft()

    def produce_group(self) -> list[Batch]:
        if self._ready:
            items = list(self._ready)
            self._ready.clear()
            return items
        return self._next_group()


class AwaitDevice(Stage):
    """Make the caller's CUDA stream wait for each batch's copy started by :class:`CopyToDevice`.

    Waits once per group and stream (an event: the CPU never blocks) and records the group's
    device memory on that stream. A no-op for batches with nothing in flight.

    Examples
    --------
    >>> import feedline as fl
    >>> loader = fl.range(4).loader(batch_size=2, shuffle=False, format="torch")
    >>> [len(b) for b in AwaitDevice(loader.source_node(), None)]
    [2, 2]
    """

    def __init__(self, source: Node, device: Any = None) -> None:
        super().__init__(source)
        self._copier = _Copier(device, True) if device is not None else None

    def produce(self) -> Batch:
        item = self.source.next()
        return self._copier.wait(item) if self._copier is not None else item

    def produce_group(self) -> list[Batch]:
        items = self.source.next_group()
        if self._copier is not None:
            for item in items:
                self._copier.wait(item)
        return items


class ToDevice(Stage):
    """Move each batch's tensors to ``device`` with ``non_blocking=True`` on a side stream.

    On CUDA the copy of the next group of batches is issued on a separate stream while the
    caller works on the current one; before a batch is returned the caller's current stream
    waits for its group's copy (an event) and the group's tensors are recorded on that
    stream, so the allocator never reuses their memory early. Pinned sources (:class:`Pin`,
    or the loader's ``pin_memory=True``) make the copies truly asynchronous. Everything runs
    in the caller's thread; to issue the copies in a prefetch thread instead, compose
    :class:`CopyToDevice` → :class:`~feedline.loader.nodes.Prefetch` → :class:`AwaitDevice`.
    ``device=None`` or a CPU device: batches pass unchanged (torch need not be installed for
    ``None``).

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.loader.nodes.collate import Format
    >>> loader = fl.range(4).loader(batch_size=2)
    >>> node = ToDevice(Format(loader.source_node(), "torch"), "cpu")
    >>> [b.data["id"].device.type for b in node]
    ['cpu', 'cpu']
    """

    def __init__(self, source: Node, device: Any = None, *, non_blocking: bool = True) -> None:
        super().__init__(source)
        self._copier = _Copier(device, non_blocking) if device is not None else None
        self._ready: deque[Batch] = deque()
        self._ahead: list[Batch] | None = None
        self._error: Exception | None = None

    @property
    def device(self) -> Any:
        """The torch device batches go to (``None`` when none was given)."""
        return None if self._copier is None else self._copier.device

    @property
    def active(self) -> bool:
        """Whether batches are moved at all (not for ``None`` or a CPU device)."""
        return self._copier is not None and self._copier.active

    def clear(self) -> None:
        self._ready.clear()
        self._ahead, self._error = None, None

    def produce(self) -> Batch:
        if not self.active:
            return self.source.next()
        copier = self._copier
        assert copier is not None
        if not self._ready:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._ahead is None:
                self._ahead = copier.copy(self.source.next_group())
            self._ready.extend(self._ahead)
            try:  # start the next group's copy before handing this one over
                self._ahead = copier.copy(self.source.next_group())
            except StopIteration:
                self._ahead = None
            except Exception as exc:  # noqa: BLE001 - raised at the next call: this group is fine
                self._ahead, self._error = None, exc
        return copier.wait(self._ready.popleft())
