"""The first node: this rank's batches of row indices, from the pure order functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from feedline.loader.nodes.node import Batch, Node, parse_position
from feedline.loader.order.sample_order import EpochPlan, global_order, split_for_rank

__all__ = ["Order"]


class Order(Node):
    """Batches of global row indices: epoch ``epoch`` of ``plan``, from batch ``batch`` on.

    Parameters
    ----------
    plan:
        An :class:`~feedline.loader.order.sample_order.EpochPlan`, or a function
        ``epoch -> EpochPlan`` (then :meth:`reset` may move to another epoch).
    epoch, batch:
        Where to start.
    ahead:
        Called with the next epoch's number once an epoch's second batch is asked for: the
        loader starts drawing that epoch's order then (see
        :mod:`feedline.loader.order.ahead`), so a new epoch does not wait for it. (Asked at
        half the epoch, a fast cached loader's draw of a million rows often was not done
        when the next epoch began on a busy 2-core machine: the loop waited 40-130 ms.)

    Its state is the next batch's position, ``{"epoch": e, "batches": k}`` (``k`` batches of
    epoch ``e`` delivered); ``reset(None)`` starts the current epoch again.

    Examples
    --------
    >>> node = Order.of([5, 5], batch_size=4, shuffle=False, drop_last=False)
    >>> [b.indices.tolist() for b in node]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> node.reset({"epoch": 1, "batches": 0})
    >>> len(next(node)), node.get_state()
    (4, {'epoch': 1, 'batches': 1})
    """

    def __init__(
        self,
        plan: EpochPlan | Callable[[int], EpochPlan],
        *,
        epoch: int = 0,
        batch: int = 0,
        ahead: Callable[[int], None] | None = None,
    ) -> None:
        self._make = plan if callable(plan) else None
        self._fixed = None if callable(plan) else plan
        self.epoch, self.batch = int(epoch), int(batch)
        self._plan: EpochPlan | None = None
        self._ahead, self._told = ahead, -1

    @classmethod
    def of(
        cls,
        row_group_sizes: Sequence[int],
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        pad_last: bool = False,
        window: int | None = None,
        epoch: int = 0,
    ) -> Order:
        """An ``Order`` over row groups of these sizes, one plan per epoch (a pure function
        of the arguments and the epoch; see :mod:`feedline.loader.order.sample_order`)."""

        def plan(e: int) -> EpochPlan:
            order = global_order(row_group_sizes, shuffle=shuffle, seed=seed, epoch=e,
                                 window=window)  # fmt: skip
            return split_for_rank(order, rank=rank, world_size=world_size, batch_size=batch_size,
                                  drop_last=drop_last, pad_last=pad_last)  # fmt: skip

        return cls(plan, epoch=epoch)

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan."""
        if self._plan is None:
            if self._make is None:
                assert self._fixed is not None  # __init__ sets exactly one of _make and _fixed
                self._plan = self._fixed
            else:
                self._plan = self._make(self.epoch)
        return self._plan

    def upcoming(self) -> np.ndarray:
        """The row indices of the batches still to come in this epoch, in order."""
        return self.plan.indices[self.batch * self.plan.batch_size :]

    def next(self) -> Batch:
        plan, k = self._plan or self.plan, self.batch
        if k >= plan.num_batches:
            raise StopIteration
        self.batch = k + 1
        if self._ahead is not None and k >= 1 and self._told != self.epoch:
            self._told = self.epoch
            self._ahead(self.epoch + 1)
        start = k * plan.batch_size
        stop = start + plan.batch_size
        return Batch(self.epoch, k, plan.indices[start:stop], plan.padded[start:stop])

    def take(self, count: int) -> tuple[list[Batch], np.ndarray]:
        """The next ``count`` batches (fewer at the epoch's end) and their row indices as one
        array (a view of the plan: a gather of several batches needs no concatenation).

        Examples
        --------
        >>> node = Order.of([5], batch_size=2, shuffle=False, drop_last=False)
        >>> batches, rows = node.take(2)
        >>> [b.number for b in batches], rows.tolist(), node.take(9)[1].tolist()
        ([0, 1], [0, 1, 2, 3], [4])
        """
        plan, k = self._plan or self.plan, self.batch
        stop = min(plan.num_batches, k + max(1, int(count)))
        batches = [self.next() for _ in range(stop - k)]
        if not batches:
            raise StopIteration
        return batches, plan.indices[k * plan.batch_size : stop * plan.batch_size]

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        position = parse_position(initial_state, "Order")
        epoch, batch = (self.epoch, 0) if position is None else position
        if epoch != self.epoch and self._make is not None:
            self._plan = None
        self.epoch, self.batch = epoch, batch

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batch}
