"""TFRecord files of ``tf.train.Example`` records, read and written without TensorFlow.

``fl.read_tfrecord(paths, features=...)`` builds a :class:`TfRecordSource`: one read task
per file (a TFRecord file has no index, so it is not split into byte ranges; resyncing in
the middle of a file would be possible but is not done), local paths or any fsspec URL,
plain, GZIP or ZLIB (``compression="auto"`` looks at each file's first bytes). Every
record's two CRC32C checksums are verified (:mod:`feedline.io.tfrecord.frames`), the
Examples are walked in Python and their values decoded per batch with NumPy
(:mod:`feedline.io.tfrecord.decode`), and columns are built from the feature specs
(:mod:`feedline.io.tfrecord.spec`, :mod:`feedline.io.tfrecord.columns`). Batches hold at
most ``batch_rows`` records of one read chunk (8 MiB, or one record when it is larger), and
fewer when their records or the ``FixedLen`` features of their rows take more than
:data:`BATCH_BYTES` (defaults filled in for missing features can make a batch far larger
than its records), so memory stays bounded whatever the file size. Record lengths are checked
before anything is read for them (:mod:`feedline.io.tfrecord.frames`), and so are the
lengths inside each Example (a length running past its record makes the record malformed).

Without ``features=`` the specs are inferred from the first :data:`INFER_RECORDS` records
(of the first files, in order): a feature with the same number ``k`` of values in every one
of them becomes ``FixedLen(())`` (``k == 1``) or ``FixedLen((k,))``, any other a ``VarLen``;
``int64_list`` → ``int64``, ``float_list`` → ``float32``, ``bytes_list`` → ``bytes``
(binary: pass ``"string"`` to get text). Columns come in the order the features first
appear (the column order of files written by ``write_tfrecord``). A later record that
disagrees (another kind, another count, a missing feature, or, when every column is read,
a feature the sample did not have) raises :class:`~feedline.errors.SchemaError`; it is never
skipped, because the fix is a spec.
With ``features=``, a record that does not match it is a bad record: ``on_error="raise"``
raises :class:`~feedline.errors.DataError` naming the file, record and byte offset,
``"skip"`` drops it and counts it in the execution report (like corrupt and truncated
records). Features not named in ``features=`` are ignored.

``Dataset.write_tfrecord`` writes Examples back (:mod:`feedline.io.tfrecord.writer`).

Examples
--------
>>> import feedline as fl, tempfile
>>> out = tempfile.mkdtemp() + "/tfr"
>>> _ = fl.from_arrow(pa.table({"x": [1, 2], "y": [[0.5], [1.5]]})).write_tfrecord(out)
>>> fl.read_tfrecord(out).to_arrow().to_pydict()
{'x': [1, 2], 'y': [0.5, 1.5]}
>>> spec = {"y": fl.tfrecord.VarLen("float64")}
>>> fl.read_tfrecord(out, features=spec).to_arrow().to_pydict()
{'y': [[0.5], [1.5]]}
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.source import (
    ExecutionReport,
    FileSource,
    ReadFn,
    ReadTask,
    check_columns,
    fingerprint_of,
)
from feedline.io.storage.paths import Location, expand_paths
from feedline.io.tfrecord.columns import Problems, decode_columns
from feedline.io.tfrecord.decode import (
    BYTES,
    FLOAT,
    INT64,
    KIND_NAMES,
    Parsed,
    bytes_values,
    float_values,
    int64_values,
    walk_records,
)
from feedline.io.tfrecord.frames import Block, Compression, iter_blocks, resolve_compression
from feedline.io.tfrecord.scan import parse_records
from feedline.io.tfrecord.spec import FixedLen, Spec, as_specs, infer_spec, value_bytes

__all__ = ["BATCH_BYTES", "INFER_RECORDS", "TfRecordSource"]

#: records read (from the first files, in order) to infer the specs when none are given
INFER_RECORDS = 1000
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz",
                     ".tfrecord.zlib", ".tfrecords.zlib", ".tfr")  # fmt: skip
_BATCH_ROWS = 8192
#: the most bytes the ``FixedLen`` columns of one batch may take (at least one row a batch)
BATCH_BYTES = 64 << 20


class TfRecordSource(FileSource):
    """``tf.train.Example`` records in TFRecord files (see the module docstring)."""

    kind = "tfrecord"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        features: Mapping[str, Any] | None = None,
        compression: Compression = "auto",
        on_error: Literal["raise", "skip"] = "raise",
        storage_options: dict[str, Any] | None = None,
        batch_rows: int = _BATCH_ROWS,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"on_error={on_error!r} is not valid for read_tfrecord. Fix: use 'raise' or 'skip'."
            )
        if compression not in (None, "", "GZIP", "ZLIB", "auto"):
            raise ConfigurationError(
                f"compression={compression!r} is not valid for TFRecords. Fix: use None, "
                "'GZIP', 'ZLIB' or 'auto'."
            )
        self._files = expand_paths(paths, TFRECORD_SUFFIXES, storage_options, what="TFRecord file")
        self._specs: dict[str, Spec] | None = None if features is None else as_specs(features)
        self._inferred = features is None
        self._compression = compression
        self._on_error = on_error
        self._batch_rows = max(1, int(batch_rows))

    def fingerprint(self) -> str:
        given = None if self._inferred else repr(self._specs)
        sizes = [(f.url, f.fs.size(f.path)) for f in self._files]
        return fingerprint_of(self.kind, given, self._compression, *sizes)

    def specs(self) -> dict[str, Spec]:
        """The feature specs: given, or inferred from the first records."""
        if self._specs is None:
            self._specs = self._infer()
        return self._specs

    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(name, spec.arrow_type()) for name, spec in self.specs().items()])

    # ------------------------------------------------------------------ inference

    def _infer(self) -> dict[str, Spec]:
        records: list[bytes] = []
        where: list[tuple[str, int]] = []
        for loc in self._files:
            compression = resolve_compression(loc, self._compression)
            for block in iter_blocks(loc, compression, self._on_error, ExecutionReport()):
                for start, stop, number in zip(block.starts, block.stops, block.numbers,
                                               strict=True):  # fmt: skip
                    records.append(block.buffer[start:stop])
                    where.append((loc.url, number))
                    if len(records) >= INFER_RECORDS:
                        break
                if len(records) >= INFER_RECORDS:
                    break
            if len(records) >= INFER_RECORDS:
                break
        if not records:
            raise DataError(
                f"The TFRecord input {self.describe()} holds no records to infer features from. "
                "Fix: pass features= (name -> spec), or point at files with records."
            )
        buf = b"".join(records)
        stops = np.cumsum([len(r) for r in records]).tolist()
        starts = [0, *stops[:-1]]
        keys: dict[bytes, int] = {}
        parsed = walk_records(buf, starts, stops, keys, grow=True)
        if parsed.malformed and self._on_error == "skip":  # infer from the valid records
            bad = {row for row, _ in parsed.malformed}
            records = [r for i, r in enumerate(records) if i not in bad]
            where = [w for i, w in enumerate(where) if i not in bad]
            buf = b"".join(records)
            stops = np.cumsum([len(r) for r in records]).tolist()
            starts = [0, *stops[:-1]]
            keys = {}
            parsed = walk_records(buf, starts, stops, keys, grow=True)
        if parsed.malformed:
            row, reason = parsed.malformed[0]
            url, number = where[row]
            raise DataError(
                f"TFRecord file {url!r}: record {number} {reason}. Fix: check that the file "
                "holds tf.train.Example records (not SequenceExample or other messages)."
            )
        specs: dict[str, Spec] = {}
        for key, column in keys.items():
            kinds = parsed.kinds[column]
            seen = {k for k in kinds if k in (BYTES, FLOAT, INT64)}
            kind = seen.pop() if len(seen) == 1 else BYTES
            decoders: dict[int, Callable[[bytes, Parsed, int], tuple[Any, ...]]] = {
                BYTES: bytes_values, FLOAT: float_values, INT64: int64_values
            }  # fmt: skip
            counts: np.ndarray = decoders[kind](buf, parsed, column)[1]
            spec = infer_spec(kinds, counts)
            name = key.decode("utf-8", "replace")
            if spec is None:
                first: dict[int, int] = {}
                for row, k in enumerate(kinds):
                    first.setdefault(k, row)
                shown = ", ".join(
                    f"{KIND_NAMES[k]} in record {where[r][1]} of {where[r][0]!r}"
                    for k, r in first.items()
                    if k in (BYTES, FLOAT, INT64)
                )
                raise SchemaError(
                    f"TFRecord feature {name!r} has different kinds: {shown}. Fix: pass "
                    "features= with the spec you want for it."
                )
            specs[name] = spec
        return specs

    # ------------------------------------------------------------------ reading

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        specs = self.specs()
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the TFRecord input {self.describe()}")
        names = list(columns) if columns is not None else list(specs)
        chosen = pa.schema([schema.field(name) for name in names])
        return [
            ReadTask(label=loc.url, read=self._reader(loc, names, specs, chosen, predicate))
            for loc in self._files
        ]

    def _reader(self, loc: Location, names: list[str], specs: dict[str, Spec],
                schema: pa.Schema, predicate: pc.Expression | None) -> ReadFn:  # fmt: skip
        wanted = [specs[name] for name in names]
        # a feature the sample did not have matters when every column is read
        check_new = self._inferred and len(names) == len(specs)
        row_bytes = sum(s.size * value_bytes(s.dtype) for s in wanted if isinstance(s, FixedLen))
        rows = max(1, min(self._batch_rows, BATCH_BYTES // max(row_bytes, 1)))

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            compression = resolve_compression(loc, self._compression)
            report.add(files_read=1)
            for block in iter_blocks(loc, compression, self._on_error, report):
                for first, last in _batch_ranges(block, rows):
                    batch = self._batch(loc, block, first, last, names, wanted, check_new,
                                        schema, report)  # fmt: skip
                    if predicate is not None:
                        batch = batch.filter(predicate)
                    yield batch

        return read

    def _batch(self, loc: Location, block: Block, first: int, last: int, names: list[str],
               wanted: list[Spec], check_new: bool, schema: pa.Schema,
               report: ExecutionReport) -> pa.RecordBatch:  # fmt: skip
        keys = {name.encode(): i for i, name in enumerate(names)}
        parsed = parse_records(block.buffer, block.starts[first:last], block.stops[first:last],
                               keys, extra=check_new)  # fmt: skip
        problems, build = decode_columns(block.buffer, parsed, names, wanted)
        for row, key in parsed.extra:
            shown = key.decode(errors="replace")
            problems.setdefault(row, ("schema", f"has the feature {shown!r}"))
        keep = np.ones(parsed.n, bool)
        if problems:
            self._handle(loc, block, first, problems, report)
            keep[list(problems)] = False
        arrays = build(keep)
        report.add(rows_read=int(keep.sum()))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _handle(self, loc: Location, block: Block, first: int, problems: Problems,
                report: ExecutionReport) -> None:  # fmt: skip
        for row in sorted(problems):
            category, reason = problems[row]
            number, offset = block.numbers[first + row], block.offsets[first + row]
            where = f"TFRecord file {loc.url!r}: record {number} (byte offset {offset})"
            if category == "schema" and self._inferred:
                raise SchemaError(
                    f"{where} {reason}, unlike the first {INFER_RECORDS} records the features "
                    f"were inferred from ({_describe(self.specs())}). Fix: pass features= with "
                    "a spec for every feature you want (VarLen for features whose length "
                    "varies)."
                )
            if self._on_error == "raise":
                raise DataError(
                    f"{where} {reason}. Fix: correct the features= spec or the data, or pass "
                    "on_error='skip' to drop such records (they are counted in the report)."
                )
            report.record_skip(f"{loc.url}@{offset} (record {number})", reason)


def _batch_ranges(block: Block, rows: int) -> Iterator[tuple[int, int]]:
    """``(first, last)`` record ranges of ``block``: at most ``rows`` records and, past the
    first record of a range, at most :data:`BATCH_BYTES` of record bytes (so a batch's
    binary values always fit 32-bit offsets: one record is under 2 GiB)."""
    sizes = np.asarray(block.stops, np.int64) - np.asarray(block.starts, np.int64)
    ends = np.cumsum(sizes)
    first, n = 0, len(sizes)
    while first < n:
        before = int(ends[first - 1]) if first else 0
        by_bytes = int(np.searchsorted(ends, before + BATCH_BYTES, side="right"))
        last = min(first + rows, n, max(by_bytes, first + 1))
        yield first, last
        first = last


def _describe(specs: dict[str, Spec]) -> str:
    return ", ".join(f"{name}: {spec}" for name, spec in specs.items())
