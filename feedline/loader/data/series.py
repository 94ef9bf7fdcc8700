"""Time series in memory for :mod:`feedline.loader.data.windows`: columns packed row-major, sorted.

:func:`load_series` reads the window columns once, piece by piece, straight into
preallocated row-major arrays of shape ``(rows, width)`` (one row per time step, the columns
side by side), so that a window is one contiguous block of memory. The rows must be in
``(by, order_by)`` order. Data written in that order (the usual case) is checked piece by
piece while it loads, so the key columns are never held whole. Otherwise the key columns
are read on their own, sorted with Arrow (a stable sort), and each packed column is permuted
in place, one column at a time.

Peak memory is the packed arrays plus the pieces being decoded. Unsorted data also needs the
keys, the permutation (8 bytes a row) and one column.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import DataError
from feedline.loader.data.columns import ColumnSpec, chunk_to_numpy
from feedline.loader.data.memory_cache import (
    MAX_READ_THREADS,
    READ_BATCH_ROWS,
    READ_BYTES,
    FileLayout,
    read_table,
)

if TYPE_CHECKING:
    from feedline.store.shard_source import BatchStream, ShardSource

__all__ = ["Series", "load_series", "packed_dtype"]


def packed_dtype(specs: Sequence[ColumnSpec]) -> np.dtype:
    """The dtype that the columns of ``specs`` share when packed (``np.result_type``).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> packed_dtype(column_specs(pa.schema({"a": pa.float32(), "b": pa.int64()})))
    dtype('float64')
    """
    return np.result_type(*[s.dtype for s in specs])


def _width(spec: ColumnSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64))


@dataclass
class Series:
    """The packed arrays and where each series starts.

    Attributes
    ----------
    arrays:
        Per name, a C-contiguous ``(rows, width)`` array; names whose columns are the same
        share one array.
    bounds:
        The first row of each series, then the number of rows (``num_series + 1`` entries).
    resorted:
        Whether the rows had to be sorted after loading (they were not stored in order).
    """

    arrays: dict[str, np.ndarray]
    bounds: np.ndarray
    resorted: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes held: each distinct array once, plus the bounds."""
        unique = {id(a): a for a in self.arrays.values()}
        return int(sum(a.nbytes for a in unique.values()) + self.bounds.nbytes)


#: the ``(by, order_by)`` key values of some rows (``None`` for a key not given)
_Keys = tuple[np.ndarray | None, np.ndarray | None]


@dataclass
class _Run:
    """What the rows of one row group say about the order: sorted?, series changes, ends."""

    ok: bool = True
    changes: list[np.ndarray] = field(default_factory=list)
    first: _Keys | None = None
    last: _Keys | None = None


def _key_values(piece: pa.RecordBatch, name: str | None) -> np.ndarray | None:
    if name is None:
        return None
    column = piece.column(name)
    if column.null_count:
        raise TypeError("null keys")  # the caller falls back to Arrow's sort
    return np.asarray(column.to_numpy(zero_copy_only=False))


def _in_order(by: np.ndarray | None, time: np.ndarray | None) -> tuple[bool, np.ndarray | None]:
    """Whether consecutive rows are in (by, time) order; where ``by`` changes (if given)."""
    change: np.ndarray | None = None
    if by is not None:
        change = by[1:] != by[:-1]
        if time is not None:
            ok = (by[1:] > by[:-1]) | (~change & (time[1:] >= time[:-1]))
        else:
            ok = by[1:] >= by[:-1]
    elif time is not None:
        ok = time[1:] >= time[:-1]
    else:
        ok = np.ones(0, dtype=bool)
    return bool(np.all(ok)), change


def _concat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or b is None else np.concatenate([a, b])


def _slice_keys(keys: _Keys, rows: slice) -> _Keys:
    """The ``rows`` of each key's values."""
    by, time = keys
    return None if by is None else by[rows], None if time is None else time[rows]


