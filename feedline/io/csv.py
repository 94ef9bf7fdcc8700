"""Reading CSV files with pyarrow's streaming, multi-threaded CSV reader."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.source import ExecutionReport, FileSource, ReadTask, check_columns
from feedline.io.storage import Location, expand_paths

__all__ = ["CsvSource"]

CSV_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")
_BLOCK_SIZE = 16 << 20
#: files larger than this are read as several byte ranges in parallel
_SPLIT_BYTES = 16 << 20


class CsvSource(FileSource):
    """CSV files read as a stream of blocks, one task per file.

    The schema is inferred from the first block of the first file unless ``schema`` is
    given; every other file is read with that schema, so a file with different columns
    raises :class:`SchemaError` naming both files, and a value that does not convert raises
    :class:`DataError` naming the file. Rows with the wrong number of fields follow
    ``on_error``: ``"raise"`` stops with the file and line, ``"skip"`` drops and counts them.
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
        storage_options: dict[str, Any] | None = None,
        block_size: int = _BLOCK_SIZE,
        newlines_in_values: bool = False,
        split_bytes: int = _SPLIT_BYTES,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"on_error={on_error!r} is not valid for read_csv. Fix: use 'raise' or 'skip'."
            )
        self._files = expand_paths(paths, CSV_SUFFIXES, storage_options, what="CSV file")
        self._schema = schema
        self._column_types = dict(column_types or {})
        self._delimiter = delimiter
        self._on_error = on_error
        self._block_size = block_size
        self._newlines_in_values = newlines_in_values
        self._split_bytes = split_bytes

    def _read_options(self) -> pacsv.ReadOptions:
        return pacsv.ReadOptions(block_size=self._block_size, use_threads=True)

    def _parse_options(self, report: ExecutionReport | None, where: str) -> pacsv.ParseOptions:
        handler = None
        if self._on_error == "skip":

            def handler(row: pacsv.InvalidRow) -> str:
                if report is not None:
                    report.record_skip(
                        f"{where}:{row.number}" if row.number is not None else where,
                        f"expected {row.expected_columns} fields, got {row.actual_columns}",
                    )
                return "skip"

        return pacsv.ParseOptions(
            delimiter=self._delimiter,
            invalid_row_handler=handler,
            newlines_in_values=self._newlines_in_values,
        )

    def schema(self) -> pa.Schema:
        if self._schema is None:
            first = self._files[0]
            with _open(first) as handle:
                try:
                    reader = pacsv.open_csv(
                        handle,
                        read_options=self._read_options(),
                        parse_options=self._parse_options(None, first.url),
                        convert_options=pacsv.ConvertOptions(column_types=self._column_types),
                    )
                except pa.ArrowInvalid as exc:
                    raise DataError(
                        f"Cannot parse the CSV file {first.url!r}: {exc}. Fix: check the "
                        "delimiter and the header line."
                    ) from exc
                self._schema = reader.schema
        return self._schema

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
            count = -(-size // self._split_bytes)
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

    def _range_reader(self, loc, start, end, schema, columns, predicate):
        reference = self._files[0]

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            header, data = _read_line_range(loc, start, end, self._delimiter)
            if data is None:
                return
            where = f"{loc.url} (bytes {start}-{end})"
            if header != schema.names:
                raise SchemaError(
                    f"Schema drift: {loc.url!r} has columns {header} but {reference.url!r} has "
                    f"{schema.names}. Fix: make the files agree or read them separately."
                )
            options = pacsv.ReadOptions(
                column_names=header, block_size=self._block_size, use_threads=False
            )
            convert = pacsv.ConvertOptions(
                column_types={f.name: f.type for f in schema},
                include_columns=_parsed_columns(columns, predicate),
            )
            try:
                table = pacsv.read_csv(
                    pa.BufferReader(data),
                    read_options=options,
                    parse_options=self._parse_options(report, where),
                    convert_options=convert,
                )
            except pa.ArrowInvalid as exc:
                raise DataError(
                    f"Cannot parse the CSV file {where}: {exc}. Fix: correct the file, pass "
                    "schema=/column_types= with wider types, newlines_in_values=True when quoted "
                    "values span lines, or on_error='skip' for rows with a wrong number of fields."
                ) from exc
            report.add(files_read=1 if start == 0 else 0, bytes_read=len(data))
            for batch in table.to_batches(max_chunksize=64 * 1024):
                report.add(rows_read=batch.num_rows)
                yield _finish(batch, columns, predicate)

        return read

    def _reader(
        self,
        loc: Location,
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
    ):
        reference = self._files[0]

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            convert = pacsv.ConvertOptions(
                column_types={f.name: f.type for f in schema},
                include_columns=_parsed_columns(columns, predicate),
            )
            with _open(loc) as handle:
                try:
                    reader = pacsv.open_csv(
                        handle,
                        read_options=self._read_options(),
                        parse_options=self._parse_options(report, loc.url),
                        convert_options=convert,
                    )
                    report.add(files_read=1)
                    header = _header_names(reader, _parsed_columns(columns, predicate), schema)
                    if header is not None:
                        raise SchemaError(
                            f"Schema drift: {loc.url!r} has columns {header} but "
                            f"{reference.url!r} has {schema.names}. Fix: make the files agree "
                            "or read them as separate datasets."
                        )
                    for batch in reader:
                        report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
                        yield _finish(batch, columns, predicate)
                except pa.ArrowInvalid as exc:
                    raise DataError(
                        f"Cannot parse the CSV file {loc.url!r}: {exc}. Fix: correct the file, "
                        "pass schema=/column_types= with wider types, or on_error='skip' for "
                        "rows with a wrong number of fields."
                    ) from exc

        return read


def _header_names(
    reader: pacsv.CSVStreamingReader, columns: Sequence[str] | None, schema: pa.Schema
) -> list[str] | None:
    """The file's columns when they differ from the reference schema, else ``None``."""
    expected = list(columns) if columns is not None else schema.names
    names = reader.schema.names
    return None if names == expected else names


def _read_line_range(
    loc: Location, start: int, end: int, delimiter: str = ","
) -> tuple[list[str], bytes | None]:
    """The header names and the bytes of the lines that *start* in ``[start, end)``.

    Line 0 (the header) is excluded. Returns ``None`` data when no line starts in the range.
    """
    with loc.fs.open(loc.path, "rb") as handle:
        first = handle.readline()
        parse = pacsv.ParseOptions(delimiter=delimiter)
        names = pacsv.read_csv(pa.BufferReader(first), parse_options=parse).column_names
        begin = max(start, len(first))
        if begin > 0:
            handle.seek(begin - 1)
            if handle.read(1) != b"\n":
                handle.readline()  # finish the line that started before the range
        if handle.tell() >= end:
            return names, None
        data = handle.read(end - handle.tell())
        if not data.endswith(b"\n"):
            data += handle.readline()
    return names, data


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


def _open(loc: Location):
    compression = "gzip" if loc.path.endswith(".gz") else None
    return loc.fs.open(loc.path, "rb", compression=compression)
