"""Reading CSV files: large uncompressed ones as byte ranges parsed in parallel (one thread
each), others with pyarrow's streaming reader. Types come from samples of the first file
(:mod:`feedline.io.csv.infer`).

Nulls: with ``null_values=None`` pyarrow's spellings (``""``, ``NA``, ``N/A``, ``NULL``,
``null``, ``NaN``, ``nan``, ``#N/A``…) are null in columns of every type but strings; an
empty field of a string column is the empty string. ``strings_can_be_null=True`` makes
them null in string columns too; ``null_values=[...]`` replaces the spellings.

Quotes: with ``newlines_in_values=False`` (the default) every record is one line. A quote
left open would make pyarrow swallow the following lines into one value; feedline spots
that (:mod:`feedline.io.csv.quotes`) and either raises a :class:`DataError` naming the file
and line, or with ``on_error="skip"`` reads the file again around the bad lines, skipping
and counting only them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.csv.files import (
    READ_ERRORS,
    data_lines,
    open_file,
    read_error,
    read_line_range,
)
from feedline.io.csv.infer import infer_schema
from feedline.io.csv.options import check_delimiter, check_null_values, with_types
from feedline.io.csv.quotes import (
    OpenQuote,
    RowLog,
    first_line_break,
    has_line_break,
    last_record_check,
    lost_step,
    read_lines,
)
from feedline.io.source import ExecutionReport, FileSource, ReadFn, ReadTask, check_columns
from feedline.io.storage.paths import Location, expand_paths

__all__ = ["CsvSource"]

CSV_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")
_BLOCK_SIZE = 16 << 20
#: uncompressed files larger than this are read as byte ranges of at most this size, in
#: parallel (32 MB measured best against 8, 16 and 64 on the CSV -> Parquet bench, 2 cores)
_SPLIT_BYTES = 32 << 20
#: ... and as at least one range per CPU, of at least this size
_MIN_RANGE_BYTES = 8 << 20
_BATCH_ROWS = 64 * 1024


class CsvSource(FileSource):
    """CSV files: byte ranges of large uncompressed files, one streamed task for the others.

    The schema is inferred from samples of the first file (its start and windows across it)
    unless ``schema`` is given (``column_types`` override either); every other file is read
    with that schema, so a file with different columns raises :class:`SchemaError` naming
    both files, and a value that does not convert raises :class:`DataError` naming the
    file. Rows with the wrong number of fields, and lines that leave a quote open, follow
    ``on_error``: ``"raise"`` stops with the file and line, ``"skip"`` drops and counts
    them. See the module docstring for nulls and quotes.
    """

    kind = "csv"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        schema: pa.Schema | None = None,
        column_types: Mapping[str, pa.DataType] | None = None,
        delimiter: str = ",",
        on_error: Literal["raise", "skip"] = "raise",
        null_values: Sequence[str] | None = None,
        strings_can_be_null: bool = False,
        storage_options: dict[str, Any] | None = None,
        block_size: int = _BLOCK_SIZE,
        newlines_in_values: bool = False,
        split_bytes: int = _SPLIT_BYTES,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"on_error={on_error!r} is not valid for read_csv. Fix: use 'raise' or 'skip'."
            )
        check_delimiter(delimiter)
        self._null_values = check_null_values(null_values)
        self._files = expand_paths(paths, CSV_SUFFIXES, storage_options, what="CSV file")
        self._column_types = dict(column_types or {})
        self._schema = None if schema is None else with_types(schema, self._column_types)
        self._delimiter = delimiter
        self._on_error = on_error
        self._strings_can_be_null = bool(strings_can_be_null)
        self._block_size = block_size
        self._newlines_in_values = newlines_in_values
        self._split_bytes = split_bytes

    # ------------------------------------------------------------------ options

    def _read_options(self, **kwargs: Any) -> pacsv.ReadOptions:
        return pacsv.ReadOptions(**({"block_size": self._block_size, "use_threads": True} | kwargs))

    def _convert_options(
        self, column_types: Mapping[str, pa.DataType], include: list[str] | None = None
    ) -> pacsv.ConvertOptions:
        options = pacsv.ConvertOptions(
            column_types=dict(column_types),
            include_columns=include,
            strings_can_be_null=self._strings_can_be_null,
        )
        if self._null_values is not None:
            options.null_values = self._null_values
        return options

    def _parse_options(self, log: RowLog, lenient: bool = False) -> pacsv.ParseOptions:
        """Parse options whose invalid-row handler notes rows with line breaks in ``log``
        and follows ``on_error`` for the rest (skips them all when ``lenient``)."""

        def handler(row: pacsv.InvalidRow) -> str:
            reason = f"expected {row.expected_columns} fields, got {row.actual_columns}"
            if has_line_break(row.text):
                log.broken = True
                if not self._newlines_in_values:
                    return "skip"  # an open quote: the file is read again around it
                lines = row.text.count("\n") + 1
                reason += f"; the record spans {lines} lines (an unterminated quote?)"
            if self._on_error == "raise" and not lenient:
                return "error"
            log.add(row.number, reason)
            return "skip"

        return pacsv.ParseOptions(
            delimiter=self._delimiter,
            invalid_row_handler=handler,
            newlines_in_values=self._newlines_in_values,
        )

    # ------------------------------------------------------------------ schema

    def schema(self) -> pa.Schema:
        if self._schema is None:
            first = self._files[0]
            schema = infer_schema(
                first,
                block_size=self._block_size,
                delimiter=self._delimiter,
                newlines_in_values=self._newlines_in_values,
                read_options=self._read_options,
                parse_options=self._parse_options,
                convert_options=self._convert_options(self._column_types),
            )
            unknown = [c for c in self._column_types if c not in schema.names]
            if unknown:
                raise SchemaError(
                    f"column_types names column(s) {unknown} that the CSV file {first.url!r} "
                    f"does not have (its columns: {schema.names}). Fix: check the spelling, "
                    "or drop them from column_types."
                )
            self._schema = schema
        return self._schema

    # ------------------------------------------------------------------ tasks

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the CSV input {self.describe()}")
        tasks = []
        for loc in self._files:
            size = loc.fs.size(loc.path) if not loc.path.endswith(".gz") else 0
            if self._newlines_in_values or size <= self._split_bytes:
                tasks.append(ReadTask(loc.url, self._reader(loc, schema, columns, predicate)))
                continue
            # Lines never contain newlines (pyarrow's own assumption unless
            # newlines_in_values=True), so byte ranges can be parsed independently.
            count = max(
                -(-size // self._split_bytes), min(os.cpu_count() or 1, size // _MIN_RANGE_BYTES)
            )
            step = -(-size // count)
            for start in range(0, size, step):
                end = min(size, start + step)
                tasks.append(
                    ReadTask(
                        f"{loc.url} (bytes {start}-{end})",
                        self._range_reader(loc, start, end, schema, columns, predicate),
                        end - start,
                    )
                )
        return tasks

    def _range_reader(
        self,
        loc: Location,
        start: int,
        end: int,
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
    ) -> ReadFn:
        """Read the lines that start in ``[start, end)`` into memory and parse them at once."""

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            header, data = read_line_range(loc, start, end, self._delimiter)
            if data is None:
                return
            where = f"{loc.url} (bytes {start}-{end})"
            if header != schema.names:
                raise SchemaError(
                    f"Schema drift: {loc.url!r} has columns {header} but "
                    f"{self._files[0].url!r} has {schema.names}. Fix: make the files agree "
                    "or read them separately."
                )
            report.add(files_read=1 if start == 0 else 0, bytes_read=data.size)
            for batch in self._parse_range(data, header, where, schema, columns, predicate, report):
                report.add(rows_read=batch.num_rows)
                yield _finish(batch, columns, predicate)

        return read

    def _parse_range(
        self,
        data: pa.Buffer,
        header: list[str],
        where: str,
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
        report: ExecutionReport,
    ) -> Iterator[pa.RecordBatch]:
        """The batches of the lines in ``data``, parsed on one thread.

        One thread, because pyarrow's multi-threaded ``read_csv`` silently drops the block
        holding a quote left open (26.0; its streaming reader and one thread raise); the
        parallelism comes from the ranges.
        """
        log = RowLog(report, where)
        try:
            table = pacsv.read_csv(
                pa.BufferReader(data),
                read_options=self._read_options(column_names=header, use_threads=False),
                parse_options=self._parse_options(log),
                convert_options=self._convert_options(
                    {f.name: f.type for f in schema}, _parsed_columns(columns, predicate)
                ),
            )
            batches = table.to_batches(max_chunksize=_BATCH_ROWS)
            if log.broken or any(first_line_break(b) is not None for b in batches):
                raise OpenQuote(0)
            log.flush()
            return iter(batches)
        except pa.ArrowInvalid as exc:
            if not lost_step(exc, log):
                raise read_error(exc, where, "its rows") from exc
        except OpenQuote:
            pass
        lines = iter(data.to_pybytes().splitlines(keepends=True))
        return self._read_lines(lines, 1, where, schema, columns, predicate, report, 0, 0)

    def _reader(
        self,
        loc: Location,
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
    ) -> ReadFn:
        """Stream one whole file (gzipped, small, or with values that span lines)."""
        parsed = _parsed_columns(columns, predicate)
        check_breaks = not self._newlines_in_values

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            log = RowLog(report, loc.url)
            done = 0
            try:
                with open_file(loc) as handle:
                    try:
                        reader = pacsv.open_csv(
                            handle,
                            read_options=self._read_options(),
                            parse_options=self._parse_options(log),
                            convert_options=self._convert_options(
                                {f.name: f.type for f in schema}, parsed
                            ),
                        )
                    except READ_ERRORS as exc:
                        raise self._trouble(exc, loc.url, log, done) from exc
                    report.add(files_read=1)
                    header = _header_names(reader, parsed, schema)
                    if header is not None:
                        raise SchemaError(
                            f"Schema drift: {loc.url!r} has columns {header} but "
                            f"{self._files[0].url!r} has {schema.names}. Fix: make the files "
                            "agree or read them as separate datasets."
                        )
                    batches = _batches(reader, lambda exc: self._trouble(exc, loc.url, log, done))
                    pairs = _no_last(batches) if check_breaks else _with_last(batches)
                    for batch, last in pairs:
                        bad = first_line_break(batch) if check_breaks else None
                        if bad is not None or (check_breaks and log.broken):
                            raise OpenQuote(done + (bad or 0))
                        if last:
                            batch = last_record_check(batch, loc.url, done, log, self._on_error)
                        done += batch.num_rows
                        report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
                        yield _finish(batch, columns, predicate)
                    if check_breaks and log.broken:  # in rows that never reached a batch
                        raise OpenQuote(done)
            except OpenQuote as trouble:
                log.rows = []
                yield from self._reread(loc, schema, columns, predicate, report, done, trouble.row)
            finally:
                log.flush()

        return read

    # ------------------------------------------------------------------ open quotes

    def _trouble(self, exc: BaseException, where: str, log: RowLog, done: int) -> Exception:
        """``OpenQuote`` when ``exc`` comes from a quote left open, else a ``DataError``."""
        if lost_step(exc, log) and not self._newlines_in_values:
            return OpenQuote(done)
        if log.broken:
            return DataError(
                f"Cannot parse the CSV file {where!r} after data row {done}: {exc}. A quoted "
                "value seems to run over several lines and to the end of the file. Fix: close "
                'the quote (a quote inside a quoted value is written ""), or pass '
                "on_error='skip' to drop that record."
            )
        return read_error(exc, where, f"data row {done + 1} or after")

    def _reread(
        self,
        loc: Location,
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
        report: ExecutionReport,
        done: int,
        approx_row: int,
    ) -> Iterator[pa.RecordBatch]:
        """Read ``loc`` again line by line around the lines that leave a quote open,
        yielding only the rows after the ``done`` already yielded."""
        try:
            with open_file(loc) as handle:
                lines = data_lines(handle)
                for batch in self._read_lines(
                    lines, 2, loc.url, schema, columns, predicate, report, done, approx_row
                ):
                    report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
                    yield _finish(batch, columns, predicate)
        except READ_ERRORS as exc:
            raise read_error(exc, loc.url, f"data row {done + 1} or after") from exc

    def _read_lines(
        self,
        lines: Iterator[bytes],
        first_number: int,
        where: str,
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
        report: ExecutionReport,
        done: int,
        approx_row: int,
    ) -> Iterator[pa.RecordBatch]:
        return read_lines(
            lines,
            first_number,
            where=where,
            delimiter=self._delimiter,
            on_error=self._on_error,
            read_options=self._read_options(column_names=schema.names, use_threads=False),
            parse_options=self._parse_options,
            convert_options=self._convert_options(
                {f.name: f.type for f in schema}, _parsed_columns(columns, predicate)
            ),
            report=report,
            skip_rows=done,
            approx_row=approx_row,
        )


def _batches(
    reader: pacsv.CSVStreamingReader, error: Callable[[BaseException], Exception]
) -> Iterator[pa.RecordBatch]:
    """The reader's batches; a read error is raised as ``error(exc)``."""
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except READ_ERRORS as exc:
            raise error(exc) from exc
        yield batch


