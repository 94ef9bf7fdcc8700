"""The loader's in-memory cache: requested columns as NumPy arrays, scalars packed by dtype.

The loader reads a :class:`~feedline.store.shard_source.ShardSource` (a written dataset or a
plain Parquet folder) row group by row group, in parallel, straight into preallocated arrays
(peak memory: the cache plus a few decoded row groups); a
:class:`~feedline.store.shard_source.BatchStream` (a computed plan) is read through its batches.
Scalar numeric columns of one dtype are held row-major in one 2-D block (and every stack in
its own block; see :mod:`feedline.loader.data.packed_columns`), so a batch of a wide table is one
``np.take`` per block, not one per column.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from feedline.arrow.tensor_codec import is_tensor_type
from feedline.errors import ConfigurationError, DataError
from feedline.loader.data.bulk_arrays import prefault
from feedline.loader.data.columns import ColumnSpec, chunk_to_numpy, estimate_bytes
from feedline.loader.data.file_footers import FileFooters
from feedline.loader.data.packed_columns import Packing, column_views, gather_packed, plan_packing
from feedline.loader.data.page_fill import OpenFiles, PageFill
from feedline.loader.data.page_tasks import PageTask, PageTasks
from feedline.store.shard_source import BatchStream, ShardSource
from feedline.ui.progress import bar as progress_bar
from feedline.ui.progress import noop

if TYPE_CHECKING:
    from feedline.io.storage.paths import Location
    from feedline.loader.data.shard_cache import ShardCache
    from feedline.store.footers import Footer
    from feedline.store.manifest import ShardInfo

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
#: bytes decoded at a time for columns whose decoding is a copy (see :func:`read_rows`)
COPY_READ_BYTES = 16 << 20
#: memory caches of at least this many bytes copy their pages in the background by default
#: (a gather waits only for the pages of its rows: :mod:`feedline.loader.data.page_tasks`)
BACKGROUND_BYTES = 64 << 20

#: what the loader reads: shards, or the batches of a computed plan
LoaderSource = ShardSource | BatchStream


@dataclass(frozen=True)
class FileLayout:
    """A :class:`ShardSource` as the loader reads it: through a shard cache when one is set.

    Global row group ``g`` is the ``g``-th in file order; it holds rows ``starts[g] :
    starts[g] + sizes[g]`` of the dataset. A local file's footer is checked against its
    manifest entry once, not on every row group read (see :mod:`feedline.loader.data.file_footers`).
    """

    source: ShardSource
    #: local copies of remote files (see :mod:`feedline.loader.data.shard_cache`), or ``None``
    shard_cache: ShardCache | None = field(default=None, compare=False)
    #: the checked footers of the local files read so far
    footers: FileFooters = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "footers", FileFooters(self.source))

    @property
    def files(self) -> tuple[Location, ...]:
        return self.source.files

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        return self.source.groups

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """Every file's entry (manifest, or footer for plain Parquet): checked on every read."""
        return self.source.shards

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows of every row group, file after file."""
        return self.source.row_group_sizes

    @property
    def num_rows(self) -> int:
        return self.source.num_rows

    def locate(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per global row group: its file index, its index inside the file, its first row."""
        return self.source.locate()

    def read(self, file: int, groups: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """Row groups ``groups`` (indices inside file ``file``) as one table."""
        batches = list(self.iter_read(file, groups, columns))
        if not batches:
            return self.source.schema().empty_table().select(list(columns))
        return pa.Table.from_batches(batches)

    def iter_read(
        self, file: int, groups: Sequence[int], columns: Sequence[str], rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Row groups ``groups`` of file ``file`` as batches of up to ``rows`` rows (see
        :meth:`ShardSource.iter_read`: footers and page checksums checked)."""
        with self._local(file) as path, self.opened(file, path) as opened:
            yield from self.source.iter_read(
                file, groups, columns, rows, path=path, opened=opened
            )  # fmt: skip

    @contextlib.contextmanager
    def opened(self, file: int, cached: str | None) -> Iterator[tuple[int, Footer] | None]:
        """File ``file`` (its shard cache copy ``cached``, when given) open, as ``(descriptor,
        footer)`` with the footer checked (once per file); ``None`` for a remote file or one
        that cannot be opened (then :meth:`ShardSource.iter_read` reads and names it)."""
        loc = self.files[file]
        path = cached if cached is not None else (loc.path if loc.is_local else None)
        if path is None:
            yield None
            return
        with self.footers.open(file, path) as opened:
            yield opened

    @contextlib.contextmanager
    def _local(self, file: int) -> Iterator[str | None]:
        """The cached copy of file ``file`` (held from eviction meanwhile), else ``None``."""
        if self.shard_cache is None:
            yield None
            return
        with self.shard_cache.using(file) as path:
            yield path


def file_layout(source: LoaderSource) -> FileLayout | None:
    """The files a loader source reads directly, or ``None`` for a computed plan.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, tempfile
    >>> from feedline.store.shard_source import open_shard_source
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(10).write(out, rows_per_shard=6, row_group_rows=3)
    >>> file_layout(open_shard_source(out)).row_group_sizes
    [3, 3, 3, 1]
    >>> file_layout(BatchStream.from_table(pa.table({"id": range(10)}))) is None
    True
    """
    return FileLayout(source) if isinstance(source, ShardSource) else None


def known_rows(source: LoaderSource) -> int | None:
    """The row count from metadata alone, or ``None`` when only running the plan tells.

    Examples
    --------
    >>> import pyarrow as pa
    >>> known_rows(BatchStream.from_table(pa.table({"id": range(4)})))
    4
    >>> table = pa.table({"id": range(10)})
    >>> filtered = BatchStream(table.schema, None, lambda columns: iter(table.to_batches()))
    >>> known_rows(filtered) is None  # only running the filter tells
    True
    """
    return source.num_rows


class ColumnCache:
    """Columns held as NumPy arrays, gathered by row index.

    Built from a dict of arrays (each gathered with its own take) or from a
    :class:`~feedline.loader.data.packed_columns.Packing` and its storage (scalar columns packed
    by dtype, one take per block). ``arrays`` is every column's array (for packed columns a strided
    view of its block).

    Examples
    --------
    >>> import numpy as np
    >>> cache = ColumnCache({"x": np.arange(10.0)})
    >>> cache.gather(np.array([3, 1]))["x"].tolist()
    [3.0, 1.0]
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        packing: Packing | None = None,
        storage: Mapping[str, np.ndarray] | None = None,
        filling: PageTasks | None = None,
    ) -> None:
        self.packing = packing
        #: the pages still being copied in the background (see page_tasks.py), or ``None``
        self._filling = filling
        if filling is not None:  # a cache dropped while it fills: its fill threads stop
            weakref.finalize(self, filling.cancel)
        if packing is not None:
            assert storage is not None, "a packed cache is built on the packing's storage"
            self.storage = dict(storage)
        else:
            self.storage = dict(arrays or {})
        self.arrays = column_views(packing, self.storage) if packing is not None else self.storage
        lengths = {len(a) for a in self.storage.values()}
        if len(lengths) > 1:
            raise ValueError(f"cache columns differ in length: {sorted(lengths)}")
        self.num_rows = lengths.pop() if lengths else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (object columns: the pointers only)."""
        return int(sum(a.nbytes for a in self.storage.values()))

    def wait(self) -> ColumnCache:
        """This cache, once every row is in place (a background fill done); raises the fill's
        :class:`~feedline.errors.DataError`, if any."""
        if self._filling is not None:
            self._filling.wait()
        return self

    def gather(
        self,
        indices: np.ndarray,
        out: Mapping[str, np.ndarray] | None = None,
        scratch: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Rows ``indices`` of every batch key: one ``np.take`` per block or column.

        ``out`` buffers are keyed as :func:`~feedline.loader.data.packed_columns.gather_packed` says
        (by block or by batch key); ``scratch`` is reused memory for blocks copied out.
        Waits for the pages of these rows when the cache is still filling.
        """
        if self._filling is not None and not self._filling.complete:
            self._filling.ensure(indices)
        if self.packing is not None:
            return gather_packed(self.packing, self.storage, indices, out, scratch)
        return {name: take_rows(a, indices, out, name) for name, a in self.storage.items()}


