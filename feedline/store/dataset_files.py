"""The feedline dataset format: Parquet shards plus a JSON manifest committed last.

Layout of a dataset folder::

    part-00000-<write id>.parquet  part-00001-<write id>.parquet  ...  _feedline.json

The manifest (:mod:`feedline.store.manifest`) is plain JSON: format version, Arrow schema,
per-shard ``{path, rows, bytes, row_groups, checksum}``, fitted preprocessor state, column
statistics, lineage and the write's id. It is the only thing that says what the dataset
is: files it does not name are ignored. Opening a dataset never runs code from it, and a
hostile manifest or shard raises a :class:`~feedline.errors.FeedlineError`.

Writes are crash-safe and exclusive (:mod:`feedline.store.commit` documents the protocol):
a write interrupted at any point leaves the old dataset or the new one, never a mix, and
of two concurrent writers one wins and the other gets
:class:`~feedline.errors.ConcurrentWriteError`. Shards are written by
:class:`~feedline.store.shards.ShardWriter`.

This module opens and verifies datasets, and re-exports the names of the other three.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import (
    ConfigurationError,
    DataError,
    FormatError,
    IncompleteDatasetError,
    IntegrityError,
)
from feedline.io.parquet import ParquetSource, read_footer
from feedline.io.source import ExecutionReport, ReadFn, ReadTask, fingerprint_of
from feedline.io.storage.paths import Location, resolve
from feedline.store.commit import (
    WriteBase,
    commit,
    is_write_leftover,
    writing,
)
from feedline.store.footers import check_identity, shard_footer
from feedline.store.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    ShardInfo,
)
from feedline.store.shards import ShardWriter, file_checksum
from feedline.store.stored_files import read_small
from feedline.store.version_files import version_manifest

__all__ = [
    "FeedlineSource",
    "check_footers",
    "open_source",
    "read_manifest",
    "verify",
    "verify_manifest",
    "write_batches",
]

_REWRITE = "Fix: re-run the write that produced this dataset."
#: shard footers read at once when a dataset is opened (remote reads are latency-bound)
FOOTER_THREADS = 16
#: a dataset of at most this many shards has every footer checked on open (its errors
#: surface there, for a bounded cost); one of more shards has each shard's footer checked
#: with the first read of that shard, from the footer read the read makes anyway
#: (:func:`~feedline.store.footers.check_identity`), so opening costs the same few requests
#: whatever the number of shards
EAGER_FOOTER_SHARDS = 64


def read_manifest(target: Location) -> Manifest | None:
    """The dataset's manifest, ``None`` when there is none; raises on an interrupted write."""
    fs = target.fs
    where = f"{target.url.rstrip('/')}/{MANIFEST_NAME}"
    try:
        # capped whatever the size claims (/dev/zero says 0); a FIFO or device is refused
        text = read_small(target.child(MANIFEST_NAME), MAX_MANIFEST_BYTES, what="the manifest")
    except FileNotFoundError:
        names = fs.ls(target.path, detail=False) if fs.isdir(target.path) else []
        if any(is_write_leftover(posixpath.basename(p.rstrip("/"))) for p in names):
            raise IncompleteDatasetError(
                f"{target.url!r} holds an interrupted (or still running) feedline write and no "
                f"{MANIFEST_NAME}, so it is not a complete dataset. Fix: re-run the write."
            ) from None
        return None
    except IsADirectoryError:
        raise FormatError(f"{where} is a folder, not a manifest. {_REWRITE}") from None
    return Manifest.from_json(text, where)


