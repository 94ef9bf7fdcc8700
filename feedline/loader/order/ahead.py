"""Epoch orders drawn off the training loop's thread, the next epoch's ahead of time.

An epoch's order is a pure function of (row-group sizes, seed, epoch, window) (see
:func:`~feedline.loader.order.sample_order.global_order`), so it may be computed anywhere and early
without changing a single index. Drawing the permutation of a million rows takes about
35 ms: half an epoch of a fast cached loader, spent on the caller's thread between two
epochs. An :class:`OrderAhead` draws the next epoch's order in a short-lived background
thread while the current epoch is being read (NumPy's shuffle releases the GIL, so it
runs beside the training loop) and hands it over when that epoch starts; an order nobody
asked for ahead is computed on the spot, as before.

Only shuffled orders of at least :data:`MIN_ROWS` rows are drawn ahead (a smaller one
costs less than starting a thread), only one at a time (memory holds at most one order
beyond the current epoch's), and only when its 8 bytes a row stay within ``max_bytes``
(the loader passes an eighth of its cache: windows over 0.3 GB of series number 10M,
whose order alone is 78 MB).

Examples
--------
>>> from feedline.loader.order.sample_order import global_order
>>> orders = OrderAhead([60_000, 60_000])
>>> orders.ahead(shuffle=True, seed=3, epoch=1, window=None)  # drawn in the background
>>> got = orders.get(shuffle=True, seed=3, epoch=1, window=None)
>>> bool((got == global_order([60_000, 60_000], shuffle=True, seed=3, epoch=1,
...                           window=None)).all())
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from feedline.loader.order.sample_order import Order, global_order

__all__ = ["MIN_ROWS", "OrderAhead"]

#: shuffled orders of at least this many rows are drawn ahead in a background thread
MIN_ROWS = 100_000


class _Draw:
    """One order drawn in its own (non-daemon, short-lived) thread."""

    def __init__(self, draw: Callable[[], Order]) -> None:
        self._result: Order | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(draw,), name="feedline-order")
        self._thread.start()

    def _run(self, draw: Callable[[], Order]) -> None:
        try:
            self._result = draw()
        except BaseException as exc:  # noqa: BLE001 - re-raised where the order is asked for
            self._error = exc

    def result(self) -> Order:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class OrderAhead:
    """The global orders of one dataset's epochs: asked-for ahead ones drawn in the background.

    Parameters
    ----------
    sizes:
        The row-group sizes the orders are drawn over (the loader's backend's).
    min_rows:
        Orders of fewer rows are never drawn ahead.
    max_bytes:
        Orders larger than this (8 bytes a row) are never drawn ahead; ``None``: no limit.
    """

    def __init__(
        self, sizes: Sequence[int], *, min_rows: int = MIN_ROWS, max_bytes: int | None = None
    ) -> None:
        self.sizes = [int(s) for s in sizes]
        self.min_rows = int(min_rows)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._ahead: tuple[tuple[Any, ...], _Draw] | None = None

    def _draw(self, key: tuple[Any, ...]) -> Order:
        shuffle, seed, epoch, window = key
        return global_order(self.sizes, shuffle=shuffle, seed=seed, epoch=epoch, window=window)

    def get(self, *, shuffle: bool, seed: int, epoch: int, window: int | None) -> Order:
        """Epoch ``epoch``'s order: the one drawn ahead if it matches, else drawn now."""
        key = (bool(shuffle), seed, epoch, window)
        with self._lock:
            ahead = self._ahead
            if ahead is not None and ahead[0] == key:
                self._ahead = None  # handed over: memory holds it once
            else:
                ahead = None
        return ahead[1].result() if ahead is not None else self._draw(key)

    def ahead(self, *, shuffle: bool, seed: int, epoch: int, window: int | None) -> None:
        """Start drawing epoch ``epoch``'s order in the background (replacing any other)."""
        key = (bool(shuffle), seed, epoch, window)
        rows = sum(self.sizes)
        if (
            not shuffle
            or rows < self.min_rows
            or (self.max_bytes is not None and 8 * rows > self.max_bytes)
        ):
            return
        with self._lock:
            if self._ahead is None or self._ahead[0] != key:
                self._ahead = (key, _Draw(lambda: self._draw(key)))
