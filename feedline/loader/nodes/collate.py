"""Shape the batch for the training loop: stack samples (``Collate``), convert (``Format``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.adapters.formats import FORMATS, to_format
from feedline.loader.nodes.node import Batch, Node, Stage
from feedline.loader.nodes.samples import collate_samples

__all__ = ["Collate", "Format"]


class Collate(Stage):
    """Turn a batch of samples (a list of dicts) into arrays with ``collate``.

    The default stacks arrays and numbers into one array per key and keeps other values as
    lists (:func:`~feedline.loader.nodes.samples.collate_samples`, what
    :class:`~feedline.loader.nodes.Map` does for its outputs). Batches that already hold a
    dict of columns pass through unchanged.

    Examples
    --------
    >>> from feedline.loader.nodes.indices import Order
    >>> class Samples(Stage):  # a node producing sample dicts
    ...     def produce(self):
    ...         b = self.source.next()
    ...         b.data = [{"i": int(i)} for i in b.indices]
    ...         return b
    >>> node = Collate(Samples(Order.of([4], batch_size=2, shuffle=False)))
    >>> [b.data["i"].tolist() for b in node]
    [[0, 1], [2, 3]]
    """

    def __init__(
        self, source: Node, collate: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None
    ) -> None:
        super().__init__(source)
        self.collate = collate or collate_samples

    def produce(self) -> Batch:
        item = self.source.next()
        if isinstance(item.data, list):
            item.data = self.collate(item.data)
        return item


class Format(Stage):
    """Convert each batch's arrays for the training loop: ``"torch"``, ``"numpy"``, ``"tf"``.

    ``padding_mask=True`` adds ``"_padded"``: True where a sample repeats one to pad the
    epoch. Tensors share memory with the arrays (``torch.from_numpy``).

    Examples
    --------
    >>> import feedline as fl
    >>> loader = fl.range(4).loader(batch_size=2, shuffle=False)
    >>> [sorted(b.data) for b in Format(loader.source_node(), "numpy", padding_mask=True)]
    [['_padded', 'id'], ['_padded', 'id']]
    """

    def __init__(self, source: Node, fmt: str = "torch", *, padding_mask: bool = False) -> None:
        if fmt not in FORMATS:
            raise ConfigurationError(
                f"Format: fmt={fmt!r} is not one of {FORMATS}. Fix: pass one of those."
            )
        super().__init__(source)
        self.fmt, self.padding_mask = fmt, bool(padding_mask)

    def produce(self) -> Batch:
        return self._convert(self.source.next())

    def produce_group(self) -> list[Batch]:
        return [self._convert(item) for item in self.source.next_group()]

    def _convert(self, item: Batch) -> Batch:
        data = item.data
        if self.padding_mask:
            data = dict(data)
            padded = item.padded
            data["_padded"] = (np.zeros(len(item.indices), dtype=bool) if padded is None
                               else padded.copy())  # fmt: skip
        item.data = to_format(data, self.fmt)
        return item
