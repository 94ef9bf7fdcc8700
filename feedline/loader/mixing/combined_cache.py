"""The sources' memory caches as one cache: a mixed batch is then one take per block.

When every source is held in a :class:`~feedline.loader.data.memory_cache.ColumnCache` of the
same layout (the same columns, dtypes and shapes, packed the same way), their arrays are
concatenated once: source ``s``'s row ``i`` is row ``bases[s] + i``. A mixed batch is then
gathered with one ``np.take`` per block, in the batch's order, like one dataset's batch (no
copy per source and scatter). The sources' own caches are released, so the memory held is
about the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.loader.data.memory_cache import ColumnCache

__all__ = ["combine_caches"]


def _layout(cache: ColumnCache) -> Any:
    return (cache.packing, {k: (a.dtype, a.shape[1:]) for k, a in cache.storage.items()})


def combine_caches(sources: Sequence[Any]) -> tuple[ColumnCache, np.ndarray] | None:
    """One cache over ``sources`` (the backends' ``source``), and each source's first row in
    it; ``None`` when they are not all memory caches of one layout.

    Examples
    --------
    >>> a, b = ColumnCache({"x": np.arange(3)}), ColumnCache({"x": np.arange(10, 12)})
    >>> cache, bases = combine_caches([a, b])
    >>> bases.tolist(), cache.gather(np.array([4, 0]))["x"].tolist()
    ([0, 3], [11, 0])
    """
    if not sources or not all(isinstance(s, ColumnCache) for s in sources):
        return None
    caches = [s.wait() for s in sources]
    first = _layout(caches[0])
    if any(_layout(c) != first for c in caches[1:]):
        return None
    storage = {k: np.concatenate([c.storage[k] for c in caches]) for k in caches[0].storage}
    sizes = [c.num_rows for c in caches]
    bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    packing = caches[0].packing
    combined = ColumnCache(packing=packing, storage=storage) if packing is not None else (
        ColumnCache(storage))  # fmt: skip
    return combined, bases
