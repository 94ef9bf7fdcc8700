"""The loader's epochs: which batches an epoch holds, in which order, and where it stands
(a mixin of :class:`~feedline.loader.Loader`, kept apart so the loader's own module holds
its configuration and iteration).

The order itself is a pure function of (row-group sizes, seed, epoch, rank, world size)
(:mod:`feedline.loader.order.sample_order`); the next epoch's is drawn ahead in the background
(:mod:`feedline.loader.order.ahead`), and a resumed epoch's batches come from
:func:`feedline.loader.order.resume.epoch_plan`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.order.ahead import OrderAhead
from feedline.loader.order.resume import epoch_plan
from feedline.loader.order.sample_order import EpochPlan

__all__ = ["LoaderEpochs", "int_option"]


def int_option(name: str, value: Any, low: int) -> int:
    """``value`` as an int, when it is one of at least ``low``; else ``ConfigurationError``.

    Examples
    --------
    >>> int_option("batch_size", 32, 1)
    32
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigurationError(
            f"Loader: {name} must be an int >= {low}, got {value!r}. "
            f"Fix: pass {name}={low} or more."
        )
    return int(value)


class LoaderEpochs:
    """The epochs of a :class:`~feedline.loader.Loader`: plans, orders and position."""

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch

    @property
    def num_samples(self) -> int:
        """Rows (or windows) in one epoch, before sharding."""
        return self._prepare().num_samples

    def _plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's plan of ``epoch`` (default: the current one, with its segments)."""
        backend = self._prepare()
        epoch = self._epoch if epoch is None else epoch
        segments = self._segments if epoch == self._epoch else ()
        key = (epoch, segments, self.shuffle, backend.window, self.seed)
        if self._plan_cache is None or self._plan_cache[0] != key:
            order = self._orders().get(shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                                       window=backend.window)  # fmt: skip
            plan = epoch_plan(
                order, segments, rank=self.rank, world_size=self.world_size,
                batch_size=self.batch_size, drop_last=self.drop_last, pad_last=self.pad_last,
            )  # fmt: skip
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    def _orders(self) -> OrderAhead:
        """The epochs' orders, the next one drawn ahead (:mod:`feedline.loader.order.ahead`)."""
        if self._order_ahead is None:
            backend = self._prepare()  # an order drawn ahead may take an eighth of the cache
            self._order_ahead = OrderAhead(backend.sizes, max_bytes=backend.nbytes // 8)
        return self._order_ahead

    def _draw_ahead(self, epoch: int) -> None:
        """Start drawing epoch ``epoch``'s order (called by the gather, mid-epoch)."""
        self._orders().ahead(shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                             window=self._prepare().window)  # fmt: skip

    def __len__(self) -> int:
        """Batches per epoch on this rank (the rest of a resumed epoch after an elastic resume)."""
        if not self._segments:
            n, step = self.num_samples, self.world_size * self.batch_size
            return n // step if self.drop_last else -(-n // step)
        return self._plan().num_batches

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration.

        Right after :meth:`load_state_dict`, setting the restored epoch keeps the restored
        position, so ``for epoch in range(state["epoch"], E): loader.set_epoch(epoch)``
        resumes exactly.

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(6).loader(batch_size=3, format="numpy")
        >>> loader.set_epoch(1)
        >>> a = [b["id"].tolist() for b in loader]
        >>> loader.set_epoch(1)
        >>> a == [b["id"].tolist() for b in loader], loader.epoch
        (True, 1)
        """
        epoch = int_option("epoch", epoch, 0)
        if self._restored and epoch == self._epoch:
            return
        self._close_active()
        self._restored = False
        self._epoch, self._consumed, self._segments = epoch, 0, ()

    def _position(self) -> EpochPlan:
        """The current epoch's plan, moving on to the next epoch when this one is complete."""
        plan = self._plan()
        if plan.num_batches and self._consumed >= plan.num_batches:
            self._epoch, self._consumed, self._segments = self._epoch + 1, 0, ()
            plan = self._plan()
        return plan
