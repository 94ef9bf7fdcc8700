"""Move batches toward the accelerator: page-locked memory (``Pin``), the device (``ToDevice``).

Both import torch only when they have work to do, so a pipeline on a machine without CUDA
(or without torch, for ``ToDevice(None)``) builds and runs: ``Pin`` then passes batches
through with a warning, ``ToDevice`` to ``"cpu"`` or ``None`` is a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline.loader.formats import can_pin
from feedline.loader.nodes.base import Batch, Node, Stage

__all__ = ["Pin", "ToDevice"]


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


class ToDevice(Stage):
    """Move each batch's tensors to ``device`` with ``non_blocking=True`` on a side stream.

    On CUDA the copy of batch ``k + 1`` is issued on a separate stream while the caller
    works on batch ``k``; before a batch is returned the caller's current stream waits for
    its copy (an event) and each tensor is recorded on that stream, so the allocator never
    reuses its memory early. Pinned sources (:class:`Pin`) make the copies truly
    asynchronous. ``device=None`` or a CPU device: batches pass unchanged (torch need not be
    installed for ``None``).

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.loader.nodes import Format
    >>> loader = fl.range(4).loader(batch_size=2)
    >>> node = ToDevice(Format(loader.source_node(), "torch"), "cpu")
    >>> [b.data["id"].device.type for b in node]
    ['cpu', 'cpu']
    """

    def __init__(self, source: Node, device: Any = None, *, non_blocking: bool = True) -> None:
        super().__init__(source)
        self.non_blocking = bool(non_blocking)
        self.device = None
        self._stream: Any = None
        self._ahead: tuple[Batch, Any] | None = None
        self._error: Exception | None = None
        if device is not None:
            import torch

            self.device = torch.device(device)
            if self.device.type == "cuda":
                self._stream = torch.cuda.Stream(device=self.device)

    @property
    def active(self) -> bool:
        """Whether batches are moved at all (not for ``None`` or a CPU device)."""
        return self.device is not None and self.device.type != "cpu"

    def clear(self) -> None:
        self._ahead, self._error = None, None

    def _move(self, item: Batch) -> tuple[Batch, Any]:
        import torch

        def to(value: Any) -> Any:
            if isinstance(value, np.ndarray) and value.dtype.kind != "O":
                value = torch.from_numpy(value)
            if isinstance(value, torch.Tensor):
                return value.to(self.device, non_blocking=self.non_blocking)
            return value

        if self._stream is None:  # another accelerator: no side stream
            item.data = {k: to(v) for k, v in item.data.items()}
            return item, None
        with torch.cuda.stream(self._stream):
            item.data = {k: to(v) for k, v in item.data.items()}
            event = torch.cuda.Event()
            event.record(self._stream)
        return item, event

    def produce(self) -> Batch:
        if not self.active:
            return self.source.next()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._ahead is None:
            self._ahead = self._move(self.source.next())
        item, event = self._ahead
        try:  # start the next batch's copy before handing this one over
            self._ahead = self._move(self.source.next())
        except StopIteration:
            self._ahead = None
        except Exception as exc:  # noqa: BLE001 - raised at the next call: this batch is fine
            self._ahead, self._error = None, exc
        if event is not None:
            import torch

            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for value in item.data.values():
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    value.record_stream(current)
        return item
