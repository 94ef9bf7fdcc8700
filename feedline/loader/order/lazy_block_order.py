"""The two-level shuffle's order evaluated lazily, pool by pool.

:func:`~feedline.loader.order.sample_order.block_shuffle_order` builds the whole order (``n``
int64). :class:`LazyBlockOrder` is the same order, value for value, for chosen positions:
it keeps the row-group sizes and the pools (one id per row group) and, for the positions
asked for, shuffles only the pools they fall in, one at a time, with the pool's own
generator (the same draws as the whole order makes). Memory: the rows of one pool (the
``shuffle_window`` row groups a streaming reader holds anyway) plus the positions asked for.

Examples
--------
>>> import numpy as np
>>> order = LazyBlockOrder([3, 3], [np.array([1]), np.array([0])],
...                        lambda i, rows: None)  # pools left in storage order
>>> order.take([0, 1, 2, 3]).tolist(), len(order)
([3, 4, 5, 0], 6)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError

__all__ = ["LazyBlockOrder"]


class LazyBlockOrder:
    """Rows of the row groups of ``pools`` (in pool order), each pool's rows shuffled in
    place by ``shuffle_pool(i, rows)``; evaluated at the positions asked for.

    Parameters
    ----------
    sizes:
        Rows of each row group (group ``g`` holds rows ``offsets[g]:offsets[g+1]``).
    pools:
        The row-group ids of each pool, in yield order.
    shuffle_pool:
        Shuffles pool ``i``'s rows (int64, in group order) in place; a pure function of
        ``i``, so any pool can be made on its own.
    """

    def __init__(
        self,
        sizes: Sequence[int] | np.ndarray,
        pools: Sequence[np.ndarray],
        shuffle_pool: Callable[[int, np.ndarray], None],
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.pools = [np.asarray(p, dtype=np.int64) for p in pools]
        rows = [int(self.sizes[p].sum()) for p in self.pools]
        self.bounds = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.shuffle_pool = shuffle_pool
        self.n = int(self.bounds[-1])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"LazyBlockOrder({self.n} rows, {len(self.pools)} pools)"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.take(np.arange(self.n, dtype=np.int64))
        return out if dtype is None else out.astype(dtype, copy=False)

    def pool_rows(self, i: int) -> np.ndarray:
        """Pool ``i``'s rows in yield order (int64).

        Examples
        --------
        >>> LazyBlockOrder([2, 1], [np.array([1, 0])], lambda i, r: None).pool_rows(0).tolist()
        [2, 0, 1]
        """
        groups = self.pools[i]
        lengths = self.sizes[groups]
        starts = np.cumsum(lengths) - lengths
        shift = np.repeat(self.offsets[groups] - starts, lengths)
        rows = np.arange(int(lengths.sum()), dtype=np.int64) + shift
        self.shuffle_pool(i, rows)
        return rows

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The rows at ``positions`` of the order (int64, same shape).

        Examples
        --------
        >>> LazyBlockOrder([2], [np.array([0])], lambda i, r: None).take([[1], [0]]).tolist()
        [[1], [0]]
        """
        pos = np.asarray(positions)
        if pos.size and (
            not np.issubdtype(pos.dtype, np.integer) or pos.min() < 0 or pos.max() >= self.n
        ):
            raise ConfigurationError(
                f"LazyBlockOrder: positions must be integers in [0, {self.n}). Fix: ask for "
                "positions of the epoch's order only."
            )
        flat = pos.astype(np.int64).reshape(-1)
        out = np.empty(flat.size, dtype=np.int64)
        pool_of = np.searchsorted(self.bounds, flat, side="right") - 1
        by_pool = np.argsort(pool_of, kind="stable")
        cuts = np.flatnonzero(np.diff(pool_of[by_pool])) + 1
        for chunk in np.split(by_pool, cuts) if flat.size else []:
            i = int(pool_of[chunk[0]])  # one pool at a time: its rows, then dropped
            out[chunk] = self.pool_rows(i)[flat[chunk] - self.bounds[i]]
        return out.reshape(pos.shape)
