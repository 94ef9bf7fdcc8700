"""The feedline dataset format: Parquet shards plus a JSON manifest committed last.

Layout of a dataset folder::

    part-00000.parquet  part-00001.parquet  ...  _feedline.json

Shards are first written to a hidden staging folder inside the target; the manifest is
written to a temporary name and renamed into place as the very last step. A write that
dies before that leaves no manifest, so a half-written dataset is never opened; the next
write replaces it. The manifest is plain JSON (opening a dataset never runs code): format
version, Arrow schema, per-shard ``{path, rows, bytes, row_groups, checksum}``, fitted
preprocessor state, column statistics and lineage.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from feedline.errors import (
    ConfigurationError,
    FormatError,
    IncompleteDatasetError,
    IntegrityError,
    SchemaError,
)
from feedline.io.parquet import ParquetSource, read_footer
from feedline.io.storage import Location, resolve

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "Manifest",
    "ShardInfo",
    "ShardWriter",
    "commit",
    "open_source",
    "read_manifest",
    "verify",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "_feedline.json"
STAGING_PREFIX = ".feedline-staging-"
_MAX_MANIFEST_BYTES = 64 << 20
_CHECKSUM_CHUNK = 8 << 20


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a dataset, as recorded in the manifest."""

    path: str
    rows: int
    bytes: int
    row_groups: tuple[int, ...]
    checksum: str