class _Filler:
    """Copies pieces of rows into the packed arrays and follows the key order."""

    def __init__(
        self, blocks: Mapping[str, Sequence[ColumnSpec]], arrays: Mapping[str, np.ndarray],
        by: str | None, order_by: str | None,
    ) -> None:  # fmt: skip
        self.parts: list[tuple[ColumnSpec, np.ndarray, int]] = []
        done: set[int] = set()
        for name, specs in blocks.items():
            if id(arrays[name]) in done:
                continue
            done.add(id(arrays[name]))
            offset = 0
            for spec in specs:
                self.parts.append((spec, arrays[name], offset))
                offset += _width(spec)
        self.by, self.order_by = by, order_by

    def fill(
        self, pieces: Iterator[pa.RecordBatch], row: int, size: int, where: str
    ) -> tuple[int, _Run]:
        """Copy ``pieces`` (``size`` rows) from row ``row``; returns the rows seen and the run."""
        run, at = _Run(), row
        for piece in pieces:
            m = piece.num_rows
            if at + m > row + size:  # more rows than the manifest says: not copied
                return at + m - row, run
            for spec, dst, offset in self.parts:
                values = chunk_to_numpy(piece.column(spec.name), spec, where)
                dst[at : at + m, offset : offset + _width(spec)] = values.reshape(m, -1)
            if run.ok and m:
                self._follow(run, piece, at)
            at += m
        return at - row, run

    def _follow(self, run: _Run, piece: pa.RecordBatch, at: int) -> None:
        try:
            by, time = _key_values(piece, self.by), _key_values(piece, self.order_by)
            ends = (by, time)
            if run.last is not None:  # the previous piece's last row in front
                by, time = _concat(run.last[0], by), _concat(run.last[1], time)
                at -= 1
            ok, change = _in_order(by, time)
        except (TypeError, ValueError, pa.ArrowException):  # nulls, mixed or odd key types
            ok, change = False, None
        run.ok = run.ok and ok
        if change is not None:
            run.changes.append(np.flatnonzero(change) + at + 1)
        first = _slice_keys(ends, slice(None, 1))
        run.first = run.first if run.first is not None else first
        run.last = _slice_keys(ends, slice(-1, None))