class CacheSession:
    """One epoch's (one thread's) access to a cache: gathers with reused scratch memory."""

    def __init__(self, cache: ColumnCache) -> None:
        self._cache = cache
        self._scratch: dict[str, np.ndarray] = {}

    def gather(
        self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Rows ``indices`` of every batch key (see :meth:`ColumnCache.gather`)."""
        return self._cache.gather(indices, out, self._scratch if out else None)


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


def fill_arrays(
    dst: Mapping[str, np.ndarray],
    batches: Iterable[pa.RecordBatch | pa.Table],
    specs: Sequence[ColumnSpec],
    at: int,
    where: str,
    row_of: Callable[[int], int] | None = None,
) -> int:
    """Copy the columns of ``batches`` into ``dst`` (arrays or views) from row ``at``.

    Returns the rows copied. Values are converted to ``dst``'s dtypes as they are copied.
    Errors name the dataset row ``row_of(r)`` for ``dst``'s row ``r`` (default: ``r``).
    """
    row = at
    for batch in batches:
        for spec in specs:
            column = batch.column(spec.name)
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            start = row
            for chunk in chunks:
                part = chunk_to_numpy(chunk, spec, where, False, _shifted(start, row_of))
                dst[spec.name][start : start + len(part)] = part
                start += len(part)
        row += batch.num_rows
    return row - at


def _shifted(first: int, row_of: Callable[[int], int] | None = None) -> Callable[[int], int]:
    """``i -> row_of(first + i)``: a chunk's row as the row an error names."""
    to = row_of or int
    return lambda i: to(first + i)


def _load_files(
    layout: FileLayout,
    packing: Packing,
    threads: int,
    storage: dict[str, np.ndarray] | None = None,
    advance: Callable[[int], None] = noop,
    background: bool = False,
) -> ColumnCache:
    specs = packing.specs
    file_of, local, starts = layout.locate()
    sizes = layout.row_group_sizes
    if storage is None:
        storage = packing.allocate(layout.num_rows)
    views = column_views(packing, storage)
    rows = read_rows(packing, layout.source.schema())
    pages = PageFill(layout, specs)
    # background: the pages of copied columns are copied after this returns (page_tasks.py)
    files = OpenFiles(layout) if background and layout.shard_cache is None else None
    later = set(pages.widths) & set(storage) if files is not None else set()
    tasks: list[list[PageTask]] = [[] for _ in sizes]

    def read_one(g: int) -> None:
        f, i = int(file_of[g]), int(local[g])
        where = f"shard {layout.files[f].url!r}, row group {i}"
        for key, values in storage.items():  # this row group's pages, populated in bulk
            if key not in later:  # (a page task populates its own rows)
                prefault(values, int(starts[g]), int(starts[g] + sizes[g]))
        # a shard cache's copy (held from eviction), open with its footer checked once per file
        with layout._local(f) as cached, _opened(layout, files, f, cached) as opened:
            if files is not None:
                copied, tasks[g] = pages.plan(f, i, int(starts[g]), views, opened)
            else:
                copied = pages.copy(f, i, int(starts[g]), views, opened)  # pages in place
            rest = [s for s in specs if s.name not in copied]
            if rest:
                read = [s.name for s in rest]
                parts = layout.source.iter_read(f, [i], read, rows, path=cached, opened=opened)
                pieces = _checked(parts, int(sizes[g]), where)
                fill_arrays(views, pieces, rest, int(starts[g]), where)
        advance(int(sizes[g]))
        pa.default_memory_pool().release_unused()  # the decoded pieces: back to the system

    todo = [g for g in range(len(sizes)) if sizes[g]]
    try:
        if threads <= 1 or len(todo) <= 1:
            for g in todo:
                read_one(g)
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="feedline-cache") as pool:
                for future in [pool.submit(read_one, g) for g in todo]:
                    future.result()
    except BaseException:
        if files is not None:
            files.close()
        raise
    filling = None
    if files is not None:
        found = [task for group in tasks for task in group]
        filling = PageTasks(found, threads, files.close)  # closes the files at once if none
    return ColumnCache(packing=packing, storage=storage, filling=filling)


