"""Reading Petastorm datasets (Parquet written through a Unischema) without Petastorm.

The schema comes from the Unischema pickled in ``_common_metadata`` (or ``_metadata``),
read opcode by opcode and never unpickled (:mod:`feedline.io.petastorm.unischema`). When that
metadata is missing or refused, the Parquet schema is used and each binary column's codec is
detected from its first value's bytes (:func:`~feedline.io.petastorm.codecs.sniff_plan`)
(refused metadata also warns; ``explain()`` names the origin): the first value's dtype and
shape are then required of every row.

Columns become:

- ``NdarrayCodec`` / ``CompressedNdarrayCodec`` / ``CompressedImageCodec`` with a fixed
  shape of numbers: ``arrow.fixed_shape_tensor`` (what the loader turns into tensors);
  with a ``None`` dimension (or bool/str values): nested lists, one level per dimension;
- ``ScalarCodec``: the stored column, cast to the field's NumPy dtype; other columns as stored.

Each file is one read task, read row group by row group, so the local, Spark and Ray engines
run it alike. A value that cannot be decoded (or whose dtype or shape do not fit the field)
raises :class:`~feedline.errors.DataError` naming the file, row group, row and column, or with
``on_error="skip"`` drops the row and counts it in the execution report.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from feedline.errors import ConfigurationError, DataError, FormatError, SchemaError
from feedline.io.petastorm.codecs import ColumnPlan, decode_column, plan_from_field, sniff_plan
from feedline.io.petastorm.unischema import UNISCHEMA_KEY, Unischema, parse_unischema
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    fingerprint_of,
)
from feedline.io.storage.paths import Location, expand_paths, resolve

__all__ = ["PetastormSource"]

#: rows per batch handed downstream
BATCH_ROWS = 4096
#: row groups of the first file searched for a non-null value to detect a codec from
SNIFF_ROW_GROUPS = 16
_METADATA_FILES = ("_common_metadata", "_metadata")
#: what pyarrow raises on a damaged file (a column name that is not UTF-8: UnicodeDecodeError)
_READ_ERRORS = (OSError, pa.ArrowException, UnicodeDecodeError)


class PetastormSource(Source):
    """A Petastorm dataset folder (local path or fsspec URL).

    Parameters
    ----------
    path:
        The dataset's root folder (holding ``_common_metadata``).
    on_error:
        ``"raise"`` or ``"skip"`` for values that cannot be decoded.
    storage_options:
        Options for the fsspec backend.
    """

    kind = "petastorm"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_error: str = "raise",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"on_error={on_error!r} is not 'raise' or 'skip'. Fix: use one of them."
            )
        self._root = resolve(path, storage_options)
        self._files = expand_paths(path, (), storage_options, what="Parquet file")
        self._on_error = on_error
        self._unischema, self.schema_origin = self._read_unischema()
        self._stored = _stored_schema(self._files[0])
        self._plans = self._make_plans()

    # ------------------------------------------------------------------ schema

    def _read_unischema(self) -> tuple[Unischema | None, str]:
        """The Unischema and where it came from (or ``None`` and why not)."""
        if not self._root.fs.isdir(self._root.path):
            return None, "no metadata (a single file was given)"
        for name in _METADATA_FILES:
            loc = self._root.child(name)
            if not loc.fs.exists(loc.path):
                continue
            meta = _footer(loc).metadata or {}
            if UNISCHEMA_KEY not in meta:
                continue
            try:
                return parse_unischema(meta[UNISCHEMA_KEY]), f"the Unischema in {loc.url!r}"
            except FormatError as exc:
                warnings.warn(
                    f"{exc} Reading {self._root.url!r} with codecs detected from the data instead.",
                    RuntimeWarning,
                    stacklevel=4,
                )
                return None, f"codecs detected from the data ({loc.url!r} was refused)"
        return None, "codecs detected from the data (no Unischema metadata found)"

    def _make_plans(self) -> dict[str, ColumnPlan]:
        plans: dict[str, ColumnPlan] = {}
        if self._unischema is not None:
            for spec in self._unischema.fields:
                if self._stored.get_field_index(spec.name) < 0:
                    raise SchemaError(
                        f"The Unischema of {self._root.url!r} has the field {spec.name!r}, "
                        f"which its Parquet files lack (columns: {self._stored.names}). Fix: "
                        "re-generate the dataset's metadata with Petastorm, or read it with "
                        "fl.read_parquet."
                    )
                plans[spec.name] = plan_from_field(spec)
        for f in self._stored:
            if f.name in plans:
                plan = plans[f.name]
                if plan.decodes and not _is_binary(f.type):
                    raise SchemaError(
                        f"The column {f.name!r} of {self._root.url!r} is {f.type}, but its "
                        f"Unischema codec {plan.codec_name} stores binary values. Fix: "
                        "re-generate the dataset's metadata, or read it with fl.read_parquet."
                    )
            elif self._unischema is None and _is_binary(f.type):
                plans[f.name] = sniff_plan(f.name, self._first_value(f.name))
            else:
                plans[f.name] = ColumnPlan(f.name, None)
        return plans

    def _first_value(self, name: str) -> bytes | None:
        loc = self._files[0]
        try:
            with loc.fs.open(loc.path, "rb") as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                for group in range(min(parquet.num_row_groups, SNIFF_ROW_GROUPS)):
                    values = parquet.read_row_group(group, columns=[name]).column(0).drop_null()
                    if len(values):
                        return values[0].as_py()
        except _READ_ERRORS as exc:
            raise _unreadable(loc, exc) from exc
        return None

    @property
    def unischema(self) -> Unischema | None:
        """The Unischema read from the metadata, or ``None`` when codecs were detected."""
        return self._unischema

    @property
    def plans(self) -> dict[str, ColumnPlan]:
        """How each column is decoded."""
        return dict(self._plans)

    def schema(self) -> pa.Schema:
        fields = [
            pa.field(f.name, self._plans[f.name].arrow_type(f.type), f.nullable)
            for f in self._stored
        ]
        return pa.schema(fields)

    def describe(self) -> str:
        return f"petastorm: {self._root.url} ({len(self._files)} files, {self.schema_origin})"

    def fingerprint(self) -> str:
        infos = []
        for loc in self._files:
            info = loc.fs.info(loc.path)
            infos.append((loc.url, info.get("size"), info.get("mtime") or info.get("LastModified")))
        return fingerprint_of(
            self.kind, self._on_error, sorted(map(repr, self._plans.values())), *infos
        )

    def count_rows(self) -> int | None:
        if self._on_error == "skip":
            return None  # skipped rows are known only after decoding
        return int(sum(_footer(loc).num_rows for loc in self._files))

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the Petastorm dataset {self._root.url!r}")
        wanted = list(columns) if columns is not None else schema.names
        needed = schema.names if predicate is not None else wanted
        plans = {name: self._plans[name] for name in needed}
        out = pa.schema([schema.field(name) for name in needed])
        args = (self._stored, plans, out, wanted, predicate, self._on_error, self.schema_origin)
        return [ReadTask(label=loc.url, read=_file_reader(loc, *args)) for loc in self._files]


def _is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _unreadable(loc: Location, exc: BaseException) -> DataError:
    return DataError(
        f"Cannot read the Parquet file {loc.url!r}: {exc}. It is corrupt, truncated or not "
        "Parquet. Fix: re-create it or remove it from the dataset folder."
    )


def _stored_schema(loc: Location) -> pa.Schema:
    """The Arrow schema of the file at ``loc`` (its footer may be damaged)."""
    meta = _footer(loc)
    try:
        return meta.schema.to_arrow_schema()
    except _READ_ERRORS as exc:
        raise _unreadable(loc, exc) from exc


def _footer(loc: Location) -> pq.FileMetaData:
    try:
        with loc.fs.open(loc.path, "rb") as handle:
            return pq.ParquetFile(handle, page_checksum_verification=True).metadata
    except _READ_ERRORS as exc:
        raise DataError(
            f"Cannot read the Parquet footer of {loc.url!r}: {exc}. The file is corrupt, "
            "truncated or not Parquet. Fix: re-create it or remove it from the dataset folder."
        ) from exc


def _file_reader(
    loc: Location,
    stored: pa.Schema,
    plans: dict[str, ColumnPlan],
    out: pa.Schema,
    wanted: list[str],
    predicate: pc.Expression | None,
    on_error: str,
    origin: str,
) -> ReadFn:
    def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        try:
            with loc.fs.open(loc.path, "rb") as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                _check_drift(loc, parquet, stored, origin)
                declared = _declared_rows(loc, parquet.metadata)
                groups = parquet.num_row_groups
                report.add(files_read=1, row_groups_total=groups, row_groups_read=groups)
                first_row = 0
                for group in range(groups):
                    offset = 0
                    for batch in parquet.iter_batches(
                        BATCH_ROWS, row_groups=[group], columns=out.names
                    ):
                        report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
                        where = (loc.url, group, offset, first_row + offset)
                        decoded = _decode(batch, plans, out, where, on_error, report)
                        offset += batch.num_rows
                        if predicate is not None:
                            decoded = decoded.filter(predicate)
                        yield decoded.select(wanted)
                    if offset != declared[group]:
                        raise _damaged(
                            loc,
                            f"row group {group} gave {offset} rows, its footer "
                            f"declares {declared[group]}",
                        )
                    first_row += declared[group]
        except _READ_ERRORS as exc:
            raise _unreadable(loc, exc) from exc

    return read


def _damaged(loc: Location, what: str) -> DataError:
    return DataError(
        f"The Parquet file {loc.url!r} is damaged: {what}. Fix: re-create it or remove it from "
        "the dataset folder."
    )


def _declared_rows(loc: Location, meta: pq.FileMetaData) -> list[int]:
    """Rows per row group, as the footer declares them (they must add up to its total:
    the footer has no checksum, and a damaged count would silently drop rows)."""
    declared = [meta.row_group(group).num_rows for group in range(meta.num_row_groups)]
    if sum(declared) != meta.num_rows or min(declared, default=0) < 0:
        raise _damaged(
            loc, f"its row groups hold {sum(declared)} rows but its footer declares {meta.num_rows}"
        )
    return declared


def _check_drift(loc: Location, parquet: pq.ParquetFile, stored: pa.Schema, origin: str) -> None:
    schema = parquet.schema_arrow
    same = [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in stored]
    if not same:
        raise SchemaError(
            f"Schema drift: {loc.url!r} has the columns {schema.names} "
            f"({', '.join(str(f.type) for f in schema)}) but the dataset ({origin}) has "
            f"{stored.names}. Fix: read the files with different schemas as separate datasets."
        )


def _decode(
    batch: pa.RecordBatch,
    plans: dict[str, ColumnPlan],
    out: pa.Schema,
    where: tuple[str, int, int, int],
    on_error: str,
    report: ExecutionReport,
) -> pa.RecordBatch:
    """One stored batch with its columns decoded; bad rows raise or are dropped (counted)."""
    url, group, offset, file_row = where
    arrays = []
    bad: dict[int, list[str]] = {}
    for f in out:
        plan = plans[f.name]
        try:
            array, failed = decode_column(plan, batch.column(f.name))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataError(
                f"Cannot convert the column {f.name!r} of {url!r} (row group {group}) to "
                f"{f.type}: {exc}. Fix: check the Unischema's dtype against the stored data, "
                "or read the dataset with fl.read_parquet."
            ) from exc
        for row, reason in failed.items():
            bad.setdefault(row, []).append(f"column {f.name!r} ({plan.codec_name}): {reason}")
        arrays.append(array)
    result = pa.RecordBatch.from_arrays(arrays, schema=out)
    if not bad:
        return result
    rows = sorted(bad)
    if on_error == "raise":
        row = rows[0]
        more = f" ({len(rows) - 1} more bad row(s) in this row group)" if len(rows) > 1 else ""
        raise DataError(
            f"Cannot decode {url!r}, row group {group}, row {offset + row} (row "
            f"{file_row + row} of the file), {'; '.join(bad[row])}{more}. Fix: re-write the "
            "value with Petastorm, or pass on_error='skip' to drop such rows (they are "
            "counted in the execution report)."
        )
    for row in rows:
        report.record_skip(f"{url} row group {group} row {offset + row}", "; ".join(bad[row]))
    keep = np.setdiff1d(np.arange(result.num_rows), np.asarray(rows))
    return result.take(pa.array(keep))