class FeedlineSource(ParquetSource):
    """The shards of a committed feedline dataset (schema and row counts from the manifest).

    Reading checks every shard against the manifest: its size and footer digest first
    (:func:`~feedline.store.footers.check_identity`: still the file whose footer was checked on
    open), then the rows it yields; a mismatch raises :class:`IntegrityError`, an
    undecodable shard or a page failing its checksum :class:`DataError`.
    """

    kind = "feedline"

    def __init__(self, target: Location, manifest: Manifest) -> None:
        files = [target.child(s.path) for s in manifest.shards]
        super().__init__(
            target.url,
            files=files,
            schema=manifest.schema,
            row_counts=[s.rows for s in manifest.shards],
            schema_origin=f"the manifest {target.url.rstrip('/')}/{MANIFEST_NAME}",
        )
        self.target = target
        self.manifest = manifest

    def describe(self) -> str:
        return f"feedline: {self.target.url} ({len(self.manifest.shards)} shards)"

    def fingerprint(self) -> str:

        return fingerprint_of(*(s.checksum for s in self.manifest.shards))

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if not self.manifest.shards:
            return []
        tasks = super().read_tasks(columns, predicate)
        return [
            ReadTask(
                task.label,
                _checked(
                    task,
                    self.target.child(shard.path),
                    shard,
                    predicate is None,
                    self.manifest.schema,
                ),
                task.estimated_bytes,
            )
            for task, shard in zip(tasks, self.manifest.shards, strict=True)
        ]


def _checked(
    task: ReadTask, location: Location, shard: ShardInfo, count: bool, schema: pa.Schema
) -> ReadFn:
    """``task.read`` checked against the manifest (footer, then row count); pyarrow errors as
    DataError."""

    def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        # still the shard whose footer was checked (on open, or now on its first read)
        check_identity(location, shard, schema)
        rows = 0
        try:
            for batch in task.read(report):
                rows += batch.num_rows
                if count and rows > shard.rows:
                    break
                yield batch
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"Cannot read the shard {task.label!r}: {str(exc)[:300]}. It is corrupt or "
                "truncated. Fix: restore it or re-run the write."
            ) from exc
        if count and rows != shard.rows:
            raise IntegrityError(
                f"The shard {task.label!r} holds "
                f"{f'more than {shard.rows}' if rows > shard.rows else rows} rows; the manifest "
                f"says {shard.rows}. It was replaced or damaged. "
                "Fix: restore it or re-run the write."
            )

    return read


def open_source(
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    version: int | None = None,
    as_of: datetime | None = None,
) -> ParquetSource:
    """The source for ``feedline.open``: a feedline dataset, or a plain Parquet folder.

    A feedline dataset's shard footers are checked against its manifest (:func:`check_footers`):
    all of them here when it has at most :data:`EAGER_FOOTER_SHARDS` shards, else each one
    before its first read (the same checks, made from the footer that read fetches anyway),
    so the requests of an open do not grow with the shards. ``verify=True`` checks every
    shard's footer and sha256 here.
    ``version`` or ``as_of`` opens an older retained version
    (:func:`~feedline.store.version_files.version_manifest`).
    """
    target = resolve(path, storage_options)
    manifest = None if target.is_local else _remote_manifest(target)
    if manifest is None:
        if not target.fs.exists(target.path):
            raise FormatError(f"{target.url!r} does not exist. Fix: check the path.")
        manifest = read_manifest(target) if target.fs.isdir(target.path) else None
    if manifest is None:
        if version is not None or as_of is not None:
            raise ConfigurationError(
                f"{target.url!r} is not a feedline dataset (no {MANIFEST_NAME}), so it has no "
                "versions. Fix: drop version=/as_of=."
            )
        return ParquetSource(path, storage_options=storage_options)
    manifest = version_manifest(target, manifest, version=version, as_of=as_of)
    if verify:
        verify_manifest(target, manifest)
    elif len(manifest.shards) <= EAGER_FOOTER_SHARDS:
        check_footers(target, manifest)
    return FeedlineSource(target, manifest)


def _remote_manifest(target: Location) -> Manifest | None:
    """The manifest of a dataset in an object store, read first thing (a ``HEAD`` and a
    ``GET``), ``None`` when there is none: an existence check and a folder test there are
    listings, which grow with the shards (a page per thousand objects)."""
    where = f"{target.url.rstrip('/')}/{MANIFEST_NAME}"
    try:
        text = read_small(target.child(MANIFEST_NAME), MAX_MANIFEST_BYTES, what="the manifest")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None  # no dataset here, or an interrupted write: read_manifest says which
    return Manifest.from_json(text, where)


