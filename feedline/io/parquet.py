"""Reading Parquet files: column projection and predicate pushdown with row-group pruning."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from feedline.arrow.parquet_types import restore_types, same_stored_schema
from feedline.arrow.tensor_codec import logical_schema
from feedline.errors import DataError, SchemaError
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

__all__ = ["PARQUET_SUFFIXES", "ParquetSource", "read_footer", "same_schema", "scan_fragment"]

PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
#: page checksums (CRC-32), where a file has them, are verified on every read
_FORMAT = pads.ParquetFileFormat(
    default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True)
)
#: rows per batch handed downstream by the Parquet scanner
SCAN_BATCH_ROWS = 64 * 1024


def same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    """True when two schemas have the same fields (metadata ignored)."""
    return a.equals(b, check_metadata=False)


def read_footer(location: Location) -> pq.FileMetaData:
    """Read a Parquet footer, raising :class:`DataError` naming the file when it is corrupt."""
    try:
        with location.fs.open(location.path, "rb") as handle:
            return pq.ParquetFile(handle).metadata
    except (OSError, pa.ArrowException, ValueError) as exc:  # ValueError: a damaged name
        # is not UTF-8 (UnicodeDecodeError)
        raise DataError(
            f"Cannot read the Parquet footer of {location.url!r}: {exc}. The file is corrupt, "
            "truncated or not Parquet. Fix: re-create it or exclude it from the input."
        ) from exc


class ParquetSource(Source):
    """Parquet files (or folders of them) read in parallel, one task per file.

    The first file's schema is the dataset's schema (or ``schema``, recorded in the place
    ``schema_origin`` names); any file whose schema differs raises :class:`SchemaError` naming
    the file and that reference. Types Parquet stores as others (``timestamp[s]`` as
    ``timestamp[ms]``…, see :mod:`feedline.arrow.parquet_types`) are no drift: they are cast back
    to the recorded schema. A pyarrow expression predicate is pushed into the scan: row groups
    whose statistics rule it out are never read (``row_groups_skipped``).
    """

    kind = "parquet"
    prunes_with_predicate = True

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        storage_options: dict[str, Any] | None = None,
        files: Sequence[Location] | None = None,
        schema: pa.Schema | None = None,
        row_counts: Sequence[int] | None = None,
        schema_origin: str | None = None,
    ) -> None:
        self._paths = paths
        self._files = (
            list(files)
            if files is not None
            else expand_paths(paths, PARQUET_SUFFIXES, storage_options, what="Parquet file")
        )
        self._schema = schema
        self._row_counts = list(row_counts) if row_counts is not None else None
        self._schema_origin = schema_origin

    @property
    def files(self) -> list[Location]:
        """The Parquet files, in order."""
        return list(self._files)

    def schema(self) -> pa.Schema:
        if self._schema is None:
            first = self._files[0]
            try:
                stored = read_footer(first).schema.to_arrow_schema()
            except (pa.ArrowException, ValueError) as exc:
                raise DataError(
                    f"Cannot read the schema in the Parquet footer of {first.url!r}: {exc}. The "
                    "file is corrupt. Fix: re-create it or exclude it from the input."
                ) from exc
            self._schema = logical_schema(stored)  # tensors stored as binary: typed back
        return self._schema

    def describe(self) -> str:
        return describe_files("parquet", [f.url for f in self._files])

    def fingerprint(self) -> str:

        infos = []
        for loc in self._files:
            info = loc.fs.info(loc.path)
            infos.append((loc.url, info.get("size"), info.get("mtime") or info.get("LastModified")))
        return fingerprint_of(*infos)

    def count_rows(self) -> int | None:
        if self._row_counts is None:
            self._row_counts = [read_footer(loc).num_rows for loc in self._files]
        return int(sum(self._row_counts))

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the Parquet input {self.describe()}")
        origin = self._schema_origin or f"the first file {self._files[0].url!r}"
        tasks = []
        for loc in self._files:
            tasks.append(
                ReadTask(
                    label=loc.url,
                    read=_file_reader(loc, origin, schema, columns, predicate),
                )
            )
        return tasks


def _file_reader(
    loc: Location,
    origin: str,
    schema: pa.Schema,
    columns: Sequence[str] | None,
    predicate: pc.Expression | None,
    row_groups: Sequence[int] | None = None,
) -> ReadFn:
    """A read task's function: the file's rows (only ``row_groups`` when given)."""

    def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        filesystem = loc.arrow_filesystem()
        try:
            fragment = _FORMAT.make_fragment(loc.path, filesystem=filesystem)
            file_schema = fragment.physical_schema
            fragment.ensure_complete_metadata()
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"Cannot read the Parquet file {loc.url!r}: {exc}. It is corrupt, truncated or "
                "not Parquet. Fix: re-create it or exclude it from the input."
            ) from exc
        if not same_stored_schema(file_schema, schema):
            raise SchemaError(
                f"Schema drift: {loc.url!r} has schema {_short(file_schema)} but {origin} has "
                f"{_short(schema)}. Fix: make the files agree (cast or rename columns; a "
                "replaced shard of a feedline dataset: restore it or re-run the write) or read "
                "them as separate datasets."
            )
        # Read as stored, then cast back to the recorded types (timestamp[s]...).
        exact = same_schema(file_schema, schema)
        scan_schema = schema if exact else file_schema
        total = fragment.num_row_groups
        piece = fragment
        if row_groups is not None:
            try:
                piece = fragment.subset(row_group_ids=list(row_groups))
            except pa.ArrowException as exc:
                raise DataError(
                    f"Cannot read row groups {list(row_groups)} of {loc.url!r}: {exc}. The file "
                    "changed after its footer was read. Fix: re-run on the unchanged input."
                ) from exc
        try:
            for batch in scan_fragment(piece, total, scan_schema, columns, predicate, report):
                yield batch if exact else restore_types(batch, schema, repr(loc.url))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"Cannot decode {loc.url!r}: {exc}. The file is corrupt or truncated. "
                "Fix: re-create it or exclude it from the input."
            ) from exc

    return read


def scan_fragment(
    piece: pads.ParquetFileFragment,
    total: int,
    schema: pa.Schema,
    columns: Sequence[str] | None,
    predicate: pc.Expression | None,
    report: ExecutionReport,
) -> Iterator[pa.RecordBatch]:
    """The rows of one Parquet file's ``piece`` (a fragment, or a subset of its row groups).

    Row groups whose statistics rule ``predicate`` out are skipped, and the file, the row
    groups kept of its ``total`` and the rows and bytes read are counted in ``report``.
    Arrow's errors pass through: each reader says what its file is.
    """
    if predicate is not None:
        piece = piece.subset(filter=predicate, schema=schema)
    kept = piece.num_row_groups
    report.add(
        files_read=1,
        row_groups_total=total,
        row_groups_read=kept,
        row_groups_skipped=total - kept,
    )
    if kept == 0:
        return
    batches = piece.to_batches(
        schema=schema,
        columns=list(columns) if columns is not None else None,
        filter=predicate,
        batch_size=SCAN_BATCH_ROWS,
        use_threads=True,
    )
    for batch in batches:
        report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
        yield batch


def _short(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"