@contextlib.contextmanager
def _opened(
    layout: FileLayout, files: OpenFiles | None, file: int, cached: str | None
) -> Iterator[tuple[int, Footer] | None]:
    """File ``file`` open with its footer checked: held by ``files`` for a background fill,
    else opened for this row group (:meth:`FileLayout.opened`)."""
    if files is not None:
        yield files.get(file)
        return
    with layout.opened(file, cached) as opened:
        yield opened


def read_rows(packing: Packing, schema: pa.Schema | None = None) -> int:
    """Rows decoded at a time while filling a cache of ``packing``'s columns (of ``schema``).

    Parquet decodes list-encoded tensors with levels per value (transient memory several
    times the output), so those read in :data:`READ_BYTES` pieces; columns that decode as a
    copy (numbers, fixed-size binary tensors) read in pieces of :data:`COPY_READ_BYTES`, as
    each piece costs a fixed overhead (measured on 100k x uint8[3, 64, 64]: 85-row pieces
    read 1.4x slower than 2,730-row ones).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> schema = pa.schema({"x": pa.float64(), "y": pa.list_(pa.float32(), 1024)})
    >>> p = plan_packing(column_specs(schema))
    >>> read_rows(p, schema), read_rows(p)
    (4088, 255)
    """
    copies = schema is not None and all(
        _decodes_as_copy(schema.field(s.name).type) for s in packing.specs
    )
    piece = COPY_READ_BYTES if copies else READ_BYTES
    return min(READ_BATCH_ROWS, max(1, piece // max(1, packing.row_bytes)))


def _decodes_as_copy(kind: pa.DataType) -> bool:
    """Numbers, and fixed-shape tensors of numbers (stored as fixed-size binary)."""
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return True
    return is_tensor_type(kind)  # bool tensors are not tensor types: they stay lists


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


def _load_batches(
    stream: BatchStream, packing: Packing, budget: int | None, advance: Callable[[int], None] = noop
) -> ColumnCache:
    specs = packing.specs
    names = [s.name for s in specs]
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    rows = 0
    for batch in stream.iter_batches(names):
        rows += batch.num_rows
        advance(batch.num_rows)
        if budget is not None and estimate_bytes(specs, rows) > budget:
            raise ConfigurationError(
                f"The loader columns {names} of this computed dataset exceed the memory budget "
                f"of {budget} bytes after {rows} rows, and a computed plan cannot be streamed. "
                "Fix: write it first (ds.write(path)) and load fl.open(path), which streams "
                "row groups, or raise memory_budget / pass cache='memory'."
            )
        for spec in specs:
            where = f"a batch of {stream.description} (rows {rows - batch.num_rows}..{rows - 1})"
            column, first = batch.column(spec.name), _shifted(rows - batch.num_rows)
            parts[spec.name].append(chunk_to_numpy(column, spec, where, False, first))
    storage = packing.allocate(rows)
    views = column_views(packing, storage)
    for spec in specs:
        at = 0
        for part in parts.pop(spec.name):
            views[spec.name][at : at + len(part)] = part
            at += len(part)
    return ColumnCache(packing=packing, storage=storage)


def load_cache(
    source: LoaderSource,
    specs: Sequence[ColumnSpec] | Packing,
    *,
    layout: FileLayout | None = None,
    budget: int | None = None,
    threads: int | None = None,
    storage: dict[str, np.ndarray] | None = None,
    background: bool | None = None,
) -> ColumnCache:
    """Load the columns of ``specs`` (or of a :class:`Packing`) into a :class:`ColumnCache`.

    With a ``layout`` (see :func:`file_layout`) row groups are read in parallel straight into
    preallocated arrays (``storage``, shaped as :meth:`Packing.allocate` makes them, when
    given: e.g. a node cache file's mapping); otherwise the plan runs and, with a ``budget``,
    stops with a :class:`ConfigurationError` once the arrays would exceed it. Plain specs are
    packed with :func:`~feedline.loader.data.packed_columns.plan_packing` (no stacks).

    ``background``: return before the data pages of page-copied columns are in place and
    copy them in background threads, the pages a gather needs first (see
    :mod:`feedline.loader.data.page_tasks`; :meth:`ColumnCache.wait` waits for the rest). By
    default a memory cache of at least :data:`BACKGROUND_BYTES` of local files does.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> table = pa.table({"x": [1.0, 2.0, 3.0]})
    >>> cache = load_cache(BatchStream.from_table(table), column_specs(table.schema))
    >>> cache.arrays["x"].tolist()
    [1.0, 2.0, 3.0]
    """
    packing = specs if isinstance(specs, Packing) else plan_packing(specs)
    if layout is None and isinstance(source, ShardSource):
        layout = FileLayout(source)
    kind = "memory" if storage is None else "node"  # the caller's storage: a node cache file
    if background is None and layout is not None:
        background = storage is None and packing.row_bytes * layout.num_rows >= BACKGROUND_BYTES
    with progress_bar(f"fill the {kind} cache", total=known_rows(source)) as advance:
        if layout is not None:
            workers = threads or min(MAX_READ_THREADS, os.cpu_count() or 1)
            later = bool(background) and storage is None
            return _load_files(layout, packing, workers, storage, advance, later)
        assert isinstance(source, BatchStream)  # a ShardSource got its FileLayout above
        return _load_batches(source, packing, budget, advance)


def read_table(source: LoaderSource, columns: Sequence[str], layout: FileLayout | None) -> pa.Table:
    """``columns`` of the whole source as one Arrow table (through ``layout`` when given).

    Examples
    --------
    >>> import pyarrow as pa
    >>> source = BatchStream.from_table(pa.table({"id": range(3)}))
    >>> read_table(source, ["id"], None)["id"].to_pylist()
    [0, 1, 2]
    """
    if layout is None:
        return source.read_table(list(columns))
    parts = [layout.read(f, range(len(g)), columns) for f, g in enumerate(layout.groups) if g]
    if not parts:
        return source.schema().empty_table().select(list(columns))
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
