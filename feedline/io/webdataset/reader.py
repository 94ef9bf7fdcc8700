"""Reading WebDataset tar shards: one row per sample, one column per field.

A shard is a tar file whose consecutive members sharing a key form a sample
(``000123.jpg``, ``000123.cls``, ``000123.json`` → one row with ``jpg``, ``cls`` and ``json``),
see :mod:`feedline.io.webdataset.tar`. Every row also has ``__key__`` and ``__url__`` (the
names WebDataset itself gives them). Images stay encoded (``binary``) so the loader decodes
and augments them at load time (``fl.ImageTransform``); other fields are typed by extension
(:mod:`feedline.io.webdataset.fields`). A sample without some field has a null there.

One read task per shard, yielding bounded batches; no task reads another's shard, so the
local, Spark and Ray engines all run them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError, MissingDependencyError, SchemaError
from feedline.io.source import (
    ExecutionReport,
    ReadTask,
    Source,
    check_columns,
    describe_files,
    fingerprint_of,
)
from feedline.io.storage.paths import Location, expand_paths
from feedline.io.webdataset.fields import converter, resolve_fields
from feedline.io.webdataset.tar import (
    Member,
    Sample,
    TarDamage,
    iter_members,
    iter_samples,
    split_name,
)

__all__ = ["SHARD_SUFFIXES", "WebDatasetSource", "expand_urls"]

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
META_COLUMNS = ("__key__", "__url__")
_BATCH_ROWS = 1024
_BATCH_BYTES = 32 << 20
_FIX_DAMAGE = (
    "Fix: re-write or re-copy the shard, or pass on_error='skip' to keep the samples before "
    "the damage and count the rest of the shard as skipped."
)


def expand_urls(urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Brace-expand each URL as WebDataset does (``shard-{000..009}.tar`` → 10 URLs).

    Examples
    --------
    >>> expand_urls("data/train-{0..2}.tar")
    ['data/train-0.tar', 'data/train-1.tar', 'data/train-2.tar']
    >>> expand_urls(["a.tar", "b.tar"])
    ['a.tar', 'b.tar']
    """
    items = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if "{" not in text:
            out.append(text)
            continue
        try:
            import braceexpand
        except ImportError as exc:
            raise MissingDependencyError(
                "braceexpand", "webdataset", f"Expanding the shard pattern {text!r}"
            ) from exc
        out.extend(braceexpand.braceexpand(text))
    return out


class WebDatasetSource(Source):
    """WebDataset tar shards (local paths or fsspec URLs, ``.tar``, ``.tar.gz``, ``.tgz``).

    Parameters
    ----------
    urls:
        Shard paths/URLs, brace patterns (``train-{000000..000099}.tar``), globs or folders.
    fields:
        Which fields become columns and their types (see
        :func:`~feedline.io.webdataset.fields.resolve_fields`); ``None`` takes the fields of
        the first ``infer_samples`` samples, with types by extension.
    on_error:
        ``"raise"``: a damaged shard or a member that does not convert raises
        :class:`~feedline.errors.DataError` naming shard, member and byte offset; ``"skip"``:
        the sample (or the rest of a damaged shard) is dropped and counted in the report.
    infer_samples:
        How many samples are read (names only) to find the fields when ``fields`` is ``None``.
    """

    kind = "webdataset"

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        fields: Sequence[str] | Mapping[str, Any] | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        infer_samples: int = 1000,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"on_error={on_error!r} is not valid. Fix: use 'raise' or 'skip'."
            )
        self._files: list[Location] = expand_paths(
            expand_urls(urls), SHARD_SUFFIXES, storage_options, what="tar shard"
        )
        self._on_error = on_error
        self._given = fields is not None
        self._fields = resolve_fields(fields, [] if self._given else self._infer(infer_samples))
        self._schema = pa.schema(
            [pa.field("__key__", pa.string()), pa.field("__url__", pa.string())]
            + [pa.field(name, kind) for name, kind in self._fields.items()]
        )

    # ------------------------------------------------------------------ planning

    def _infer(self, limit: int) -> list[str]:
        """Field names in order of first appearance in the first ``limit`` samples."""
        found: dict[str, None] = {}
        seen = 0
        for loc in self._files:
            try:
                with loc.fs.open(loc.path, "rb") as raw:
                    names = iter_members(raw, lambda _: False, skip_by_seeking=True)
                    for sample in iter_samples(names, _ignore):
                        found.update(dict.fromkeys(sample.fields))
                        seen += 1
                        if seen >= limit:
                            return list(found)
            except TarDamage as damage:
                if self._on_error == "raise":
                    raise _damage_error(loc, damage) from None
        if not found:
            raise DataError(
                f"No WebDataset samples (members named key.field) were found in "
                f"{self._files[0].url!r}. Fix: check the shards, or name the fields with fields=."
            )
        return list(found)

    def schema(self) -> pa.Schema:
        return self._schema

    def describe(self) -> str:
        where = describe_files("webdataset", [f.url for f in self._files])
        return f"{where} fields {list(self._fields)}"

    def fingerprint(self) -> str:
        return fingerprint_of(
            self.kind, self._on_error, [(k, str(v)) for k, v in self._fields.items()],
            *[(f.url, f.fs.size(f.path)) for f in self._files],
        )  # fmt: skip

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if columns is not None:
            check_columns(self._schema, columns, f"the WebDataset input {self.describe()}")
        return [
            ReadTask(label=loc.url, read=_ShardReader(self, loc, columns, predicate))
            for loc in self._files
        ]


