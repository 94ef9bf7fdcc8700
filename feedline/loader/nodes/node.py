"""The node protocol: small iterators with ``next`` / ``reset(initial_state)`` / ``get_state``.

Every node yields :class:`Batch` records, one per batch of the epoch, in order. A record
carries where it stands (``epoch``, ``number``: the batch's number in the epoch), the global
row indices of its samples (``indices``, what per-sample randomness is keyed by), which of
them pad the epoch (``padded``) and its payload (``data``: a dict of columns, or a list of
sample dicts between a :class:`~feedline.loader.nodes.Map` that does not collate and a
:class:`~feedline.loader.nodes.Collate`). Nodes fill in ``data`` as the record passes.

A node's state is the position of the next batch it will deliver, ``{"epoch": e, "batches":
k}`` (``k`` batches of epoch ``e`` delivered: the key and meaning of ``Loader.state_dict()``'s
``"epoch"`` and ``"batches"``, so ``reset(loader.state_dict())`` works too): tiny, JSON-safe
and exact through every node, because each node counts the records it
has *delivered* (a prefetching node that read ahead still reports the consumer's position)
and every downstream result is a pure function of the batch's indices. ``reset(state)``
passes the state down to the source (an :class:`~feedline.loader.nodes.Order`), which starts
there; ``reset(None)`` starts the source's current epoch from its first batch. ``state_dict``
/ ``load_state_dict`` are aliases, for code written against ``torch.nn.Module``-like objects.
A state of an earlier feedline, ``{"epoch": e, "batch": k}``, is still accepted by ``reset``.

Examples
--------
>>> import numpy as np
>>> from feedline.loader.nodes.indices import Order
>>> from feedline.loader.order.sample_order import split_for_rank
>>> node = Order(split_for_rank(np.arange(6), rank=0, world_size=1, batch_size=2,
...                             drop_last=True))
>>> [b.indices.tolist() for b in node]
[[0, 1], [2, 3], [4, 5]]
>>> node.reset({"epoch": 0, "batches": 2})
>>> next(node).indices.tolist(), node.get_state()
([4, 5], {'epoch': 0, 'batches': 3})
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeGuard

import numpy as np

from feedline.errors import ConfigurationError

__all__ = ["Batch", "Node", "Stage", "parse_position"]


class Batch:
    """One batch on its way through the nodes (see the module docstring).

    ``skipped`` lists what a transform dropped from this batch (e.g.
    :class:`~feedline.preprocess.vision.augment.Skipped` markers), so it is counted where the
    batch is delivered. ``pending`` is set while the batch's tensors are still being copied to an
    accelerator (see :class:`~feedline.loader.nodes.CopyToDevice`).
    """

    __slots__ = ("data", "epoch", "indices", "number", "padded", "pending", "skipped")

    def __init__(
        self,
        epoch: int,
        number: int,
        indices: np.ndarray,
        padded: np.ndarray | None = None,
        data: Any = None,
    ) -> None:
        self.epoch, self.number, self.indices = epoch, number, indices
        self.padded, self.data = padded, data
        self.skipped: tuple[Any, ...] = ()
        self.pending: Any = None

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        keys = list(self.data) if isinstance(self.data, dict) else type(self.data).__name__
        return f"Batch(epoch={self.epoch}, number={self.number}, rows={len(self)}, data={keys})"


def parse_position(state: Mapping[str, Any] | None, where: str) -> tuple[int, int] | None:
    """``(epoch, batches)`` from a node state (``None`` stays ``None``), validated.

    The key is ``"batches"`` (as in ``Loader.state_dict()``); the ``"batch"`` of earlier
    node states is read as the same number. Other keys are ignored, so a loader state works.

    Examples
    --------
    >>> parse_position({"epoch": 1, "batches": 3}, "Order"), parse_position(
    ...     {"epoch": 1, "batch": 3}, "Order")
    ((1, 3), (1, 3))
    """
    if state is None:
        return None
    ok = isinstance(state, Mapping) and "epoch" in state
    ok = ok and ("batches" in state) != ("batch" in state)  # one of the two names
    epoch = state.get("epoch") if ok else None
    batches = state.get("batches", state.get("batch")) if ok else None
    if not (ok and _is_count(epoch) and _is_count(batches)):
        raise ConfigurationError(
            f"{where}.reset() got {state!r}; a node state is {{'epoch': e, 'batches': k}} with "
            "non-negative ints. Fix: pass what the node's get_state() returned, or None."
        )
    return int(epoch), int(batches)


def _is_count(value: object) -> TypeGuard[int | np.integer[Any]]:
    """Whether ``value`` is a non-negative int or numpy integer (a bool is not)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and bool(value >= 0)