def _with_last(items: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs (one item of look-ahead).

    Examples
    --------
    >>> list(_with_last(iter("ab")))
    [('a', False), ('b', True)]
    """
    previous = next(items, _with_last)
    if previous is _with_last:
        return
    for item in items:
        yield previous, False
        previous = item
    yield previous, True


def _no_last(items: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    return ((item, False) for item in items)


def _header_names(
    reader: pacsv.CSVStreamingReader, columns: Sequence[str] | None, schema: pa.Schema
) -> list[str] | None:
    """The file's columns when they differ from the reference schema, else ``None``."""
    expected = list(columns) if columns is not None else schema.names
    names = reader.schema.names
    return None if names == expected else names


def _parsed_columns(
    columns: Sequence[str] | None, predicate: pc.Expression | None
) -> list[str] | None:
    """The columns to parse: all of them when a predicate may read columns not selected.

    Examples
    --------
    >>> _parsed_columns(["a"], None), _parsed_columns(["a"], pc.field("b") > 0)
    (['a'], None)
    """
    return list(columns) if columns is not None and predicate is None else None


def _finish(
    batch: pa.RecordBatch, columns: Sequence[str] | None, predicate: pc.Expression | None
) -> pa.RecordBatch:
    """Filter ``batch`` by ``predicate``, then keep ``columns`` (in that order)."""
    if predicate is not None:
        batch = batch.filter(predicate)
    return batch.select(list(columns)) if columns is not None else batch