@dataclass
class Manifest:
    """The committed description of a feedline dataset (``_feedline.json``)."""

    schema: pa.Schema
    shards: list[ShardInfo]
    lineage: dict[str, Any] = field(default_factory=dict)
    preprocessors: list[dict[str, Any]] = field(default_factory=list)
    statistics: dict[str, Any] = field(default_factory=dict)
    write: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    created: str = ""

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows of every row group, shard after shard (the loader's unit of reading)."""
        return [n for shard in self.shards for n in shard.row_groups]

    def to_json(self) -> str:
        """The manifest as JSON text."""
        from feedline import __version__

        document = {
            "format": "feedline",
            "format_version": self.format_version,
            "feedline_version": __version__,
            "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rows": self.rows,
            "bytes": self.bytes,
            "schema": schema_to_json(self.schema),
            "shards": [asdict(s) | {"row_groups": list(s.row_groups)} for s in self.shards],
            "preprocessors": self.preprocessors,
            "statistics": self.statistics,
            "lineage": self.lineage,
            "write": self.write,
        }
        return json.dumps(document, indent=1, allow_nan=False, default=_json_default)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        """Parse and validate manifest text; raises :class:`FormatError` naming ``where``."""
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"The manifest {where} is not valid JSON: {exc}. {_REWRITE}") from exc
        if not isinstance(doc, dict) or doc.get("format") != "feedline":
            raise FormatError(f"{where} is not a feedline manifest. {_REWRITE}")
        version = doc.get("format_version")
        if (
            not isinstance(version, int)
            or isinstance(version, bool)
            or not 1 <= version <= FORMAT_VERSION
        ):
            raise FormatError(
                f"{where} has format version {version!r}; this feedline reads versions 1 to "
                f"{FORMAT_VERSION}. Fix: upgrade feedline or rewrite the dataset."
            )
        try:
            shards = [_shard_from(entry, where) for entry in doc["shards"]]
            manifest = cls(
                schema=schema_from_json(doc["schema"], where),
                shards=shards,
                lineage=dict(doc.get("lineage") or {}),
                preprocessors=list(doc.get("preprocessors") or []),
                statistics=dict(doc.get("statistics") or {}),
                write=dict(doc.get("write") or {}),
                format_version=version,
                created=str(doc.get("created", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"The manifest {where} is malformed ({exc!r}). {_REWRITE}") from exc
        if doc.get("rows") not in (None, manifest.rows):
            raise FormatError(
                f"The manifest {where} says {doc.get('rows')} rows but its shards add up to "
                f"{manifest.rows}. {_REWRITE}"
            )
        return manifest


_REWRITE = "Fix: re-run the write that produced this dataset."


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _shard_from(entry: dict[str, Any], where: str) -> ShardInfo:
    path = entry["path"]
    if (
        not isinstance(path, str)
        or not path
        or path.startswith(("/", "\\"))
        or ":" in path
        or ".." in path.replace("\\", "/").split("/")
    ):
        raise FormatError(
            f"The manifest {where} names the shard path {path!r}, which is not a plain relative "
            f"path inside the dataset folder. {_REWRITE}"
        )
    rows, size = int(entry["rows"]), int(entry["bytes"])
    groups = tuple(int(n) for n in entry["row_groups"])
    if rows < 0 or size < 0 or any(n < 0 for n in groups) or sum(groups) != rows:
        raise FormatError(f"The manifest {where} has inconsistent sizes for {path!r}. {_REWRITE}")
    return ShardInfo(path, rows, size, groups, str(entry["checksum"]))


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A schema as JSON: readable fields plus the exact Arrow IPC encoding (base64)."""
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "arrow_ipc": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
    }


def schema_from_json(doc: dict[str, Any], where: str) -> pa.Schema:
    """Inverse of :func:`schema_to_json`."""
    try:
        raw = base64.b64decode(doc["arrow_ipc"], validate=True)
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except (KeyError, TypeError, ValueError, pa.ArrowException) as exc:
        raise FormatError(f"The schema in {where} cannot be decoded: {exc!r}. {_REWRITE}") from exc


class _HashingFile:
    """A write-only file wrapper that hashes and counts the bytes going through it."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._hash.update(view)
        self._raw.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            self.closed = True

    @property
    def checksum(self) -> str:
        return "sha256:" + self._hash.hexdigest()


class ShardWriter:
    """Writes a stream of batches as right-sized Parquet shards into a folder.

    A shard ends when it holds ``rows_per_shard`` rows (exactly) or when its file reaches
    ``bytes_per_shard`` bytes (checked at row-group boundaries). Row groups hold
    ``row_group_rows`` rows, or about ``row_group_bytes`` of uncompressed data.
    """

    def __init__(
        self,
        folder: Location,
        *,
        schema: pa.Schema | None = None,
        rows_per_shard: int | None = None,
        bytes_per_shard: int | None = 256 << 20,
        row_group_rows: int | None = None,
        row_group_bytes: int = 32 << 20,
        compression: str | None = "zstd",
        first_shard: int = 0,
        on_rows: Callable[[int], None] | None = None,
    ) -> None:
        for name, value in (("rows_per_shard", rows_per_shard), ("row_group_rows", row_group_rows)):
            if value is not None and value < 1:
                raise ConfigurationError(
                    f"{name}={value} must be >= 1. Fix: pass a positive count."
                )
        self._folder = folder
        self._schema = schema
        self._rows_per_shard = rows_per_shard
        self._bytes_per_shard = bytes_per_shard
        self._row_group_rows = row_group_rows
        self._row_group_bytes = min(row_group_bytes, bytes_per_shard or row_group_bytes)
        self._compression = "none" if compression in (None, "none") else compression
        self._next_index = first_shard
        self._on_rows = on_rows
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._file: _HashingFile | None = None
        self._path = ""
        self._groups: list[int] = []
        self.shards: list[ShardInfo] = []

    @property
    def schema(self) -> pa.Schema | None:
        return self._schema

    def write(self, batch: pa.RecordBatch) -> None:
        """Add one batch (its schema must match the first batch's)."""
        if self._schema is None:
            self._schema = batch.schema
        elif not batch.schema.equals(self._schema, check_metadata=False):
            batch = _conform(batch, self._schema)
        if batch.num_rows == 0:
            return
        if self._row_group_rows is None:
            per_row = max(1, batch.nbytes // max(1, batch.num_rows))
            self._row_group_rows = max(1, self._row_group_bytes // per_row)
        while batch.num_rows:
            room = self._room()
            part, batch = batch.slice(0, room), batch.slice(room)
            self._pending.append(part)
            self._pending_rows += part.num_rows
            if self._pending_rows >= self._row_group_rows or self._room() == 0:
                self._flush_group()

    def _room(self) -> int:
        """Rows that still fit in the current row group and shard."""
        room = self._row_group_rows - self._pending_rows
        if self._rows_per_shard is not None:
            room = min(room, self._rows_per_shard - sum(self._groups) - self._pending_rows)
        return max(room, 0)

    def _flush_group(self) -> None:
        if not self._pending_rows:
            return
        table = pa.Table.from_batches(self._pending, schema=self._schema)
        self._pending, self._pending_rows = [], 0
        if self._writer is None:
            self._open_shard()
        self._writer.write_table(table, row_group_size=table.num_rows)
        self._groups.append(table.num_rows)
        if self._on_rows is not None:
            self._on_rows(table.num_rows)
        full_rows = self._rows_per_shard is not None and sum(self._groups) >= self._rows_per_shard
        full_bytes = (
            self._bytes_per_shard is not None and self._stream.tell() >= self._bytes_per_shard
        )
        if full_rows or full_bytes:
            self._close_shard()

    def _open_shard(self) -> None:
        name = f"part-{self._next_index:05d}.parquet"
        self._next_index += 1
        self._path = name
        self._folder.fs.makedirs(self._folder.path, exist_ok=True)
        self._file = _HashingFile(self._folder.fs.open(self._folder.join(name), "wb"))
        # Parquet emits many small writes (page headers); buffer them before Python sees them.
        self._stream = pa.BufferedOutputStream(pa.PythonFile(self._file, mode="w"), 4 << 20)
        self._writer = pq.ParquetWriter(
            self._stream,
            self._schema,
            compression=self._compression,
            write_statistics=True,
            use_dictionary=dictionary_columns(self._schema),
        )
        self._groups = []

    def _close_shard(self) -> None:
        self._writer.close()
        self._stream.close()
        self._file.close()
        self.shards.append(
            ShardInfo(
                self._path,
                sum(self._groups),
                self._file.size,
                tuple(self._groups),
                self._file.checksum,
            )
        )
        self._writer = self._file = None
        self._groups = []

    def close(self) -> list[ShardInfo]:
        """Flush and close; returns every shard written."""
        self._flush_group()
        if self._writer is not None:
            self._close_shard()
        return self.shards

    def abort(self) -> None:
        """Close open files without recording the shard (after an error)."""
        if self._writer is not None:
            try:
                self._writer.close()
                self._stream.close()
                self._file.close()
            except Exception:  # noqa: BLE001 - already failing; keep the first error
                pass
            self._writer = self._file = None


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth Parquet dictionary encoding: everything but floating-point data.

    Floats (and tensors of floats) almost never repeat, so trying a dictionary first costs
    write time (up to 2x here) and, when it sticks, halves read speed. Strings, integers
    and booleans keep pyarrow's default (a dictionary, dropped when it grows too large).

    Examples
    --------
    >>> dictionary_columns(pa.schema({"x": pa.float32(), "label": pa.int64(), "s": pa.string()}))
    ['label', 's']
    """

    def floating(kind: pa.DataType) -> bool:
        if isinstance(kind, pa.ExtensionType):
            kind = kind.storage_type
        while pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or (
            pa.types.is_large_list(kind)
        ):
            kind = kind.value_type
        return pa.types.is_floating(kind)

    return [field.name for field in schema if not floating(field.type)]


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.names != schema.names:
        raise SchemaError(
            f"Batches with different columns reached the writer: {batch.schema.names} after "
            f"{schema.names}. Fix: make every map_batches call return the same columns."
        )
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaError(
            f"A batch with schema {batch.schema} cannot be written after batches with schema "
            f"{schema}: {exc}. Fix: return consistent types from map_batches."
        ) from exc


# --------------------------------------------------------------------------- commit / open


def staging_folder(target: Location) -> Location:
    """A fresh hidden staging folder inside ``target``."""
    return target.child(f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}")


def prepare_target(target: Location) -> None:
    """Check that ``target`` may be (over)written: empty, missing, or a feedline dataset."""
    fs = target.fs
    if not fs.exists(target.path):
        fs.makedirs(target.path, exist_ok=True)
        return
    if not fs.isdir(target.path):
        raise ConfigurationError(
            f"{target.url!r} is a file; a feedline dataset is a folder. Fix: choose another path."
        )
    names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(target.path, detail=False)]
    # part files belong to feedline only beside a manifest or an interrupted feedline write:
    # a plain folder of part-*.parquet (pyarrow's default names) is the user's data
    feedline_folder = any(n == MANIFEST_NAME or n.startswith(STAGING_PREFIX) for n in names)
    foreign = [n for n in names if not _ours(n, feedline_folder)]
    if foreign:
        raise ConfigurationError(
            f"{target.url!r} holds files that are not part of a feedline dataset "
            f"({', '.join(sorted(foreign)[:5])}). feedline only replaces its own datasets. "
            "Fix: write to an empty or new folder."
        )


def _ours(name: str, feedline_folder: bool) -> bool:
    """True for the names a feedline write may replace (shards only in a feedline folder)."""
    return (
        name == MANIFEST_NAME
        or name.startswith((STAGING_PREFIX, MANIFEST_NAME + ".tmp"))
        or (feedline_folder and name.startswith("part-") and name.endswith(".parquet"))
    )


def commit(target: Location, staging: Location, manifest: Manifest) -> None:
    """Replace whatever dataset is at ``target`` with the shards in ``staging``.

    The old manifest is removed first and the new one is renamed into place last, so at
    every instant the folder is either a complete dataset or has no manifest.
    """
    fs = target.fs
    old_manifest = target.join(MANIFEST_NAME)
    if fs.exists(old_manifest):
        fs.rm(old_manifest)
    for path in fs.ls(target.path, detail=False):
        name = posixpath.basename(path.rstrip("/"))
        if name.startswith("part-") and name.endswith(".parquet"):
            fs.rm(path)
    for shard in manifest.shards:
        fs.mv(staging.join(shard.path), target.join(shard.path))
    text = manifest.to_json().encode()
    temporary = target.join(f"{MANIFEST_NAME}.tmp-{uuid.uuid4().hex[:8]}")
    if target.is_local:
        with open(temporary, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, old_manifest)
        _fsync_dir(target.path)
    else:  # object stores: the manifest upload is the commit
        fs.pipe_file(old_manifest, text)
    for path in fs.ls(target.path, detail=False):
        if posixpath.basename(path.rstrip("/")).startswith(STAGING_PREFIX):
            fs.rm(path, recursive=True)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(target: Location) -> Manifest | None:
    """The dataset's manifest, ``None`` when there is none; raises on an interrupted write."""
    fs = target.fs
    path = target.join(MANIFEST_NAME)
    if not fs.exists(path):
        names = fs.ls(target.path, detail=False) if fs.isdir(target.path) else []
        if any(posixpath.basename(p.rstrip("/")).startswith(STAGING_PREFIX) for p in names):
            raise IncompleteDatasetError(
                f"{target.url!r} holds an interrupted feedline write (a staging folder and no "
                f"{MANIFEST_NAME}), so it is not a complete dataset. Fix: re-run the write."
            )
        return None
    size = fs.size(path)
    if size > _MAX_MANIFEST_BYTES:
        raise FormatError(
            f"The manifest {target.url}/{MANIFEST_NAME} is {size} bytes, over the "
            f"{_MAX_MANIFEST_BYTES}-byte limit. {_REWRITE}"
        )
    return Manifest.from_json(fs.cat_file(path), f"{target.url.rstrip('/')}/{MANIFEST_NAME}")


class FeedlineSource(ParquetSource):
    """The shards of a committed feedline dataset (schema and row counts from the manifest)."""

    kind = "feedline"

    def __init__(self, target: Location, manifest: Manifest) -> None:
        files = [target.child(s.path) for s in manifest.shards]
        super().__init__(
            target.url,
            files=files,
            schema=manifest.schema,
            row_counts=[s.rows for s in manifest.shards],
        )
        self.target = target
        self.manifest = manifest

    def describe(self) -> str:
        return f"feedline: {self.target.url} ({len(self.manifest.shards)} shards)"

    def fingerprint(self) -> str:
        from feedline.io.source import fingerprint_of

        return fingerprint_of(*(s.checksum for s in self.manifest.shards))

    def read_tasks(self, columns, predicate):
        if not self.manifest.shards:
            return []
        return super().read_tasks(columns, predicate)


def open_source(
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> ParquetSource:
    """The source for ``feedline.open``: a feedline dataset, or a plain Parquet folder."""
    target = resolve(path, storage_options)
    if not target.fs.exists(target.path):
        raise FormatError(f"{target.url!r} does not exist. Fix: check the path.")
    manifest = read_manifest(target) if target.fs.isdir(target.path) else None
    if manifest is None:
        return ParquetSource(path, storage_options=storage_options)
    if verify:
        verify_manifest(target, manifest)
    return FeedlineSource(target, manifest)


def file_checksum(location: Location) -> tuple[int, str]:
    """Size and ``"sha256:<hex>"`` checksum of a stored file, read in 8 MiB chunks.

    The same checksum the shard writer computes while writing, for files written by others
    (Spark's and Ray's writers) and for verification.
    """
    digest = hashlib.sha256()
    size = 0
    with location.fs.open(location.path, "rb") as handle:
        while chunk := handle.read(_CHECKSUM_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, "sha256:" + digest.hexdigest()


def verify_manifest(
    target: Location, manifest: Manifest, on_shard: Callable[[ShardInfo], None] | None = None
) -> None:
    """Check every shard's size and checksum; raises :class:`IntegrityError` naming the shard."""
    for shard in manifest.shards:
        loc = target.child(shard.path)
        if not loc.fs.exists(loc.path):
            raise IntegrityError(
                f"Shard {shard.path} of {target.url!r} is missing. Fix: re-run the write."
            )
        size = loc.fs.size(loc.path)
        if size != shard.bytes:
            raise IntegrityError(
                f"Shard {shard.path} of {target.url!r} is {size} bytes; the manifest says "
                f"{shard.bytes}. It was truncated or replaced. Fix: re-run the write."
            )
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
) -> Manifest:
    """Write ``batches`` as a feedline dataset at ``target`` and commit it."""
    prepare_target(target)
    staging = staging_folder(target)
    writer = ShardWriter(staging, on_rows=on_rows, **writer_options)
    try:
        for batch in batches:
            writer.write(batch)
        shards = writer.close()
    except BaseException:
        writer.abort()
        if staging.fs.exists(staging.path):
            staging.fs.rm(staging.path, recursive=True)
        raise
    manifest = Manifest(
        schema=writer.schema if writer.schema is not None else schema_hint(),
        shards=shards,
        lineage=lineage,
        preprocessors=preprocessors or [],
        write=dict(write_info or {}) | ({"report": report.as_dict()} if report else {}),
    )
    commit(target, staging, manifest)
    return manifest