class Node(Iterator[Batch]):
    """Base of the loader's nodes: ``next()``, ``reset(initial_state)``, ``get_state()``.

    Subclasses implement :meth:`next`, :meth:`reset` and :meth:`get_state`; :meth:`close`
    releases threads and processes (idempotent; a closed node can be reset and used again
    unless it says otherwise). Nodes are context managers.
    """

    def next(self) -> Batch:
        """The next batch; raises ``StopIteration`` at the end of the epoch."""
        raise NotImplementedError

    def next_group(self) -> list[Batch]:
        """The next batches at once, in order (at least one; ``StopIteration`` at the end).

        A node that makes batches in groups (a :class:`~feedline.loader.nodes.Gather` of small
        batches) hands a whole group over, so the nodes after it pass the group along in one
        call instead of one per batch. The default is ``[self.next()]``.
        """
        return [self.next()]

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        """Start again at ``initial_state`` (a :meth:`get_state` result) or the epoch's start."""
        raise NotImplementedError

    def get_state(self) -> dict[str, int]:
        """The position of the next batch this node delivers: ``{"epoch": e, "batches": k}``
        (``k`` batches of epoch ``e`` delivered so far)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, int]:
        """Alias of :meth:`get_state`."""
        return self.get_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Alias of ``reset(state)``."""
        self.reset(state)

    def close(self) -> None:
        """Release what the node holds (threads, processes, buffers)."""

    def __iter__(self) -> Node:
        return self

    def __next__(self) -> Batch:
        return self.next()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stage(Node):
    """A node with one source: it counts what it delivers and passes resets down.

    Subclasses implement :meth:`produce` (the next record, from ``self.source``) and may
    override :meth:`clear` (drop read-ahead state on reset).
    """

    def __init__(self, source: Node) -> None:
        if not isinstance(source, Node):
            raise ConfigurationError(
                f"{type(self).__name__} takes a feedline node as its source, got "
                f"{type(source).__name__}. Fix: start the pipeline with Order(...) (or "
                "loader.source_node()) and wrap nodes around it."
            )
        self.source = source
        self._position = self._source_position()

    def _source_position(self) -> tuple[int, int]:
        position = parse_position(self.source.get_state(), type(self.source).__name__)
        assert position is not None  # a node's state is never None
        return position

    def produce(self) -> Batch:
        raise NotImplementedError

    def clear(self) -> None:
        """Forget anything read ahead of the delivered position."""

    def produce_group(self) -> list[Batch]:
        """The next records at once (see :meth:`Node.next_group`); default ``[produce()]``."""
        return [self.produce()]

    def next(self) -> Batch:
        item = self.produce()
        self._position = (item.epoch, item.number + 1)
        return item

    def next_group(self) -> list[Batch]:
        items = self.produce_group()
        last = items[-1]
        self._position = (last.epoch, last.number + 1)
        return items

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        parse_position(initial_state, type(self).__name__)
        self.clear()
        self.source.reset(initial_state)
        self._position = self._source_position()

    def get_state(self) -> dict[str, int]:
        return {"epoch": self._position[0], "batches": self._position[1]}

    def close(self) -> None:
        self.clear()
        self.source.close()
