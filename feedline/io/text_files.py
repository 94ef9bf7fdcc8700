"""Reading text files: one row per line, or one row per file."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    describe_files,
    fingerprint_of,
)
from feedline.io.storage.paths import Location, expand_paths

__all__ = ["TextSource"]

TEXT_SUFFIXES = (".txt", ".text", ".md", ".cor", ".csv", ".log")
_CHUNK_BYTES = 8 << 20
_FILES_PER_TASK = 256


class TextSource(Source):
    """Text as rows of a ``text`` column (plus ``path`` when ``include_paths``).

    ``per="line"`` yields one row per line (``\\n`` or ``\\r\\n`` ends a line; a final newline
    does not add an empty row), streaming large files in chunks. ``per="file"`` yields one
    row per file. Bytes that are not valid in ``encoding`` raise :class:`DataError` naming
    the file.
    """

    kind = "text"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        per: Literal["line", "file"] = "line",
        encoding: str = "utf-8",
        include_paths: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if per not in ("line", "file"):
            raise ConfigurationError(f"per={per!r} is not valid. Fix: use 'line' or 'file'.")
        self._files = expand_paths(paths, TEXT_SUFFIXES, storage_options, what="text file")
        self._per = per
        self._encoding = encoding
        self._include_paths = include_paths

    def schema(self) -> pa.Schema:
        fields = [pa.field("text", pa.string())]
        if self._include_paths:
            fields.append(pa.field("path", pa.string()))
        return pa.schema(fields)

    def describe(self) -> str:
        return describe_files(f"text (one row per {self._per})", [f.url for f in self._files])

    def fingerprint(self) -> str:
        return fingerprint_of(self._per, *[(f.url, f.fs.size(f.path)) for f in self._files])

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the text input {self.describe()}")
        if self._per == "line":
            groups = [[loc] for loc in self._files]
        else:
            groups = [
                self._files[i : i + _FILES_PER_TASK]
                for i in range(0, len(self._files), _FILES_PER_TASK)
            ]
        return [
            ReadTask(label=group[0].url, read=self._reader(group, schema, columns, predicate))
            for group in groups
        ]

    def _reader(
        self,
        group: list[Location],
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
    ) -> ReadFn:
        def finish(batch: pa.RecordBatch) -> pa.RecordBatch:
            if predicate is not None:
                batch = batch.filter(predicate)
            return batch.select(list(columns)) if columns is not None else batch

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            if self._per == "file":
                texts = [self._decode(loc, loc.fs.cat_file(loc.path)) for loc in group]
                report.add(files_read=len(group), rows_read=len(texts))
                yield finish(self._batch(texts, [loc.url for loc in group], schema))
                return
            loc = group[0]
            report.add(files_read=1)
            for lines in _iter_lines(loc):
                texts = [self._decode(loc, line) for line in lines]
                report.add(rows_read=len(texts), bytes_read=sum(map(len, lines)))
                yield finish(self._batch(texts, [loc.url] * len(texts), schema))

        return read

    def _decode(self, loc: Location, raw: bytes) -> str:
        try:
            return raw.decode(self._encoding)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{loc.url!r} is not valid {self._encoding} text ({exc}). Fix: pass the "
                "right encoding=, or clean the file."
            ) from exc

    def _batch(self, texts: list[str], paths: list[str], schema: pa.Schema) -> pa.RecordBatch:
        arrays = [pa.array(texts, pa.string())]
        if self._include_paths:
            arrays.append(pa.array(paths, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _iter_lines(loc: Location) -> Iterator[list[bytes]]:
    """Lines of a file in chunks of about ``_CHUNK_BYTES``, without line endings."""
    rest = b""
    with loc.fs.open(loc.path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK_BYTES)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1 :]
            yield [line.removesuffix(b"\r") for line in data[:cut].split(b"\n")]
    if rest:
        yield [rest.removesuffix(b"\r")]