def _pieces(
    table: pa.Table | None, layout: FileLayout | None, names: list[str], row_bytes: int
) -> Iterator[tuple[int, Iterator[pa.RecordBatch], int, str]]:
    """Per row group (the whole ``table`` of a computed dataset): first row, pieces, rows, where."""
    rows = min(READ_BATCH_ROWS, max(1, READ_BYTES // max(1, row_bytes)))
    if table is not None:
        yield 0, iter(table.to_batches(max_chunksize=rows)), table.num_rows, "the windows' source"
    elif layout is not None:
        file_of, local, starts = layout.locate()
        for g, size in enumerate(layout.row_group_sizes):
            if size:
                f, i = int(file_of[g]), int(local[g])
                where = f"shard {layout.files[f].url!r}, row group {i}"
                yield int(starts[g]), layout.iter_read(f, [i], names, rows), int(size), where


def load_series(
    dataset: ShardSource | BatchStream,
    blocks: Mapping[str, Sequence[ColumnSpec]],
    *,
    by: str | None,
    order_by: str | None,
    layout: FileLayout | None,
    threads: int | None = None,
) -> Series:
    """Read the columns of each block packed into one ``(rows, width)`` array, rows sorted.

    ``blocks`` maps a name to its columns, in order; a scalar column takes one slot of the
    width, a tensor column as many as it has elements. Blocks with the same columns share
    one array. The rows come sorted by ``(by, order_by)`` (ties keep their order).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> from feedline.store.shard_source import BatchStream
    >>> table = pa.table({"s": [1, 0, 0], "t": [0, 1, 0], "v": [5.0, 2.0, 1.0]})
    >>> specs = column_specs(table.schema, ["v", "t"])
    >>> out = load_series(BatchStream.from_table(table), {"inputs": specs}, by="s",
    ...                   order_by="t", layout=None)
    >>> out.arrays["inputs"].tolist(), out.bounds.tolist()
    ([[1.0, 0.0], [2.0, 1.0], [5.0, 0.0]], [0, 2, 3])
    """
    keys = [c for c in (by, order_by) if c is not None]
    names = list(dict.fromkeys([s.name for specs in blocks.values() for s in specs] + keys))
    # a computed dataset is computed once; a written one is read row group by row group
    if layout is None:
        table = read_table(dataset, names, None)
        rows = table.num_rows
    else:
        table, rows = None, layout.num_rows
    row_bytes = sum(s.row_bytes for specs in blocks.values() for s in specs)
    pieces = list(_pieces(table, layout, names, row_bytes))
    arrays: dict[str, np.ndarray] = {}
    made: dict[tuple[str, ...], np.ndarray] = {}
    for name, specs in blocks.items():
        sig = tuple(s.name for s in specs)
        if sig not in made:
            width = sum(_width(s) for s in specs)
            made[sig] = np.empty((rows, width), dtype=packed_dtype(specs))
        arrays[name] = made[sig]
    filler = _Filler(blocks, arrays, by, order_by)

    def one(item: tuple[int, Iterator[pa.RecordBatch], int, str]) -> _Run:
        start, batches, size, where = item
        got, run = filler.fill(batches, start, size, where)
        pa.default_memory_pool().release_unused()  # the decoded pieces: back to the system
        if got != size:
            raise DataError(
                f"Windows: {where} gave {got} rows where the manifest says {size}. The shard "
                "changed after the dataset was opened. Fix: re-open the dataset (fl.open) or "
                "restore the shard (fl.verify(path) checks every shard)."
            )
        return run

    workers = threads or min(MAX_READ_THREADS, os.cpu_count() or 1)
    if workers <= 1 or len(pieces) <= 1:
        runs = [one(p) for p in pieces]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="feedline-windows") as pool:
            runs = list(pool.map(one, pieces))
    bounds = _bounds(runs, [p[0] for p in pieces], rows, by)
    if bounds is not None:
        return Series(arrays, bounds)
    if table is None:  # not in (by, order_by) order: sort now
        table = read_table(dataset, keys, layout)  # the key columns alone
    return Series(arrays, _sort(table, by, order_by, list(made.values())), resorted=True)


def _bounds(runs: list[_Run], starts: list[int], rows: int, by: str | None) -> np.ndarray | None:
    """Series bounds from the runs of sorted row groups; ``None`` when the rows are unsorted."""
    if not all(r.ok for r in runs):
        return None
    changes = [np.zeros(1 if rows else 0, dtype=np.int64)]
    previous = None
    for run, start in zip(runs, starts, strict=True):
        if run.first is None:
            continue
        if previous is not None:
            try:
                by_keys = _concat(previous[0], run.first[0])
                ok, change = _in_order(by_keys, _concat(previous[1], run.first[1]))
            except (TypeError, ValueError):
                return None
            if not ok:
                return None
            if change is not None and change[0]:
                changes.append(np.array([start], dtype=np.int64))
        changes.extend(run.changes)
        previous = run.last
    if by is None:
        changes = changes[:1]
    return np.append(np.sort(np.concatenate(changes)), rows).astype(np.int64)


def _sort(
    table: pa.Table, by: str | None, order_by: str | None, arrays: Sequence[np.ndarray]
) -> np.ndarray:
    """Sort the rows of ``arrays`` in place by the ``(by, order_by)`` columns of ``table``.

    Returns the series bounds.
    """
    keys = [c for c in (by, order_by) if c is not None]
    sort_keys = [(c, "ascending") for c in keys]
    perm = pc.sort_indices(table, sort_keys=sort_keys).to_numpy().astype(np.int64)
    rows = table.num_rows
    change = np.zeros(rows, dtype=bool)
    if rows:
        change[0] = True
    if by is not None:
        sorted_by = np.asarray(table.column(by).take(perm).to_numpy(zero_copy_only=False))
        change[1:] |= sorted_by[1:] != sorted_by[:-1]
    for values in arrays:  # one column at a time: the extra memory is one column
        for j in range(values.shape[1]):
            values[:, j] = values[perm, j]
    return np.append(np.flatnonzero(change), rows).astype(np.int64)
