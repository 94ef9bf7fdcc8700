"""The loader's data path: cache in memory or stream row groups, decided from the schema.

:func:`open_backend` takes what the loader reads (a
:class:`~feedline.store.shard_source.ShardSource` or a
:class:`~feedline.store.shard_source.BatchStream`), estimates the loader arrays' bytes from the
schema and the row count (metadata only) and, for ``cache="auto"``, caches when they fit
the memory budget and streams otherwise. A :class:`Backend` then hands each epoch a
*session* whose ``gather(indices, out=None)`` returns the batch arrays.

The contract with the loader's pipeline:

- :meth:`Backend.shapes` gives every batch key's per-sample shape and dtype;
- :meth:`Backend.buffer_shapes` gives the buffers a gather writes into: a packed block
  (several scalar columns of one dtype, key ``"\\x00packed:<dtype>"``) or a batch key;
- ``session.gather(indices, out)`` with ``out`` keyed by buffer keys writes every block and
  column there and returns batch arrays that are those buffers or views of them (column
  slices of a block: strided); ``out`` keyed by batch keys (:meth:`Backend.shapes`, the
  older contract) still works: every batch key in ``out`` comes back as that buffer,
  filled (at the cost of copying views). Without ``out`` the arrays are fresh.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError
from feedline.host import memory_room
from feedline.loader.data.column_dtypes import with_dtypes
from feedline.loader.data.columns import ColumnSpec, check_batch_bytes, column_specs, infer_shapes
from feedline.loader.data.memory_cache import (
    CacheSession,
    FileLayout,
    file_layout,
    known_rows,
    load_cache,
)
from feedline.loader.data.node_cache import NodeCache, cache_key, open_node_cache
from feedline.loader.data.packed_columns import Packing, plan_packing
from feedline.loader.data.row_group_stream import PoolReader, StreamStats, sequential_pools
from feedline.loader.data.shard_cache import ShardCache
from feedline.loader.data.staging.stager import StagedEpochs
from feedline.loader.data.windows import Windows, WindowSampler
from feedline.loader.order.sample_order import block_shuffle_pools
from feedline.store.shard_source import (
    BatchStream,
    ShardSource,
    SupportsShardSource,
    open_shard_source,
)

__all__ = ["Backend", "LoaderInput", "as_source", "open_backend"]

logger = logging.getLogger(__name__)

#: bytes a shard cache folder may hold unless ``cache_limit`` says otherwise
DEFAULT_CACHE_LIMIT = 20 * 10**9
#: pools resident at once while streaming, plus slack for the batches in flight
STREAM_POOLS = 3
#: ``cache="auto"`` with several ranks uses a node cache from this many bytes of columns on
AUTO_NODE_BYTES = 64 << 20


#: what a loader reads: shards, a stream of batches, an object that gives one (a ``Dataset``),
#: or the path of a written dataset or a Parquet folder
LoaderInput = ShardSource | BatchStream | SupportsShardSource | str | os.PathLike[str]


def as_source(data: LoaderInput) -> ShardSource | BatchStream:
    """What the loader reads from ``data``: a ``ShardSource`` / ``BatchStream`` as it is, a path
    (opened with :func:`~feedline.store.shard_source.open_shard_source`), or what the
    ``shard_source()`` method of ``data`` gives
    (:class:`~feedline.store.shard_source.SupportsShardSource`: a ``Dataset``).

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = fl.range(3).write(tempfile.mkdtemp() + "/ds").path
    >>> as_source(out).num_rows
    3
    """
    if isinstance(data, ShardSource | BatchStream):
        return data
    if isinstance(data, str | os.PathLike):
        return open_shard_source(data)
    if not isinstance(data, SupportsShardSource):
        raise ConfigurationError(
            f"Loader: cannot read {type(data).__name__} objects. Fix: pass a feedline Dataset "
            "(fl.open(path), fl.from_arrow(...)), a dataset path, a ShardSource, or an object "
            "with a shard_source() method (feedline.store.shard_source.SupportsShardSource)."
        )
    return data.shard_source()


@dataclass
class Backend:
    """Where batches come from.

    Attributes
    ----------
    mode:
        ``"memory"`` (a cache, node cache, staged epochs or window sampler in ``source``: the
        exact order, ``state_dict()`` as a cache's) or ``"none"``
        (streaming; the ``FileLayout`` in ``source``).
    sizes:
        Row-group sizes the order functions work on (``[num_windows]`` for windows).
    window:
        Row groups per shuffle pool; ``None`` for the exact permutation.
    reason:
        Why the data is held this way (``cache=`` asked for it, or what ``"auto"`` decided
        from the estimate and the budget): ``Loader.stats()["shuffle_reason"]``.
    clamped_window:
        The window a ``shuffle_window`` too large for the budget was lowered to (``None``
        when it was not): a checkpoint of this loader records it, so restoring with the same
        options compares against it.
    """

    mode: str
    source: Any
    sizes: list[int]
    window: int | None
    specs: list[ColumnSpec] = field(default_factory=list)
    stats: StreamStats = field(default_factory=StreamStats)
    shards: ShardCache | None = None
    #: the batch keys, blocks and columns (``None`` for windows)
    packing: Packing | None = None
    reason: str = ""
    clamped_window: int | None = None

    @property
    def num_samples(self) -> int:
        return int(sum(self.sizes))

    @property
    def arranged(self) -> bool:
        """Whether the samples are positions the source maps to its own order each epoch
        (contiguous windows): the loader orders them sequentially (the source shuffles)."""
        return isinstance(self.source, WindowSampler) and self.source.arranged

    def check_states(self, states: Sequence[Any]) -> None:
        """Refuse checkpoints the source cannot resume (see ``WindowSampler.check_states``)."""
        if isinstance(self.source, WindowSampler):
            self.source.check_states(states)

    @property
    def nbytes(self) -> int:
        """Bytes held in memory by a cache (0 when streaming)."""
        return int(getattr(self.source, "nbytes", 0)) if self.mode == "memory" else 0

    def describe(self) -> dict[str, Any]:
        """Cache mode, samples, shuffle window, cached bytes and the streaming counters.

        Windows add ``num_series`` and ``rows_resorted`` (see ``WindowSampler.describe``).
        """
        out = {"cache": self.mode, "num_samples": self.num_samples, "shuffle_window": self.window}
        out |= {"cache_bytes": self.nbytes} | self.stats.as_dict()
        if isinstance(self.source, WindowSampler | NodeCache | StagedEpochs):
            out |= self.source.describe()
        return out | (self.shards.describe() if self.shards is not None else {})

    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: the shape of one sample and its dtype."""
        if isinstance(self.source, WindowSampler):
            return self.source.shapes()
        if self.packing is not None:
            return self.packing.shapes()
        return {s.name: (s.shape, s.dtype) for s in self.specs}

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per gather buffer (a packed block or a batch key): one row's shape and dtype."""
        if self.packing is not None:
            return self.packing.buffer_shapes()
        return self.shapes()

    def session(
        self, *, shuffle: bool, seed: int, epoch: int, indices: np.ndarray | None = None
    ) -> Any:
        """An object whose ``gather(indices, out=None)`` serves this epoch's batches.

        ``indices`` (the rows this rank will ask for, in order) let a shard cache download
        the shards of the pools they fall in, in the order they will be read.
        """
        if isinstance(self.source, WindowSampler):
            return self.source.session(shuffle=shuffle, seed=seed, epoch=epoch)
        if isinstance(self.source, StagedEpochs):  # the epoch's plan is the loader's
            return self.source.session(epoch=epoch, indices=indices)
        if self.mode == "memory":
            return self.source if self.packing is None else CacheSession(self.source)
        assert self.window is not None  # open_backend picks a window for a streaming backend
        if shuffle:
            pools = block_shuffle_pools(self.sizes, seed, epoch, self.window)
        else:
            pools = sequential_pools(len(self.sizes), self.window)
        self.stats = StreamStats()
        reader = PoolReader(self.source, self.packing or self.specs, pools, self.stats)
        if self.shards is not None and indices is not None:
            self.shards.schedule(reader.file_order(indices))
        return reader


def open_backend(
    data: LoaderInput,
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
    stack: Mapping[str, Sequence[str]] | None = None,
    dtype: Any = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    ragged: str | Mapping[str, str] = "raise",
    pad_value: float = 0,
    world_size: int = 1,
    node_dir: str | os.PathLike[str] | None = None,
    window_copier: str = "numpy",
    batch_size: int = 1,
    shuffle: bool = True,
    rank: int = 0,
    ranks_per_node: int | None = None,
    stage_dir: str | os.PathLike[str] | None = None,
) -> Backend:
    """Decide how to serve ``data`` (any input of :func:`as_source`) and load it when it is
    cached.

    ``cache="node"`` maps a node cache file in ``node_dir`` (see
    :mod:`feedline.loader.data.node_cache`), filling it first if no process did; ``"auto"`` does
    too when ``world_size > 1`` and the columns are numbers and tensors read from files,
    fit ``budget`` and hold at least :data:`AUTO_NODE_BYTES` (falling back to memory when
    the folder cannot be created).

    Remote shards are read through a :class:`~feedline.loader.data.shard_cache.ShardCache` in
    ``cache_dir`` (holding at most ``cache_limit`` bytes) when ``cache_dir`` is given.
    ``stack`` and ``dtype`` are the loader's (see
    :func:`~feedline.loader.data.packed_columns.plan_packing` and
    :func:`~feedline.loader.data.column_dtypes.with_dtypes`); ``shapes``, ``ragged`` and
    ``pad_value`` too (list columns, see :func:`~feedline.loader.data.columns.column_specs`).
    ``window_copier`` is what copies ``windows=`` batches (see
    :class:`~feedline.loader.data.windows.WindowSampler`: ``"torch"`` for torch batches);
    ``batch_size`` and ``world_size`` cut contiguous windows into runs.

    ``cache="staged"`` stages each epoch in each rank's read order (see
    :mod:`feedline.loader.data.staging.stager`: ``rank``, ``ranks_per_node`` (default: every
    rank on one node) and ``stage_dir``, the exchange folder shared by the nodes); ``"auto"``
    does too, when shuffling, instead of streaming the columns over ``budget`` (unless they hold
    strings, or several nodes name no ``stage_dir``: then it streams, two-level).

    Before anything is allocated, the columns' sizes are checked against ``budget``: a batch
    of ``batch_size`` samples (:func:`~feedline.loader.data.columns.check_batch_bytes`) and,
    when streaming, one row group (a pool holds at least one); ``cache="memory"`` must fit
    this host's memory. Each is a :class:`ConfigurationError` naming the sizes.

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.store.shard_source import BatchStream
    >>> import pyarrow as pa
    >>> source = BatchStream.from_table(pa.table({"id": range(10)}))
    >>> b = open_backend(source, columns=None, windows=None, cache="auto", strings="raise",
    ...                  widen_unsigned=False, budget=10**6, window=None)
    >>> b.mode, b.num_samples, b.nbytes
    ('memory', 10, 80)
    """
    source = as_source(data)
    layout = file_layout(source)
    shards = None
    if layout is not None and cache_dir is not None and not all(f.is_local for f in layout.files):
        checked = layout.shards if layout.source.has_checksums else None
        shards = ShardCache.for_files(
            layout.files, checked, cache_dir, cache_limit or DEFAULT_CACHE_LIMIT
        )
        layout = replace(layout, shard_cache=shards)
    if windows is not None:
        if cache == "none":
            raise ConfigurationError(
                "Loader: windows= needs the data in memory; cache='none' cannot build windows. "
                "Fix: use cache='auto' or 'memory'."
            )
        if shards is not None:
            assert layout is not None  # a shard cache serves a layout's files
            shards.schedule(range(len(layout.files)))
        sampler = WindowSampler(
            source, windows, layout=layout, widen_unsigned=widen_unsigned, dtype=dtype,
            copier=window_copier, batch_size=batch_size, world_size=world_size,
        )  # fmt: skip
        return Backend("memory", sampler, [sampler.num_samples], window, shards=shards,
                       reason="windows= are built in memory")  # fmt: skip
    lists = {"shapes": shapes, "ragged": ragged, "pad_value": pad_value}
    packing = _packing(source, columns, strings, widen_unsigned, stack, dtype, lists)
    specs = packing.specs
    check_batch_bytes(specs, batch_size, budget)
    rows = layout.num_rows if layout is not None else known_rows(source)
    estimate = packing.row_bytes * (rows or 0)
    if cache == "memory" and estimate > memory_room():
        raise ConfigurationError(
            f"Loader: cache='memory' would hold about {_readable(estimate)} of columns ({rows} "
            f"rows of {_readable(packing.row_bytes)}), more than this host's memory "
            f"({_readable(memory_room())}). Fix: check shapes= and columns=, or use "
            "cache='node' (a file, paged from disk) or cache='auto' (streams over the budget)."
        )
    stream = cache == "none" or (cache == "auto" and rows is not None and estimate > budget)
    if (stream or cache in ("node", "staged")) and layout is None:
        raise ConfigurationError(
            f"Loader: this dataset ({source!r}) is computed, so its row groups cannot be "
            f"streamed (cache={cache!r}, estimate {estimate} bytes vs memory_budget {budget}). "
            "Fix: write it (ds.write(path)) and load fl.open(path), or pass cache='memory' / "
            "a larger memory_budget."
        )
    over = f"about {_readable(estimate)} of columns over memory_budget={_readable(budget)}"
    staged_why = None
    if cache == "staged" or (stream and cache == "auto" and shuffle):
        assert layout is not None  # a computed dataset was refused above
        staged_why = _why_not_staged(packing, world_size, ranks_per_node, stage_dir)
        if cache == "staged" or staged_why is None:
            _check_group_bytes(packing.row_bytes, layout.row_group_sizes, budget)
            source_key = cache_key(layout, packing, lists)
            staged = StagedEpochs(
                layout, packing, key=source_key, cache_dir=node_dir, stage_dir=stage_dir,
                rank=rank, world_size=world_size, ranks_per_node=ranks_per_node or world_size,
                budget=budget,
            )  # fmt: skip
            if cache == "staged":
                reason = "cache='staged': each epoch staged in this rank's read order"
            else:
                reason = (
                    f"cache='auto' stages each epoch in each rank's read order: {over} "
                    f"(estimated from the schema and {rows} rows); the shuffle stays exact"
                )
                logger.info("Loader: %s.", reason)
            return Backend("memory", staged, layout.row_group_sizes, None, specs, shards=shards,
                           packing=packing, reason=reason)  # fmt: skip
    if stream:
        assert layout is not None  # a computed dataset was refused above
        sizes = layout.row_group_sizes
        _check_group_bytes(packing.row_bytes, sizes, budget)
        group_bytes, clamped = max(1, packing.row_bytes * max(sizes, default=1)), None
        fit = max(1, min(len(sizes), budget // (STREAM_POOLS * group_bytes)))
        if window is None:
            window = fit
        elif window > fit and window * group_bytes * STREAM_POOLS > budget:
            logger.info(
                "Loader: shuffle_window=%d row groups of up to %s each, %d pools held at once, "
                "would hold %s, over memory_budget=%s: the window is %d row groups. Fix: pass "
                "a larger memory_budget for a larger window.", window, _readable(group_bytes),
                STREAM_POOLS, _readable(window * group_bytes * STREAM_POOLS), _readable(budget),
                fit,
            )  # fmt: skip
            window = clamped = fit
        if cache == "none":
            reason = "cache='none' streams row groups"
        else:
            reason = (
                (
                    f"cache='auto' streams row groups: {over} (estimated from the schema and "
                    f"{rows} rows), and cache='staged' cannot be used ({staged_why}). For the "
                    "exact shuffle pass cache='node' (one memory-mapped file per machine, paged "
                    "from disk beyond RAM) or a larger memory_budget"
                )
                if staged_why
                else (
                    f"cache='auto' streams row groups: {over} (estimated from the schema and "
                    f"{rows} rows), and shuffle=False reads them in order"
                )
            )
            logger.info(
                "Loader: %s; the shuffle is two-level (row groups permuted, rows shuffled in "
                "pools of %d row groups), not the exact permutation a cache gives.",
                reason, window,
            )  # fmt: skip
        return Backend("none", layout, sizes, window, specs, shards=shards, packing=packing,
                       reason=reason, clamped_window=clamped)  # fmt: skip
    if shards is not None:  # downloads overlap decoding: each shard loads once it arrives
        assert layout is not None  # a shard cache serves a layout's files
        shards.schedule(range(len(layout.files)))
    if _use_node(cache, layout, packing, world_size, stream):
        assert layout is not None  # cache="node" of a computed dataset was refused above
        try:
            node = open_node_cache(layout, packing, node_dir, options=lists)
        except ConfigurationError:
            if cache == "node":
                raise
        else:  # a node cache: served like a memory cache
            logger.info(
                "Loader cache: node file %s (%s), %d rows, %d bytes, %.2f s", node.path,
                "filled" if node.built else "reused", node.num_rows, node.nbytes,
                node.open_seconds,
            )  # fmt: skip
            sizes = layout.row_group_sizes
            reason = f"cache={cache!r}: a node cache file" + (
                f" (about {_readable(estimate)} of columns, {world_size} ranks)"
                if cache == "auto" else ""
            )  # fmt: skip
            return Backend("memory", node, sizes, window, specs, shards=shards, packing=packing,
                           reason=reason)  # fmt: skip
    limit = budget if cache == "auto" and rows is None else None
    started = time.perf_counter()
    loaded = load_cache(source, packing, layout=layout, budget=limit)
    logger.info(
        "Loader cache: memory, %d rows, %d bytes, filled in %.2f s",
        loaded.num_rows, loaded.nbytes, time.perf_counter() - started,
    )  # fmt: skip
    sizes = layout.row_group_sizes if layout is not None else [loaded.num_rows]
    if cache == "auto":
        fits = f"about {_readable(estimate)} of columns" if rows is not None else "the columns"
        reason = f"cache='auto' holds {fits} in memory, within memory_budget={_readable(budget)}"
    else:
        reason = f"cache={cache!r}"
    return Backend("memory", loaded, sizes, window, specs, shards=shards, packing=packing,
                   reason=reason)  # fmt: skip


def _check_group_bytes(row_bytes: int, sizes: Sequence[int], budget: int) -> None:
    """Streaming holds whole row groups: refuse one whose arrays alone are over ``budget``."""
    rows = max(sizes, default=0)
    if rows * row_bytes > budget:
        raise ConfigurationError(
            f"Loader: streaming holds whole row groups, and the largest ({rows} rows of "
            f"{_readable(row_bytes)} as loader arrays) takes {_readable(rows * row_bytes)}, over "
            f"memory_budget={_readable(budget)}. Fix: check shapes= (list rows are padded to "
            "them), rewrite the dataset with smaller row groups (write(..., row_group_rows=)), "
            "or pass a larger memory_budget."
        )


def _why_not_staged(
    packing: Packing,
    world_size: int,
    ranks_per_node: int | None,
    stage_dir: str | os.PathLike[str] | None,
) -> str | None:
    """Why ``cache="auto"`` cannot stage epochs (``None``: it can)."""
    strings = [c.name for c in packing.singles if c.dtype.hasobject]
    if strings:
        return f"columns {strings} are strings or binary"
    if os.name != "posix":
        return "it needs POSIX file locks"
    nodes = world_size // max(1, ranks_per_node or world_size)
    if nodes > 1 and not stage_dir:
        return f"{nodes} nodes and no stage_dir= to exchange rows through"
    return None


def _readable(size: int) -> str:
    """A byte count for people.

    Examples
    --------
    >>> _readable(3_000_000_000), _readable(1_500_000), _readable(80)
    ('3.0 GB', '1.5 MB', '80 bytes')
    """
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _use_node(
    cache: str, layout: FileLayout | None, packing: Packing, world_size: int, stream: bool
) -> bool:
    """``cache="node"``; or ``"auto"`` for several ranks on files, numbers only, in budget,
    of at least :data:`AUTO_NODE_BYTES` (below that the copies cost little)."""
    if cache == "node":
        return True
    if cache != "auto" or world_size < 2 or layout is None or stream:
        return False
    strings = any(c.dtype.hasobject for c in packing.singles)
    return not strings and packing.row_bytes * layout.num_rows >= AUTO_NODE_BYTES


def _packing(
    source: ShardSource | BatchStream,
    columns: Sequence[str] | None,
    strings: str,
    widen_unsigned: bool,
    stack: Mapping[str, Sequence[str]] | None,
    dtype: Any,
    lists: Mapping[str, Any] | None = None,
) -> Packing:
    """The batch keys and blocks: ``columns`` (default: all but stacked), ``stack`` keys."""
    if stack is not None and not isinstance(stack, Mapping):
        stack = {"": stack}  # refused below, with the fix
    stack = dict(stack or {})
    if any(isinstance(v, str) or not k for k, v in stack.items()):
        raise ConfigurationError(
            f"Loader: stack={stack!r} must map names to lists of columns. Fix: e.g. "
            "stack={'features': ['a', 'b']}."
        )
    stacked = [c for members in stack.values() for c in members]
    outputs = list(columns) if columns is not None else None
    read = None
    if outputs is not None or stack:  # a stacked column not in the schema is named here
        listed = outputs if outputs is not None else source.schema().names
        read = list(dict.fromkeys([*listed, *stacked]))
    lists = dict(lists or {})
    schema = source.schema()
    names = read if read is not None else schema.names
    lists["shapes"] = infer_shapes(
        schema, names, _sampler(source), lists.get("shapes"), lists.get("ragged", "raise")
    )
    specs = column_specs(schema, read, strings=strings, widen_unsigned=widen_unsigned, **lists)
    if outputs is None and stack:  # every column but the stacked ones, in schema order
        outputs = [s.name for s in specs if s.name not in set(stacked)]
    specs, stack_dtypes = with_dtypes(specs, dtype, stack, torch=widen_unsigned)
    return plan_packing(specs, stack, outputs, stack_dtypes)


#: rows of each row group read to infer list columns' shapes
SAMPLE_ROWS = 64


def _sampler(source: ShardSource | BatchStream) -> Any:
    """``columns -> batches`` of a few rows of each row group (a plan's batches otherwise)."""

    def batches(columns: list[str]) -> Iterator[pa.RecordBatch]:
        if isinstance(source, BatchStream):
            yield from source.iter_batches(columns)
            return
        for f, groups in enumerate(source.groups):
            for i, rows in enumerate(groups):
                if rows:
                    pieces = source.iter_read(f, [i], columns, SAMPLE_ROWS)
                    try:
                        yield next(pieces)
                    finally:
                        pieces.close()

    return batches
