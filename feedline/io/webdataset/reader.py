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

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.source import (
    ExecutionReport,
    ReadTask,
    Source,
    check_columns,
    describe_files,
    fingerprint_of,
)
from feedline.io.storage.paths import Location, expand_paths
from feedline.io.webdataset.braces import expand_urls
from feedline.io.webdataset.fields import converter, resolve_fields
from feedline.io.webdataset.tar import (
    MAX_MEMBER_BYTES,
    Damage,
    Member,
    Sample,
    check_gzip,
    iter_members,
    iter_samples,
    split_name,
)

__all__ = ["SHARD_SUFFIXES", "WebDatasetSource"]

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
META_COLUMNS = ("__key__", "__url__")
_BATCH_ROWS = 1024
_BATCH_BYTES = 32 << 20
_FIX_DAMAGE = (
    "Fix: re-write or re-copy the shard, or pass on_error='skip' to drop only the samples "
    "the damage touches (reading resumes after it; the dropped samples are counted)."
)


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
        only the samples the damage touches are dropped, each counted in the report (reading
        resumes at the next intact tar header); a ``.tar.gz`` whose gzip stream does not
        check (CRC) is skipped whole, since gzip cannot say where its damage starts (so under
        ``"skip"`` a ``.tar.gz`` is read twice: once to check its CRC).
    infer_samples:
        How many samples are read (names only) to find the fields when ``fields`` is ``None``.
    max_member_bytes:
        The most bytes one member may hold (default 1 GiB): a member claiming more is refused
        from its header, before anything is read (a ``DataError`` naming the shard, member and
        claimed size, or a counted skip under ``on_error="skip"``).
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
        max_member_bytes: int = MAX_MEMBER_BYTES,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"on_error={on_error!r} is not valid. Fix: use 'raise' or 'skip'."
            )
        if (
            not isinstance(max_member_bytes, int)
            or isinstance(max_member_bytes, bool)
            or max_member_bytes < 1
        ):
            raise ConfigurationError(
                f"max_member_bytes={max_member_bytes!r} is not a positive number of bytes. "
                "Fix: pass an int such as 1 << 30 (1 GiB)."
            )
        self._max_member_bytes = max_member_bytes
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
            with loc.fs.open(loc.path, "rb") as raw:
                names = _checked(loc, iter_members(raw, lambda _: False), self._on_error)
                for item in iter_samples(names, _ignore):
                    damage = item if isinstance(item, Damage) else item.lost
                    if damage is not None:
                        if self._on_error == "raise":
                            raise _damage_error(loc, damage)
                        continue
                    assert isinstance(item, Sample)
                    found.update(dict.fromkeys(item.fields))
                    seen += 1
                    if seen >= limit:
                        return list(found)
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
            self.kind, self._on_error, self._max_member_bytes,
            [(k, str(v)) for k, v in self._fields.items()],
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
        self.max_member_bytes = source._max_member_bytes
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
                if self.on_error == "skip" and (bad := check_gzip(raw)) is not None:
                    report.record_skip(
                        f"{loc.url}: the gzip stream",
                        f"{bad}; gzip cannot say where the damage starts, so no sample of the "
                        "shard was kept",
                    )
                    report.add(files_read=1)
                    return
                members = iter_members(
                    raw,
                    lambda name: _field(name) in self.read_fields,
                    max_member_bytes=self.max_member_bytes,
                )
                for item in iter_samples(_checked(loc, members, self.on_error), ignored.append):
                    if isinstance(item, Damage) or item.lost is not None:
                        self._lost(item, report)
                        continue
                    values = self._values(item, report)
                    if values is None:
                        continue
                    size += sum(len(m.data or b"") for m in item.fields.values())
                    rows.append(item.key, values)
                    if len(rows) >= _BATCH_ROWS or size >= _BATCH_BYTES:
                        yield self._finish(rows.flush(), report, size)
                        size = 0
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

    def _lost(self, item: Sample | Damage, report: ExecutionReport) -> None:
        """A sample the damage may have cut (or a damage that cut none): raise or count it."""
        damage = item if isinstance(item, Damage) else item.lost
        assert damage is not None
        if self.on_error == "raise":
            raise _damage_error(self.loc, damage)
        after = (
            f"reading resumed at byte {damage.resumed}"
            if damage.resumed is not None
            else "nothing after it could be read"
        )
        dropped = f"the sample {item.key!r} was dropped; " if isinstance(item, Sample) else ""
        report.record_skip(
            _where(self.loc, damage.member, damage.offset), f"{damage.reason}; {dropped}{after}"
        )

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


def _checked(
    loc: Location, events: Iterator[Member | Damage], on_error: str
) -> Iterator[Member | Damage]:
    """``events``, raising at the first damage under ``on_error="raise"`` (before reading on)."""
    for event in events:
        if on_error == "raise" and isinstance(event, Damage):
            raise _damage_error(loc, event)
        yield event


def _field(name: str) -> str | None:
    parts = split_name(name)
    return parts[1] if parts is not None else None


def _ignore(_: Member) -> None:
    return None


def _where(loc: Location, member: str | None, offset: int) -> str:
    at = f"member {member!r} at byte {offset}" if member else f"byte {offset}"
    return f"{loc.url}: {at}"


def _damage_error(loc: Location, damage: Damage) -> DataError:
    member = f", member {damage.member!r}" if damage.member else ""
    what = "refused" if damage.fix else "damaged"
    return DataError(
        f"The WebDataset shard {loc.url!r} is {what} at byte {damage.offset}{member}: "
        f"{damage.reason}. {damage.fix or _FIX_DAMAGE}"
    )
