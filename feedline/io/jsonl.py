"""Reading JSON-lines files with pyarrow's streaming JSON reader."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from feedline.errors import DataError, SchemaError
from feedline.io.source import ExecutionReport, FileSource, ReadFn, ReadTask, check_columns
from feedline.io.storage.paths import Location, expand_paths

__all__ = ["JsonlSource"]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".ndjson.gz")
_BLOCK_SIZE = 16 << 20


class JsonlSource(FileSource):
    """Newline-delimited JSON files, one task per file.

    The schema is inferred from the first block of the first file unless ``schema`` is
    given; other files are read with it (fields they lack become nulls is NOT done
    silently: a file whose fields differ raises :class:`SchemaError` naming both files).
    """

    kind = "jsonl"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        schema: pa.Schema | None = None,
        storage_options: dict[str, Any] | None = None,
        block_size: int = _BLOCK_SIZE,
    ) -> None:
        self._files = expand_paths(paths, JSONL_SUFFIXES, storage_options, what="JSON-lines file")
        self._schema = schema
        self._block_size = block_size

    def _open_reader(self, handle: Any, schema: pa.Schema | None) -> Any:
        """A streaming reader; bad input raises ``pa.ArrowInvalid`` for the caller to classify.

        ``open_json`` already parses the first block, so drift in a small file shows up here.
        """
        parse = pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="error" if schema else "infer"
        )
        read = pajson.ReadOptions(block_size=self._block_size, use_threads=True)
        return pajson.open_json(handle, read_options=read, parse_options=parse)

    def schema(self) -> pa.Schema:
        if self._schema is None:
            first = self._files[0]
            with _open(first) as handle:
                try:
                    self._schema = self._open_reader(handle, None).schema
                except pa.ArrowInvalid as exc:
                    raise _parse_error(first, exc) from exc
        return self._schema

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the JSON-lines input {self.describe()}")
        reference = self._files[0]

        def reader(loc: Location) -> ReadFn:
            def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
                with _open(loc) as handle:
                    try:
                        stream = self._open_reader(handle, schema)
                        report.add(files_read=1)
                        for batch in stream:
                            report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
                            if predicate is not None:
                                batch = batch.filter(predicate)
                            yield batch.select(list(columns)) if columns is not None else batch
                    except pa.ArrowInvalid as exc:
                        if "unexpected field" in str(exc).lower() or "JSON field" in str(exc):
                            raise SchemaError(
                                f"Schema drift: {loc.url!r} does not match the schema of "
                                f"{reference.url!r} ({schema.names}): {exc}. Fix: make the files "
                                "agree or pass schema= covering all fields."
                            ) from exc
                        raise _parse_error(loc, exc) from exc

            return read

        return [ReadTask(label=loc.url, read=reader(loc)) for loc in self._files]


def _parse_error(loc: Location, exc: Exception) -> DataError:
    return DataError(
        f"Cannot parse the JSON-lines file {loc.url!r}: {exc}. Fix: make each line one JSON "
        "object, or pass schema= when types vary between lines."
    )


def _open(loc: Location) -> Any:
    compression = "gzip" if loc.path.endswith(".gz") else None
    return loc.fs.open(loc.path, "rb", compression=compression)