def check_footers(target: Location, manifest: Manifest, threads: int = FOOTER_THREADS) -> None:
    """Check every shard's footer against the manifest, reading up to ``threads`` at once.

    Size, footer digest, row count, row-group sizes and schema
    (:func:`~feedline.store.footers.shard_footer`): a manifest claiming more rows or bytes than
    its shards hold raises :class:`IntegrityError` before anything is allocated from it.
    The first failing shard in manifest order is reported.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(10).write(out, rows_per_shard=4)
    >>> check_footers(resolve(out), read_manifest(resolve(out)))
    """

    def check(shard: ShardInfo) -> None:
        shard_footer(target.child(shard.path), shard, manifest.schema)

    shards = manifest.shards
    if threads <= 1 or len(shards) <= 1:
        for shard in shards:
            check(shard)
        return
    workers = min(threads, len(shards))
    with ThreadPoolExecutor(workers, thread_name_prefix="feedline-footers") as pool:
        for future in [pool.submit(check, shard) for shard in shards]:
            future.result()


def verify_manifest(
    target: Location, manifest: Manifest, on_shard: Callable[[ShardInfo], None] | None = None
) -> None:
    """Check every shard against the manifest: its footer (size, footer digest, row groups,
    schema: :func:`check_footers`), then its sha256. Raises :class:`IntegrityError` (a
    :class:`SchemaError` for another schema) naming the shard; ``on_shard`` is called after
    each shard's sha256 matched."""
    try:
        check_footers(target, manifest)
    except DataError as exc:  # an unreadable footer: the shard is not the file written
        reason = str(exc).split(" Fix:", 1)[0]
        raise IntegrityError(f"{reason} Fix: restore the shard or re-run the write.") from exc
    for shard in manifest.shards:
        loc = target.child(shard.path)
        if file_checksum(loc)[1] != shard.checksum:
            raise IntegrityError(
                f"Shard {shard.path} of {target.url!r} fails its checksum (the bytes changed "
                "after the write: corruption or tampering). Fix: restore it or re-run the write."
            )
        if on_shard is not None:
            on_shard(shard)


def verify(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Manifest:
    """Verify a feedline dataset's shards against its manifest.

    Examples
    --------
    >>> import feedline as fl, tempfile, pyarrow as pa
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.from_arrow(pa.table({"x": [1, 2, 3]})).write(out)
    >>> verify(out).rows
    3
    """
    target = resolve(path, storage_options)
    manifest = read_manifest(target)
    if manifest is None:
        raise FormatError(
            f"{target.url!r} has no {MANIFEST_NAME}; only feedline datasets carry checksums. "
            "Fix: write it with Dataset.write() or `feedline convert`."
        )
    verify_manifest(target, manifest)
    return manifest


def plain_parquet_shards(files: Sequence[Location]) -> list[ShardInfo]:
    """Shard entries for plain Parquet files (read from their footers; no checksums)."""
    shards = []
    for loc in files:
        meta = read_footer(loc)
        groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        shards.append(ShardInfo(loc.url, meta.num_rows, loc.fs.size(loc.path), groups, ""))
    return shards


def write_batches(
    target: Location,
    batches: Iterable[pa.RecordBatch],
    *,
    schema_hint: Callable[[], pa.Schema],
    lineage: dict[str, Any],
    writer_options: dict[str, Any],
    write_info: dict[str, Any] | None = None,
    on_rows: Callable[[int], None] | None = None,
    preprocessors: list[dict[str, Any]] | None = None,
    report: Any = None,
    base: WriteBase | None = None,
) -> Manifest:
    """Write ``batches`` as a feedline dataset at ``target`` and commit it (only if the
    dataset is still at ``base``, when given: :func:`~feedline.store.commit.note_base`)."""
    with writing(target, base) as write:
        writer = ShardWriter(
            write.shard_folder, on_rows=on_rows, write_id=write.write_id, **writer_options
        )
        try:
            for batch in batches:
                writer.write(batch)
            shards = writer.close()
        except BaseException:
            writer.abort()
            raise
        manifest = Manifest(
            schema=writer.schema if writer.schema is not None else schema_hint(),
            shards=shards,
            lineage=lineage,
            preprocessors=preprocessors or [],
            write=dict(write_info or {}) | ({"report": report.as_dict()} if report else {}),
        )
        commit(write, manifest)
    return manifest
