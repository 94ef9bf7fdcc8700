"""The loader's data path: cache in memory or stream row groups, decided from the schema.

:func:`open_backend` estimates the loader arrays' bytes from the schema and the row count
(metadata only) and, for ``cache="auto"``, caches when they fit the memory budget and
streams otherwise. A :class:`Backend` then hands each epoch a *session* whose
``gather(indices, out=None)`` returns the batch arrays.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.cache import file_layout, known_rows, load_cache
from feedline.loader.columns import ColumnSpec, column_specs, estimate_bytes
from feedline.loader.order import block_shuffle_pools
from feedline.loader.shard_cache import ShardCache
from feedline.loader.stream import PoolReader, StreamStats, sequential_pools
from feedline.loader.windows import Windows, WindowSampler

if TYPE_CHECKING:
    from feedline.dataset import Dataset

__all__ = ["Backend", "open_backend"]

#: bytes a shard cache folder may hold unless ``cache_limit`` says otherwise
DEFAULT_CACHE_LIMIT = 20 * 10**9
#: pools resident at once while streaming, plus slack for the batches in flight
STREAM_POOLS = 3


@dataclass
class Backend:
    """Where batches come from.

    Attributes
    ----------
    mode:
        ``"memory"`` (a cache or window sampler in ``source``) or ``"none"`` (streaming; the
        ``FileLayout`` in ``source``).
    sizes:
        Row-group sizes the order functions work on (``[num_windows]`` for windows).
    window:
        Row groups per shuffle pool; ``None`` for the exact permutation.
    """

    mode: str
    source: Any
    sizes: list[int]
    window: int | None
    specs: list[ColumnSpec] = field(default_factory=list)
    stats: StreamStats = field(default_factory=StreamStats)
    shards: ShardCache | None = None

    @property
    def num_samples(self) -> int:
        return int(sum(self.sizes))

    @property
    def nbytes(self) -> int:
        """Bytes held in memory by a cache (0 when streaming)."""
        return int(getattr(self.source, "nbytes", 0)) if self.mode == "memory" else 0

    def describe(self) -> dict[str, Any]:
        """Cache mode, samples, shuffle window, cached bytes and the streaming counters."""
        out = {"cache": self.mode, "num_samples": self.num_samples, "shuffle_window": self.window}
        out |= {"cache_bytes": self.nbytes} | self.stats.as_dict()
        return out | (self.shards.describe() if self.shards is not None else {})

    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: the shape of one sample and its dtype."""
        if isinstance(self.source, WindowSampler):
            return self.source.shapes()
        return {s.name: (s.shape, s.dtype) for s in self.specs}

    def session(
        self, *, shuffle: bool, seed: int, epoch: int, indices: np.ndarray | None = None
    ) -> Any:
        """An object whose ``gather(indices, out=None)`` serves this epoch's batches.

        ``indices`` (the rows this rank will ask for, in order) let a shard cache download
        the shards of the pools they fall in, in the order they will be read.
        """
        if self.mode == "memory":
            return self.source
        if shuffle:
            pools = block_shuffle_pools(self.sizes, seed, epoch, self.window)
        else:
            pools = sequential_pools(len(self.sizes), self.window)
        self.stats = StreamStats()
        reader = PoolReader(self.source, self.specs, pools, self.stats)
        if self.shards is not None and indices is not None:
            self.shards.schedule(reader.file_order(indices))
        return reader


def open_backend(
    dataset: Dataset,
    *,
    columns: Sequence[str] | None,
    windows: Windows | None,
    cache: str,
    strings: str,
    widen_unsigned: bool,
    budget: int,
    window: int | None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> Backend:
    """Decide how to serve ``dataset`` and load it when it is cached.

    Remote shards are read through a :class:`~feedline.loader.shard_cache.ShardCache` in
    ``cache_dir`` (holding at most ``cache_limit`` bytes) when ``cache_dir`` is given.

    Examples
    --------
    >>> import feedline as fl
    >>> b = open_backend(fl.range(10), columns=None, windows=None, cache="auto",
    ...                  strings="raise", widen_unsigned=False, budget=10**6, window=None)
    >>> b.mode, b.num_samples, b.nbytes
    ('memory', 10, 80)
    """
    layout = file_layout(dataset)
    shards = None
    if layout is not None and cache_dir is not None and not all(f.is_local for f in layout.files):
        manifest = dataset.manifest
        shards = ShardCache.for_files(
            layout.files, manifest.shards if manifest is not None else None, cache_dir,
            cache_limit or DEFAULT_CACHE_LIMIT,
        )  # fmt: skip
        layout = replace(layout, shard_cache=shards)
    if windows is not None:
        if cache == "none":
            raise ConfigurationError(
                "Loader: windows= needs the data in memory; cache='none' cannot build windows. "
                "Fix: use cache='auto' or 'memory'."
            )
        if shards is not None:
            shards.schedule(range(len(layout.files)))
        sampler = WindowSampler(dataset, windows, layout=layout, widen_unsigned=widen_unsigned)
        return Backend("memory", sampler, [sampler.num_rows], window, shards=shards)
    specs = column_specs(dataset.schema(), columns, strings=strings, widen_unsigned=widen_unsigned)
    rows = layout.num_rows if layout is not None else known_rows(dataset)
    estimate = estimate_bytes(specs, rows or 0)
    stream = cache == "none" or (cache == "auto" and rows is not None and estimate > budget)
    if stream and layout is None:
        raise ConfigurationError(
            f"Loader: this dataset ({dataset!r}) is computed, so its row groups cannot be "
            f"streamed (cache={cache!r}, estimate {estimate} bytes vs memory_budget {budget}). "
            "Fix: write it (ds.write(path)) and load fl.open(path), or pass cache='memory' / "
            "a larger memory_budget."
        )
    if stream:
        sizes = layout.row_group_sizes
        if window is None:
            group_bytes = max(1, estimate_bytes(specs, max(sizes, default=1)))
            window = max(1, min(len(sizes), budget // (STREAM_POOLS * group_bytes)))
        return Backend("none", layout, sizes, window, specs, shards=shards)
    limit = budget if cache == "auto" and rows is None else None
    if shards is not None:  # downloads overlap decoding: each shard loads once it arrives
        shards.schedule(range(len(layout.files)))
    loaded = load_cache(dataset, specs, layout=layout, budget=limit)
    sizes = layout.row_group_sizes if layout is not None else [loaded.num_rows]
    return Backend("memory", loaded, sizes, window, specs, shards=shards)
