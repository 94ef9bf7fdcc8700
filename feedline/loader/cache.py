"""The loader's in-memory cache: requested columns as contiguous NumPy arrays.

A feedline dataset (or a plain Parquet folder) is read row group by row group, in parallel,
straight into preallocated arrays (peak memory: the cache plus a few decoded row groups); any
other :class:`~feedline.dataset.Dataset` is read through ``iter_batches``. A batch is gathered
with one vectorized ``np.take`` per column.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from feedline.errors import ConfigurationError, DataError
from feedline.loader.columns import ColumnSpec, chunk_to_numpy, estimate_bytes
from feedline.plan import Limit, Select

if TYPE_CHECKING:
    from feedline.dataset import Dataset
    from feedline.io.storage import Location
    from feedline.loader.shard_cache import ShardCache

__all__ = [
    "ColumnCache",
    "FileLayout",
    "as_batch_value",
    "file_layout",
    "fill_arrays",
    "known_rows",
    "load_cache",
    "read_table",
    "take_rows",
]

#: threads reading row groups into the cache at once
MAX_READ_THREADS = 4
#: rows decoded at a time while reading row groups
READ_BATCH_ROWS = 32 * 1024
#: bytes of loader arrays decoded at a time while filling the cache. Parquet decodes a
#: fixed-size-list column with a repetition and a definition level per value (and a uint8
#: tensor as int32), so a piece's transient Arrow memory is several times its final size:
#: small pieces keep the cache load's peak memory close to the cache itself.
READ_BYTES = 1 << 20
#: bytes read from a file at a time (row groups are not pre-buffered whole: see ``iter_read``)
READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class FileLayout:
    """Parquet files and the rows of each of their row groups: the unit of reading.

    Global row group ``g`` is the ``g``-th in file order; it holds rows ``starts[g] :
    starts[g] + sizes[g]`` of the dataset.
    """

    files: tuple[Location, ...]
    groups: tuple[tuple[int, ...], ...]
    #: local copies of remote files (see :mod:`feedline.loader.shard_cache`), or ``None``
    shard_cache: ShardCache | None = field(default=None, compare=False)

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows of every row group, file after file."""
        return [n for per_file in self.groups for n in per_file]

    @property
    def num_rows(self) -> int:
        return int(sum(self.row_group_sizes))

    def locate(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per global row group: its file index, its index inside the file, its first row."""
        file_of = np.repeat(np.arange(len(self.groups)), [len(g) for g in self.groups])
        local = np.concatenate([np.arange(len(g)) for g in self.groups] or [np.zeros(0, int)])
        sizes = np.asarray(self.row_group_sizes, dtype=np.int64)
        return file_of.astype(np.int64), local.astype(np.int64), np.cumsum(sizes) - sizes

    def read(self, file: int, groups: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """Row groups ``groups`` (indices inside file ``file``) as one table.

        Raises :class:`DataError` naming the shard when the file is missing or unreadable.
        """
        batches = list(self.iter_read(file, groups, columns))
        return pa.Table.from_batches(batches) if batches else pa.table({})

    def iter_read(
        self, file: int, groups: Sequence[int], columns: Sequence[str], rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Row groups ``groups`` of file ``file`` as batches of up to ``rows`` rows.

        Decoding a piece at a time, from a buffered stream rather than whole pre-buffered
        column chunks, bounds the memory a read needs beyond its output.
        """
        loc = self.files[file]
        try:
            with self._open(file) as handle:
                parquet = pq.ParquetFile(handle, pre_buffer=False, buffer_size=READ_BUFFER)
                yield from parquet.iter_batches(
                    batch_size=rows or READ_BATCH_ROWS,
                    row_groups=list(groups),
                    columns=list(columns),
                    use_threads=False,
                )
        except (OSError, pa.ArrowException) as exc:
            cached = " (its cached copy)" if self.shard_cache is not None else ""
            raise DataError(
                f"Cannot read row group(s) {list(groups)} of shard {loc.url!r}{cached}: {exc}. "
                "The shard was removed, truncated or replaced after the dataset was opened. Fix: "
                "restore it (fl.verify(path) checks every shard) or re-run the write."
            ) from exc

    @contextlib.contextmanager
    def _open(self, file: int) -> Iterator[Any]:
        """File ``file`` opened for reading: the cached copy when a shard cache is set."""
        if self.shard_cache is None:
            loc = self.files[file]
            with loc.arrow_filesystem().open_input_file(loc.path) as handle:
                yield handle
            return
        with (
            self.shard_cache.using(file) as path,  # held from eviction while read
            pafs.LocalFileSystem().open_input_file(path) as handle,
        ):
            yield handle


def file_layout(dataset: Dataset) -> FileLayout | None:
    """The Parquet files a dataset reads directly, or ``None`` for a computed plan.

    Only plans that read Parquet files and at most select columns qualify; a feedline dataset
    takes its row groups from the manifest, a plain Parquet folder from the footers.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(10).write(out, rows_per_shard=6, row_group_rows=3)
    >>> file_layout(fl.open(out)).row_group_sizes, file_layout(fl.range(10)) is None
    ([3, 3, 3, 1], True)
    """
    from feedline.io.parquet import ParquetSource, read_footer

    source = dataset.plan.source
    if not isinstance(source, ParquetSource) or not all(
        isinstance(op, Select) for op in dataset.plan.ops
    ):
        return None
    files = tuple(source.files)
    manifest = dataset.manifest
    if manifest is not None:
        groups = tuple(tuple(s.row_groups) for s in manifest.shards)
    else:
        groups = tuple(
            tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
            for meta in (read_footer(loc) for loc in files)
        )
    return FileLayout(files, groups)


def known_rows(dataset: Dataset) -> int | None:
    """The row count from metadata alone, or ``None`` when only running the plan tells.

    Examples
    --------
    >>> import feedline as fl
    >>> known_rows(fl.range(10).limit(4)), known_rows(fl.range(10).filter(lambda b: b["id"]))
    (4, None)
    """
    if not all(isinstance(op, Select | Limit) for op in dataset.plan.ops):
        return None
    total = dataset.plan.source.count_rows()
    for op in dataset.plan.ops:
        if total is not None and isinstance(op, Limit):
            total = min(total, op.n)
    return total


class ColumnCache:
    """Columns held as contiguous NumPy arrays, gathered by row index.

    Examples
    --------
    >>> import numpy as np
    >>> cache = ColumnCache({"x": np.arange(10.0)})
    >>> cache.gather(np.array([3, 1]))["x"].tolist()
    [3.0, 1.0]
    """

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        lengths = {len(a) for a in arrays.values()}
        if len(lengths) > 1:
            raise ValueError(f"cache columns differ in length: {sorted(lengths)}")
        self.arrays = dict(arrays)
        self.num_rows = lengths.pop() if lengths else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (object columns: the pointers only)."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    def gather(
        self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Rows ``indices`` of every column: one ``np.take`` each (into ``out`` when given)."""
        return {name: take_rows(a, indices, out, name) for name, a in self.arrays.items()}


def take_rows(
    values: np.ndarray, indices: np.ndarray, out: Mapping[str, np.ndarray] | None, name: str
) -> np.ndarray:
    """``np.take`` of rows ``indices``, written into ``out[name]`` when ``out`` has that key.

    Examples
    --------
    >>> buf = {"x": np.empty(2)}
    >>> take_rows(np.arange(5.0), np.array([4, 0]), buf, "x") is buf["x"], buf["x"].tolist()
    (True, [4.0, 0.0])
    """
    if out is None or name not in out:
        return np.take(values, indices, axis=0)
    return np.take(values, indices, axis=0, out=out[name], mode="clip")  # indices are valid


def _empty(spec: ColumnSpec, rows: int) -> np.ndarray:
    return np.empty((rows, *spec.shape), dtype=spec.dtype)


def fill_arrays(
    dst: dict[str, np.ndarray],
    batches: Iterable[pa.RecordBatch | pa.Table],
    specs: Sequence[ColumnSpec],
    at: int,
    where: str,
) -> int:
    """Copy the columns of ``batches`` into ``dst`` from row ``at``; returns the rows copied."""
    row = at
    for batch in batches:
        for spec in specs:
            column = batch.column(spec.name)
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            start = row
            for chunk in chunks:
                part = chunk_to_numpy(chunk, spec, where)
                dst[spec.name][start : start + len(part)] = part
                start += len(part)
        row += batch.num_rows
    return row - at


def _load_files(layout: FileLayout, specs: Sequence[ColumnSpec], threads: int) -> ColumnCache:
    names = [s.name for s in specs]
    file_of, local, starts = layout.locate()
    sizes = layout.row_group_sizes
    if len(sizes) == 1:  # one row group: keep Arrow's buffers (zero-copy where possible)
        table = layout.read(0, [0], names)
        where = f"shard {layout.files[0].url!r}, row group 0"
        return ColumnCache(
            {s.name: _as_one(table.column(s.name).chunks, s, where, table.num_rows) for s in specs}
        )
    arrays = {s.name: _empty(s, layout.num_rows) for s in specs}

    def read_one(g: int) -> None:
        f, i = int(file_of[g]), int(local[g])
        where = f"shard {layout.files[f].url!r}, row group {i}"
        rows = min(READ_BATCH_ROWS, max(1, READ_BYTES // max(1, _row_bytes(specs))))
        pieces = _checked(layout.iter_read(f, [i], names, rows), int(sizes[g]), where)
        fill_arrays(arrays, pieces, specs, int(starts[g]), where)
        pa.default_memory_pool().release_unused()  # the decoded pieces: back to the system

    todo = [g for g in range(len(sizes)) if sizes[g]]
    if threads <= 1 or len(todo) <= 1:
        for g in todo:
            read_one(g)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="feedline-cache") as pool:
            for future in [pool.submit(read_one, g) for g in todo]:
                future.result()
    return ColumnCache(arrays)


def _row_bytes(specs: Sequence[ColumnSpec]) -> int:
    return sum(s.row_bytes for s in specs)


def _checked(batches: Iterable[pa.RecordBatch], rows: int, where: str) -> Iterator[pa.RecordBatch]:
    """Pass ``batches`` through, raising :class:`DataError` if they exceed or miss ``rows``."""
    seen = 0
    for batch in batches:
        seen += batch.num_rows
        if seen > rows:
            break
        yield batch
    if seen != rows:
        raise DataError(
            f"{where} has {'more than ' if seen > rows else ''}{seen} rows; the dataset says "
            f"{rows}. Fix: re-run the write (the shard was replaced)."
        )


def _as_one(chunks: Sequence[pa.Array], spec: ColumnSpec, where: str, rows: int) -> np.ndarray:
    if len(chunks) == 1:
        return chunk_to_numpy(chunks[0], spec, where)
    out = _empty(spec, rows)
    row = 0
    for chunk in chunks:
        part = chunk_to_numpy(chunk, spec, where)
        out[row : row + len(part)] = part
        row += len(part)
    return out


def _load_batches(dataset: Dataset, specs: Sequence[ColumnSpec], budget: int | None):
    names = [s.name for s in specs]
    plan_ds = dataset if list(dataset.schema().names) == names else dataset.select(names)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    rows = 0
    for batch in plan_ds.iter_batches():
        rows += batch.num_rows
        if budget is not None and estimate_bytes(specs, rows) > budget:
            raise ConfigurationError(
                f"The loader columns {names} of this computed dataset exceed the memory budget "
                f"of {budget} bytes after {rows} rows, and a computed plan cannot be streamed. "
                "Fix: write it first (ds.write(path)) and load fl.open(path), which streams "
                "row groups, or raise memory_budget / pass cache='memory'."
            )
        for spec in specs:
            where = f"a batch of {dataset!r} (rows {rows - batch.num_rows}..{rows - 1})"
            parts[spec.name].append(chunk_to_numpy(batch.column(spec.name), spec, where))
    return ColumnCache(
        {
            s.name: (parts[s.name][0] if len(parts[s.name]) == 1 else _concat(parts[s.name], s))
            for s in specs
        }
    )


def _concat(parts: list[np.ndarray], spec: ColumnSpec) -> np.ndarray:
    return np.concatenate(parts) if parts else _empty(spec, 0)


def load_cache(
    dataset: Dataset,
    specs: Sequence[ColumnSpec],
    *,
    layout: FileLayout | None = None,
    budget: int | None = None,
    threads: int | None = None,
) -> ColumnCache:
    """Load the columns of ``specs`` into a :class:`ColumnCache`.

    With a ``layout`` (see :func:`file_layout`) row groups are read in parallel straight into
    preallocated arrays; otherwise the plan runs and, with a ``budget``, stops with a
    :class:`ConfigurationError` once the arrays would exceed it.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.loader.columns import column_specs
    >>> ds = fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0]}))
    >>> load_cache(ds, column_specs(ds.schema())).arrays["x"].tolist()
    [1.0, 2.0, 3.0]
    """
    if layout is not None:
        workers = threads or min(MAX_READ_THREADS, os.cpu_count() or 1)
        return _load_files(layout, specs, workers)
    return _load_batches(dataset, specs, budget)


def read_table(dataset: Dataset, columns: Sequence[str], layout: FileLayout | None) -> pa.Table:
    """``columns`` of the whole dataset as one Arrow table (files read directly when possible).

    Examples
    --------
    >>> import feedline as fl
    >>> read_table(fl.range(3), ["id"], None)["id"].to_pylist()
    [0, 1, 2]
    """
    if layout is None:
        return dataset.select(list(columns)).to_arrow()
    parts = [layout.read(f, range(len(g)), columns) for f, g in enumerate(layout.groups) if g]
    if not parts:
        return dataset.schema().empty_table().select(list(columns))
    return pa.concat_tables(parts)


def as_batch_value(values: Any) -> Any:
    """What a gathered column becomes in a batch: object (string) arrays turn into lists.

    Examples
    --------
    >>> as_batch_value(np.array(["a", "b"], dtype=object)), as_batch_value(np.zeros(1)).shape
    (['a', 'b'], (1,))
    """
    is_object = isinstance(values, np.ndarray) and values.dtype.kind == "O"
    return values.tolist() if is_object else values