class _ShardReader:
    """The read task of one shard (a picklable callable: it travels to Spark and Ray)."""

    def __init__(
        self,
        source: WebDatasetSource,
        loc: Location,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
    ) -> None:
        self.loc, self.predicate = loc, predicate
        self.schema = source.schema()
        self.fields = dict(source._fields)
        self.listed = source._given  # listed fields: others are ignored
        self.on_error = source._on_error
        self.columns = list(columns) if columns is not None else None
        needed = set(self.schema.names if columns is None else columns)
        if predicate is not None:
            needed |= set(self.schema.names)  # the predicate may use any column
        self.read_fields = {f: converter(f, t) for f, t in self.fields.items() if f in needed}

    def __call__(self, report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        loc, rows, size = self.loc, _Rows(self.schema, self.loc.url), 0
        ignored: list[Member] = []
        try:
            with loc.fs.open(loc.path, "rb") as raw:
                members = iter_members(raw, lambda name: _field(name) in self.read_fields)
                for sample in iter_samples(members, ignored.append):
                    values = self._values(sample, report)
                    if values is None:
                        continue
                    size += sum(len(m.data or b"") for m in sample.fields.values())
                    rows.append(sample.key, values)
                    if len(rows) >= _BATCH_ROWS or size >= _BATCH_BYTES:
                        yield self._finish(rows.flush(), report, size)
                        size = 0
        except TarDamage as damage:
            if self.on_error == "raise":
                raise _damage_error(loc, damage) from None
            report.record_skip(
                _where(loc, damage.member, damage.offset),
                f"{damage.reason}; the rest of the shard (and its last, unfinished sample) "
                "was skipped",
            )
        except OSError as exc:
            raise DataError(
                f"Cannot read the WebDataset shard {loc.url!r}: {exc}. Fix: check that it "
                "exists and is readable."
            ) from exc
        if len(rows):
            yield self._finish(rows.flush(), report, size)
        if ignored:
            report.count("webdataset_members_without_field", len(ignored))
        report.add(files_read=1)

    def _values(self, sample: Sample, report: ExecutionReport) -> dict[str, Any] | None:
        """The converted field values of ``sample`` (``None``: skipped, and counted)."""
        loc = self.loc
        bad: tuple[Member, str, str] | None = None
        if sample.duplicate is not None:
            twice = f"the field {_field(sample.duplicate.name)!r} appears twice in the sample"
            bad = (sample.duplicate, twice, "give each member of a sample its own field name")
        else:
            unknown = [m for f, m in sample.fields.items() if f not in self.fields]
            if unknown and not self.listed:
                extra = unknown[0]
                raise SchemaError(
                    f"The WebDataset shard {loc.url!r} has a field {_field(extra.name)!r} "
                    f"(member {extra.name!r} at byte {extra.offset}) that the first samples "
                    f"did not have; the fields read are {list(self.fields)}. Fix: list the "
                    "fields to read with fields=[...] (others are then ignored), or raise "
                    "infer_samples= so the schema sees it."
                )
        values: dict[str, Any] = {}
        if bad is None:
            for name, convert in self.read_fields.items():
                member = sample.fields.get(name)
                if member is None:
                    continue
                try:
                    values[name] = convert(member.data or b"")
                except ValueError as exc:
                    reason = f"its bytes are not a valid {self.fields[name]} ({exc})"
                    bad = (member, reason, f"correct the member, read it as binary with "
                                           f"fields={{{name!r}: 'binary'}}")  # fmt: skip
                    break
        if bad is None:
            return values
        member, reason, fix = bad
        if self.on_error == "raise":
            raise DataError(
                f"Cannot read the WebDataset sample {sample.key!r}: member {member.name!r} of "
                f"the shard {loc.url!r} (byte {member.offset}): {reason}. Fix: {fix}, or pass "
                "on_error='skip' to drop such samples (they are counted)."
            )
        report.record_skip(_where(loc, member.name, member.offset), reason)
        return None

    def _finish(self, batch: pa.RecordBatch, report: ExecutionReport, size: int) -> pa.RecordBatch:
        report.add(rows_read=batch.num_rows, bytes_read=size)
        if self.predicate is not None:
            batch = batch.filter(self.predicate)
        return batch.select(self.columns) if self.columns is not None else batch


class _Rows:
    """Column lists of the samples gathered for the next batch."""

    def __init__(self, schema: pa.Schema, url: str) -> None:
        self.schema, self.url = schema, url
        self.keys: list[str] = []
        self.values: dict[str, list[Any]] = {n: [] for n in schema.names[len(META_COLUMNS) :]}

    def __len__(self) -> int:
        return len(self.keys)

    def append(self, key: str, values: dict[str, Any]) -> None:
        self.keys.append(key)
        for name, column in self.values.items():
            column.append(values.get(name))

    def flush(self) -> pa.RecordBatch:
        n = len(self.keys)
        arrays = [pa.array(self.keys, pa.string()), pa.array([self.url] * n, pa.string())]
        for field in list(self.schema)[len(META_COLUMNS) :]:
            arrays.append(pa.array(self.values[field.name], field.type))
            self.values[field.name] = []
        self.keys = []
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _field(name: str) -> str | None:
    parts = split_name(name)
    return parts[1] if parts is not None else None


def _ignore(_: Member) -> None:
    return None


def _where(loc: Location, member: str | None, offset: int) -> str:
    at = f"member {member!r} at byte {offset}" if member else f"byte {offset}"
    return f"{loc.url}: {at}"


def _damage_error(loc: Location, damage: TarDamage) -> DataError:
    member = f", member {damage.member!r}" if damage.member else ""
    return DataError(
        f"The WebDataset shard {loc.url!r} is damaged at byte {damage.offset}{member}: "
        f"{damage.reason}. {_FIX_DAMAGE}"
    )
