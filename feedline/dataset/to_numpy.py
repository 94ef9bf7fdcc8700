"""Dataset rows as NumPy arrays, filled straight from Arrow buffers into preallocated arrays.

``Dataset.to_numpy`` lands here. Every output array is allocated once, at its final size,
and each Arrow column is copied into its slice of it: no table is concatenated, no
intermediate frame is built. ``stack=True`` gives one ``(rows, C)`` array of numeric
columns of one dtype; in C order it is filled in tiles (a few dozen columns by a few
thousand rows, transposed through a small buffer) so the writes stay cache friendly.

A plan that reads Parquet files as they are (column selections at most) takes the fast
path: footers are read in parallel for the row counts, then each file is read by a worker
thread and copied into its own slice of the output, while other files are still read.
Any other plan streams its batches through the engine and fills the same arrays.

Columns of different numeric dtypes stack into their ``numpy.result_type`` (``float64`` and
``int64`` give ``float64``). ``per_file=True`` (:func:`fill_cube`) gives one block per
input file: a ``(files, rows, columns)`` cube of each file's first ``rows`` rows, reading
only the row groups (and, within them, the pages) those rows need.

Layout and speed: a ``(rows, C)`` array in C order is filled column by column through a
transposing tile; in F order (``order="F"``) each column's slice is one contiguous copy
(the layout of ``pandas.DataFrame.to_numpy()`` for a float frame). On the 2-core machine of
``bench/cube.py`` both fills take the same time (200,000 x 100 float64: 1.01 s and 1.01 s);
a user measured the C fill 5-8x slower than pandas on a "first rows of many files" workload
where ``order="F"`` was not, so pass ``order="F"`` whenever the consumer does not need rows
contiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.parquet import ParquetSource
from feedline.io.storage.paths import Location
from feedline.plan.plan import Plan, Select
from feedline.store.footers import check_identity

__all__ = [
    "ArrayFiller",
    "fill_cube",
    "fill_from_batches",
    "fill_from_parquet",
    "numeric_columns",
    "output_columns",
    "per_file_inputs",
    "stack_dtype",
    "stored_files",
]

#: columns and rows of one tile of the C-order stacked fill (a 512 KiB float64 buffer)
_TILE_COLUMNS = 64
_TILE_ROWS = 1024


def check_order(order: Any) -> Literal["C", "F"]:
    """``order`` when it is ``"C"`` or ``"F"``, else :class:`ConfigurationError`.

    Examples
    --------
    >>> check_order("F")
    'F'
    """
    if order == "C":
        return "C"
    if order == "F":
        return "F"
    raise ConfigurationError(f"order={order!r} must be 'C' or 'F'. Fix: pass one of them.")


def is_numeric(kind: pa.DataType) -> bool:
    """True for integer, floating-point and boolean Arrow types."""
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def numeric_columns(schema: pa.Schema) -> list[str]:
    """The names of ``schema``'s numeric columns, in order.

    Examples
    --------
    >>> numeric_columns(pa.schema({"a": pa.int8(), "s": pa.string(), "b": pa.float32()}))
    ['a', 'b']
    """
    return [f.name for f in schema if is_numeric(f.type)]


def stack_dtype(types: dict[str, pa.DataType]) -> np.dtype[Any]:
    """The dtype of ``to_numpy(stack=True)`` over columns of ``types`` (name -> Arrow type):
    their ``numpy.result_type``; a non-numeric column raises :class:`SchemaError`.

    Examples
    --------
    >>> stack_dtype({"x": pa.float64(), "id": pa.int64()})
    dtype('float64')
    >>> stack_dtype({"a": pa.int8(), "b": pa.uint8(), "c": pa.bool_()})
    dtype('int16')
    """
    bad = {n: str(t) for n, t in types.items() if not is_numeric(t)}
    if bad:
        raise SchemaError(
            f"to_numpy(stack=True) stacks numeric columns only; {bad} are not numeric. "
            "Fix: pass columns=[...] naming numeric columns, or stack=False for a dict of "
            "arrays."
        )
    if not types:
        return np.dtype(np.float64)
    return np.result_type(*(np.dtype(t.to_pandas_dtype()) for t in types.values()))


class ArrayFiller:
    """Preallocated output arrays for ``rows`` rows of ``columns`` of ``schema``, filled by
    row offset from Arrow tables or batches (safe from several threads on disjoint rows).

    ``stack=True``: one ``(rows, len(columns))`` array in ``order`` (numeric columns, of
    their :func:`stack_dtype`). Otherwise a dict of one array per column: numeric columns
    1-D, fixed-shape tensor columns ``(rows, *shape)``, anything else an object array.
    ``out`` fills given arrays instead (of those shapes: a block of a cube).

    Examples
    --------
    >>> schema = pa.schema({"a": pa.float64(), "b": pa.float64()})
    >>> filler = ArrayFiller(schema, ["a", "b"], rows=3, stack=True)
    >>> filler.fill(0, pa.table({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]}))
    >>> filler.result().tolist()
    [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    """

    def __init__(
        self,
        schema: pa.Schema,
        columns: Sequence[str],
        rows: int,
        *,
        stack: bool,
        order: str = "C",
        out: Any = None,
    ) -> None:
        layout = check_order(order)
        self.columns = list(columns)
        self.stack = stack
        self.rows = rows
        self._types = {name: schema.field(name).type for name in self.columns}
        if out is not None:
            self._out: Any = out
        elif stack:
            dtype = stack_dtype(self._types)
            self._out = np.empty((rows, len(self.columns)), dtype, order=layout)
        else:
            self._out = {name: self._allocate(name, kind) for name, kind in self._types.items()}

    def _allocate(self, name: str, kind: pa.DataType) -> np.ndarray:
        if is_numeric(kind):
            return np.empty(self.rows, kind.to_pandas_dtype())
        if isinstance(kind, pa.FixedShapeTensorType):
            return np.empty((self.rows, *kind.shape), kind.value_type.to_pandas_dtype())
        return np.empty(self.rows, object)

    def fill(self, offset: int, data: pa.Table | pa.RecordBatch, where: str = "the rows") -> None:
        """Copy ``data`` (holding at least ``self.columns``) into rows ``offset...``."""
        if offset + data.num_rows > self.rows:
            raise DataError(
                f"{where} hold more rows than counted ({offset + data.num_rows} > {self.rows}): "
                "the input changed while it was read. Fix: read it again when it is not being "
                "written."
            )
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        for batch in batches:
            arrays = [batch.column(name) for name in self.columns]
            if self.stack:
                nan = self._out.dtype.kind == "f"  # a float stack holds nulls as NaN
                pairs = zip(arrays, self.columns, strict=True)
                views = [self._numeric(a, name, where, nan) for a, name in pairs]
                self._fill_stacked(offset, views)
            else:
                for name, array in zip(self.columns, arrays, strict=True):
                    self._fill_column(offset, name, array, where)
            offset += batch.num_rows

    def _numeric(self, array: pa.Array, name: str, where: str, nan: bool = False) -> np.ndarray:
        if array.null_count:
            if not (nan or pa.types.is_floating(array.type)):
                raise DataError(
                    f"Column {name!r} of {where} holds {array.null_count} null(s), which a "
                    f"NumPy {array.type} array cannot hold. Fix: fill them first (fl.Imputer) "
                    "or cast the column to a float type (nulls become NaN)."
                )
            if not pa.types.is_floating(array.type):
                array = array.cast(pa.float64())
            array = pc.fill_null(array, float("nan"))
        return array.to_numpy(zero_copy_only=False)

    def _fill_stacked(self, offset: int, views: list[np.ndarray]) -> None:
        out = self._out
        if not views:
            return
        rows = len(views[0])
        if out.flags.f_contiguous or len(views) == 1:
            for j, view in enumerate(views):  # each column slice is contiguous: a memcpy
                out[offset : offset + rows, j] = view
            return
        # C order: transpose tiles through a small buffer instead of strided column writes
        tile = np.empty((_TILE_COLUMNS, min(rows, _TILE_ROWS)), out.dtype)
        for j0 in range(0, len(views), _TILE_COLUMNS):
            block = views[j0 : j0 + _TILE_COLUMNS]
            for r0 in range(0, rows, _TILE_ROWS):
                r1 = min(rows, r0 + _TILE_ROWS)
                for k, view in enumerate(block):
                    tile[k, : r1 - r0] = view[r0:r1]
                target = out[offset + r0 : offset + r1, j0 : j0 + len(block)]
                target[...] = tile[: len(block), : r1 - r0].T

    def _fill_column(self, offset: int, name: str, array: pa.Array, where: str) -> None:
        out = self._out[name]
        stop = offset + len(array)
        kind = self._types[name]
        if is_numeric(kind):
            out[offset:stop] = self._numeric(array, name, where)
        elif isinstance(kind, pa.FixedShapeTensorType):
            if array.null_count:
                raise DataError(
                    f"Tensor column {name!r} of {where} holds {array.null_count} null(s). Fix: "
                    "drop or fill those rows first (ds.filter(pc.field(name).is_valid()))."
                )
            out[offset:stop] = array.to_numpy_ndarray()
        else:
            out[offset:stop] = array.to_numpy(zero_copy_only=False)

    def result(self) -> Any:
        """The filled array (``stack=True``) or dict of arrays."""
        return self._out


def fill_from_batches(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    columns: Sequence[str],
    *,
    stack: bool,
    order: str = "C",
    rows: int | None = None,
) -> Any:
    """Arrays of ``columns`` from a stream of batches.

    With ``rows`` known the output is allocated first and filled as batches arrive;
    otherwise the batches are kept (Arrow buffers, no copy) until the stream ends.

    Examples
    --------
    >>> batches = [pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [3]})]
    >>> fill_from_batches(batches, batches[0].schema, ["x"], stack=False)["x"].tolist()
    [1, 2, 3]
    """
    if rows is None:
        kept = list(batches)
        rows, batches = sum(b.num_rows for b in kept), kept
    filler = ArrayFiller(schema, columns, rows, stack=stack, order=order)
    offset = 0
    for batch in batches:
        filler.fill(offset, batch)
        offset += batch.num_rows
    if offset != rows:
        raise DataError(
            f"The plan produced {offset} rows where {rows} were counted: the input changed "
            "while it was read. Fix: read it again when it is not being written."
        )
    return filler.result()


def fill_from_parquet(
    files: Sequence[Location],
    schema: pa.Schema,
    columns: Sequence[str],
    *,
    stack: bool,
    order: str = "C",
    workers: int = 2,
) -> Any:
    """Arrays of numeric ``columns`` read from Parquet ``files`` straight into their slices.

    Footers are read in parallel (row counts → offsets), one output is allocated, then
    ``workers`` threads each read a whole file (the Arrow decoder releases the GIL) and copy
    its columns into their rows. A file whose column types differ from ``schema`` raises
    :class:`SchemaError` naming it.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> root = tempfile.mkdtemp()
    >>> for i in range(2):
    ...     pq.write_table(pa.table({"a": [i, i], "b": [9, 9]}), f"{root}/{i}.parquet")
    >>> files = [resolve(f"{root}/{i}.parquet") for i in range(2)]
    >>> schema = pa.schema({"a": pa.int64(), "b": pa.int64()})
    >>> fill_from_parquet(files, schema, ["a", "b"], stack=True).tolist()
    [[0, 9], [0, 9], [1, 9], [1, 9]]
    """
    expected = {name: schema.field(name).type for name in columns}
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="feedline-to-numpy") as pool:
        footers = list(pool.map(_footer, files))
        for loc, footer in zip(files, footers, strict=True):
            _check_types(loc, footer.schema.to_arrow_schema(), expected)
        offsets = np.concatenate([[0], np.cumsum([f.num_rows for f in footers])]).tolist()
        filler = ArrayFiller(schema, columns, offsets[-1], stack=stack, order=order)

        def read(index: int) -> None:
            loc = files[index]
            table = _read(loc, footers[index], list(columns))
            if table.num_rows != footers[index].num_rows:
                raise DataError(
                    f"{loc.url!r} decoded to {table.num_rows} rows but its footer says "
                    f"{footers[index].num_rows}. Fix: re-create the file."
                )
            filler.fill(offsets[index], table, repr(loc.url))

        for _ in pool.map(read, range(len(files))):
            pass
    return filler.result()


def fill_cube(
    files: Sequence[Location],
    schema: pa.Schema,
    columns: Sequence[str],
    *,
    rows: int | None,
    stack: bool,
    order: str = "C",
    workers: int = 2,
    check: Callable[[int], None] | None = None,
) -> Any:
    """One block per Parquet file: the first ``rows`` rows of numeric ``columns`` of each.

    ``stack=True``: a ``(files, rows, len(columns))`` array of the columns'
    :func:`stack_dtype`; ``order="C"`` makes it C-contiguous, ``order="F"`` makes each
    file's ``(rows, columns)`` block column-major (``cube[f]`` is F-contiguous: one copy
    per column). ``stack=False``: a dict of ``(files, rows)`` arrays. ``rows=None`` takes every
    row, which must then be the same number in every file. Each file's footer says which
    row groups hold its first ``rows`` rows; only those are read (a batch of ``rows`` rows
    decodes only the pages it needs), by ``workers`` threads. A file with fewer rows, a
    different column type, or one that ``check(index)`` refuses raises the error naming it.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> root = tempfile.mkdtemp()
    >>> for i in range(3):
    ...     table = pa.table({"a": [i, i, i], "b": [0.5, 1.5, 2.5]})
    ...     pq.write_table(table, f"{root}/{i}.parquet")
    >>> files = [resolve(f"{root}/{i}.parquet") for i in range(3)]
    >>> schema = pa.schema({"a": pa.int64(), "b": pa.float64()})
    >>> cube = fill_cube(files, schema, ["b", "a"], rows=2, stack=True, order="F")
    >>> cube.shape, cube.dtype, cube[2].tolist(), cube[1].flags.f_contiguous
    ((3, 2, 2), dtype('float64'), [[0.5, 2.0], [1.5, 2.0]], True)
    """
    layout = check_order(order)
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 0):
        raise ConfigurationError(
            f"to_numpy(rows={rows!r}) needs a non-negative int: the rows taken from each file. "
            "Fix: pass e.g. rows=100, or rows=None for every row."
        )
    names = list(columns)
    expected = {name: schema.field(name).type for name in names}
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="feedline-to-numpy") as pool:
        footers = list(pool.map(_footer, files))
        for loc, footer in zip(files, footers, strict=True):
            _check_types(loc, footer.schema.to_arrow_schema(), expected)
        take = rows if rows is not None else (footers[0].num_rows if footers else 0)
        for loc, footer in zip(files, footers, strict=True):
            if footer.num_rows < take or (rows is None and footer.num_rows != take):
                what = f"rows={rows}" if rows is not None else f"{take} rows like the first file"
                raise DataError(
                    f"to_numpy(per_file=True): {loc.url!r} holds {footer.num_rows} rows, but "
                    f"each file's block needs {what}. Fix: pass rows=<at most the smallest "
                    "file's rows>, or leave that file out of the input."
                )
        count = len(files)
        if stack:
            dtype = stack_dtype(expected)
            if layout == "C":
                cube: Any = np.empty((count, take, len(names)), dtype)
            else:  # each file's block column-major
                cube = np.empty((count, len(names), take), dtype).transpose(0, 2, 1)
        else:
            for name, kind in expected.items():
                if not is_numeric(kind):
                    raise SchemaError(
                        f"to_numpy(per_file=True) reads numeric columns only; {name!r} is "
                        f"{kind}. Fix: pass columns=[...] naming numeric columns."
                    )
            cube = {
                name: np.empty((count, take), kind.to_pandas_dtype())
                for name, kind in expected.items()
            }

        def read(index: int) -> None:
            loc = files[index]
            if check is not None:
                check(index)
            table = _head(loc, footers[index], names, take)
            if table.num_rows != take:
                raise DataError(
                    f"{loc.url!r} decoded to {table.num_rows} rows where its footer promised "
                    f"{take}. Fix: re-create the file."
                )
            block = cube[index] if stack else {n: a[index] for n, a in cube.items()}
            filler = ArrayFiller(schema, names, take, stack=stack, order=layout, out=block)
            filler.fill(0, table, repr(loc.url))

        for _ in pool.map(read, range(count)):
            pass
    return cube


def _head(loc: Location, footer: pq.FileMetaData, columns: list[str], rows: int) -> pa.Table:
    """The first ``rows`` rows of ``columns`` of a file: only the row groups, and within them
    the pages, that hold them."""
    if rows == 0:
        return footer.schema.to_arrow_schema().empty_table().select(columns)
    groups, held = [], 0
    for group in range(footer.num_row_groups):
        if held >= rows:
            break
        groups.append(group)
        held += footer.row_group(group).num_rows
    if held == footer.num_rows and rows == held:
        return _read(loc, footer, columns)
    try:
        batches, got = [], 0
        reader = _open(loc, footer).iter_batches(
            batch_size=max(1, rows), row_groups=groups, columns=columns, use_threads=False
        )
        for batch in reader:
            batches.append(batch)
            got += batch.num_rows
            if got >= rows:
                break
        first = pa.Table.from_batches(batches) if batches else None
    except (OSError, pa.ArrowException) as exc:
        raise DataError(
            f"Cannot decode {loc.url!r}: {exc}. The file is corrupt or truncated. Fix: "
            "re-create it or exclude it from the input."
        ) from exc
    if first is None:  # the footer promised rows the pages do not hold: the caller says so
        return footer.schema.to_arrow_schema().empty_table().select(columns)
    return first.slice(0, rows)


def per_file_inputs(
    plan: Plan, schema: pa.Schema, columns: Sequence[str]
) -> tuple[list[Location], Callable[[int], None] | None]:
    """The files of ``to_numpy(per_file=True)`` and the check each file passes before it is
    read (a feedline dataset's shard: still the file its manifest names); a plan that does
    not read Parquet files as stored raises :class:`ConfigurationError`.

    Examples
    --------
    >>> import feedline as fl
    >>> per_file_inputs(fl.range(3).plan, pa.schema({"id": pa.int64()}), ["id"])
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: to_numpy(per_file=True) reads Parquet files as stored...
    """
    source = plan.source
    if not isinstance(source, ParquetSource) or not all(isinstance(op, Select) for op in plan.ops):
        raise ConfigurationError(
            f"to_numpy(per_file=True) reads Parquet files as stored, one block each; this plan "
            f"reads {source.describe()} through {[op.describe() for op in plan.ops]}. Fix: "
            "call it on fl.read_parquet(...) or fl.open(...) (column selections at most), or "
            "use to_numpy(stack=True) and cut the rows yourself."
        )
    manifest = getattr(source, "manifest", None)
    target = getattr(source, "target", None)
    if manifest is None or target is None:
        return list(source.files), None
    shards = manifest.shards

    def check(index: int) -> None:
        check_identity(target.child(shards[index].path), shards[index], manifest.schema)

    return list(source.files), check


def _open(loc: Location, footer: pq.FileMetaData | None = None) -> pq.ParquetFile:
    source: Any = loc.path if loc.is_local else loc.fs.open(loc.path, "rb")
    return pq.ParquetFile(
        source, metadata=footer, memory_map=loc.is_local, page_checksum_verification=True
    )


def _footer(loc: Location) -> pq.FileMetaData:
    try:
        return _open(loc).metadata
    except (OSError, pa.ArrowException) as exc:
        raise DataError(
            f"Cannot read the Parquet footer of {loc.url!r}: {exc}. The file is corrupt, "
            "truncated or not Parquet. Fix: re-create it or exclude it from the input."
        ) from exc


def _read(loc: Location, footer: pq.FileMetaData, columns: list[str]) -> pa.Table:
    try:
        return _open(loc, footer).read(columns=columns, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(
            f"Cannot decode {loc.url!r}: {exc}. The file is corrupt or truncated. Fix: "
            "re-create it or exclude it from the input."
        ) from exc


def _check_types(loc: Location, stored: pa.Schema, expected: dict[str, pa.DataType]) -> None:
    for name, kind in expected.items():
        index = stored.get_field_index(name)
        found = stored.field(index).type if index >= 0 else None
        if found != kind:
            raise SchemaError(
                f"Schema drift: column {name!r} of {loc.url!r} is "
                f"{found if found is not None else 'missing'} but the dataset's schema says "
                f"{kind}. Fix: make the files agree (cast or rename columns) or read them as "
                "separate datasets."
            )


def parallel_workers(engine: Any) -> int:
    """Reader threads for the fast path: the local engine's parallelism (at least 2)."""
    return max(2, int(getattr(engine, "parallelism", 0) or 0))


def output_columns(schema: pa.Schema, columns: Sequence[str] | None, stack: bool) -> list[str]:
    """The columns ``to_numpy`` returns: ``columns``, or all (the numeric ones with ``stack``).

    Examples
    --------
    >>> schema = pa.schema({"a": pa.int8(), "s": pa.string()})
    >>> output_columns(schema, None, stack=True), output_columns(schema, None, stack=False)
    (['a'], ['a', 's'])
    """
    if columns is None:
        return numeric_columns(schema) if stack else list(schema.names)
    names = [columns] if isinstance(columns, str) else list(columns)
    missing = [c for c in names if schema.get_field_index(c) < 0]
    if missing:
        raise SchemaError(
            f"to_numpy(): column(s) {missing} are not in the dataset (columns: "
            f"{schema.names}). Fix: check the spelling or select existing columns."
        )
    return names


def stored_files(plan: Plan, schema: pa.Schema, columns: Sequence[str]) -> list[Location] | None:
    """The Parquet files to read directly, or ``None`` when the plan needs the engine.

    Direct reading applies to a plain Parquet input (not a committed feedline dataset, whose
    reads are checked against its manifest) read as stored (column selections at most) whose
    ``columns`` are all numeric.
    """

    source = plan.source
    if type(source) is not ParquetSource or not all(isinstance(op, Select) for op in plan.ops):
        return None
    if not columns or not all(is_numeric(schema.field(c).type) for c in columns):
        return None
    return source.files
