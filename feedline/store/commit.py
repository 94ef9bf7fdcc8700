"""Committing a feedline write: old-or-new (never a mix), and one writer at a time.

The commit protocol is part of the format's contract. A dataset folder holds::

    _feedline.json                       the manifest: the ONLY thing that says what the data is
    _versions/v000001.json ...           every retained version's manifest (the newest is the
                                         same text as _feedline.json)
    part-00000-<write id>.parquet ...    shards; the write id (12 hex digits) is new per write
    _feedline.lock                       while a write runs: who writes (JSON)
    .feedline-staging-<write id>/        while a write runs: its shards before the commit

A write runs these steps; a crash (SIGKILL, power loss) at any point leaves the old
dataset or the new one, and the next write cleans up whatever the crash left:

1. **Lock.** Create ``_feedline.lock`` exclusively (local disk: ``os.link`` of a complete
   temporary file, which fails if the name exists; object stores: a PUT with
   ``If-None-Match: *``). The lock names the write id, host, pid and a heartbeat time that
   a background thread refreshes every :data:`HEARTBEAT_S` seconds. A lock whose holder is
   dead (same host, pid gone) or whose heartbeat is older than :data:`LOCK_TIMEOUT_S` is
   stale and is broken; any other lock makes the write fail at once with
   :class:`~feedline.errors.ConcurrentWriteError`. The write also notes the manifest it
   started from (the sha256 of its bytes, and on S3 its ETag): optimistic concurrency on
   top of the lock. ``Dataset.write`` notes it when it is called (:func:`note_base`),
   before its fits and its shards: a manifest committed since then (by a writer that
   already released the lock) fails the write here, so of two writes whose calls overlap
   exactly one commits.
2. **Stage.** Shards are written under their final names (new to this write) to
   ``.feedline-staging-<write id>/`` (hidden from readers and from plain Parquet
   listings). On object stores, where a rename is a full copy, the engines write them
   straight into the dataset folder instead (:attr:`PendingWrite.shard_folder`; Spark and
   Ray tasks under names of their own: :func:`feedline.store.shards.task_first_shard`);
   no manifest names them yet, so readers ignore them.
3. **Move in.** Check (one listing of the staging folder, and on object stores one of the
   dataset folder) that every shard the manifest names is there, that the lock is still
   this write's and that the manifest is still the one it started from, then move the
   staged shards (none on object stores) into the folder, several at once
   (local disk: ``fsync`` each shard, rename, ``fsync`` the folder; object stores: copy). The names
   are new, so no file of the committed dataset is touched; the old manifest still
   names only the old shards.
4. **Commit.** Write the new version's manifest to ``_versions/v<id>.json`` (id: the
   committed version's plus one; :mod:`feedline.store.version_files`; a dataset written
   before versions first gets its own file, as version 1). It is no version yet: a version
   file with an id above the current manifest's is never opened, and the next commit
   replaces it. Check lock and manifest again, then replace the manifest in one step
   (local disk: temporary file, ``fsync``, ``os.replace``, ``fsync`` of the folder; object
   stores: one PUT, which S3 makes visible atomically). This is the commit point. On S3 the
   PUT is conditional on the manifest the write started from (``If-Match`` on its ETag, or
   ``If-None-Match: *`` when there was none), so a writer that committed between the check
   and the PUT is never overwritten: this write fails with ``ConcurrentWriteError`` instead.
5. **Clean up.** Delete every shard file that no retained version names (interrupted
   writes, versions that :func:`feedline.store.versions.vacuum` dropped), every staging
   folder and temporary manifest, then the lock.
   A failure here does not fail the write: the next write cleans up.

Readers open only what the manifest names, so orphan files are invisible to them. A
folder with no manifest but with a staging folder, a lock or write-id shards holds an
interrupted first write and opens as :class:`~feedline.errors.IncompleteDatasetError`.
A write that fails with an exception removes its staging folder, its moved shards and
its lock, unless its manifest was committed.

An append (``mode="append"``) runs the same steps: its manifest names the committed
version's shards and then its own, new ones. Readers that opened a version keep its shards
until that version is vacuumed; then they fail with a clear
:class:`~feedline.errors.DataError` and must re-open. Backends other than local
disk and S3 fall back to "check, then create" for the lock and "check, then write" for the
manifest, which are not atomic.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from feedline.arrow.column_names import check_unique
from feedline.errors import ConcurrentWriteError, ConfigurationError, FormatError, SchemaError
from feedline.io.storage.nospace import out_of_space_as_storage_error
from feedline.io.storage.paths import Location
from feedline.store.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from feedline.store.shards import shard_name
from feedline.store.stored_files import read_small
from feedline.store.version_files import (
    VERSIONS_DIR,
    now,
    read_version,
    version_numbers,
    write_version,
)
from feedline.store.write_lock import LOCK_NAME, WriterLock, conditional

__all__ = [
    "STAGING_PREFIX",
    "PendingWrite",
    "WriteBase",
    "begin_write",
    "check_append_schema",
    "commit",
    "files_under",
    "fsync_dir",
    "fsync_file",
    "note_base",
    "prepare_target",
    "replace_manifest",
    "retained_shards",
    "writing",
]

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".feedline-staging-"
_TEMP_MANIFEST = MANIFEST_NAME + ".tmp-"
_WRITE_SHARD = re.compile(r"part-\d{5,}-([0-9a-f]{12})\.parquet")
_OLD_SHARD = re.compile(r"part-\d{5,}\.parquet")
#: shards moved in at once by a commit (step 3)
_MOVERS = 16


def is_write_leftover(name: str) -> bool:
    """True for the names only a feedline write leaves behind (staging, lock, write-id shards).

    Examples
    --------
    >>> [is_write_leftover(n) for n in ("part-00000-0a1b2c3d4e5f.parquet", "part-0.parquet")]
    [True, False]
    """
    return (
        name.startswith((LOCK_NAME, STAGING_PREFIX, _TEMP_MANIFEST))
        or _WRITE_SHARD.fullmatch(name) is not None
    )


def _names(target: Location) -> list[str]:
    return [posixpath.basename(p.rstrip("/")) for p in target.fs.ls(target.path, detail=False)]


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
    names = _names(target)
    # part files belong to feedline only beside a manifest or an interrupted feedline write:
    # a plain folder of part-*.parquet (pyarrow's default names) is the user's data
    ours = any(n in (MANIFEST_NAME, LOCK_NAME) or n.startswith(STAGING_PREFIX) for n in names)
    foreign = [
        n
        for n in names
        if not (
            n in (MANIFEST_NAME, VERSIONS_DIR)
            or is_write_leftover(n)
            or (ours and _OLD_SHARD.fullmatch(n))
        )
    ]
    if foreign:
        raise ConfigurationError(
            f"{target.url!r} holds files that are not part of a feedline dataset "
            f"({', '.join(sorted(foreign)[:5])}). feedline only replaces its own datasets. "
            "Fix: write to an empty or new folder."
        )


# --------------------------------------------------------------------------- writes


def files_under(folder: Location) -> set[str]:
    """The paths (relative to ``folder``) of the files under ``folder``, from one recursive
    listing (on S3 one paginated LIST); empty when it does not exist.

    Examples
    --------
    >>> import os, tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> folder = resolve(tempfile.mkdtemp())
    >>> os.makedirs(folder.join("sub")); _ = open(folder.join("sub/a"), "w").write("x")
    >>> files_under(folder), files_under(folder.child("missing"))
    ({'sub/a'}, set())
    """
    fs = folder.fs
    root = folder.path.rstrip("/") + "/"
    with contextlib.suppress(Exception):  # no listing cache may hide a task's new shards
        fs.invalidate_cache(folder.path)
    try:
        found = fs.find(folder.path)
    except FileNotFoundError:
        return set()
    return {p[len(root) :] for p in found if p.startswith(root)}


def _manifest_bytes(target: Location) -> bytes:
    """The committed manifest's bytes (capped, never a FIFO); ``FileNotFoundError`` if none."""
    return read_small(target.child(MANIFEST_NAME), MAX_MANIFEST_BYTES, what="the manifest")


def _manifest_token(target: Location) -> str | None:
    """The sha256 of the committed manifest's bytes (``None`` when there is none)."""
    try:
        return hashlib.sha256(_manifest_bytes(target)).hexdigest()
    except FileNotFoundError:
        return None


def _manifest_base(target: Location) -> tuple[str | None, str | None]:
    """:func:`_manifest_token` and the manifest's version (S3 ETag), from one read."""
    if not conditional(target):
        return _manifest_token(target), None
    path = target.join(MANIFEST_NAME)
    try:
        if target.fs.size(path) > MAX_MANIFEST_BYTES:  # an object's size is what it holds
            _manifest_bytes(target)  # raises, naming the limit
        data, version = target.fs.read_versioned(path)
    except FileNotFoundError:
        return None, None
    return hashlib.sha256(data).hexdigest(), version


class PendingWrite:
    """One write in progress at ``target``: its id, lock and staging folder.

    Get one from :func:`begin_write` (or the :func:`writing` context manager), write the
    shards named :meth:`shard_name` into :attr:`shard_folder` (or into :attr:`staging`),
    then :func:`commit`.
    """

    def __init__(self, target: Location, write_id: str | None = None) -> None:
        self.target = target
        #: new per write; a resumed write reuses the interrupted one's (its shard names)
        self.write_id = write_id or uuid.uuid4().hex[:12]
        self.staging = target.child(STAGING_PREFIX + self.write_id)
        self._lock = WriterLock(target, self.write_id)
        self.base: str | None = None
        self.base_version: str | None = None  # the S3 ETag of the manifest at ``base``
        #: add this write's shards to the committed version's (``mode="append"``)
        self.append = False
        self.committed = False

    @property
    def shard_folder(self) -> Location:
        """Where this write's shards go: the staging folder on local disk (renamed in at the
        commit), the dataset folder itself on object stores (where a rename is a copy)."""
        return self.staging if self.target.is_local else self.target

    def shard_name(self, index: int) -> str:
        """The file name of this write's shard ``index``."""
        return shard_name(index, self.write_id)

    def check_unchanged(self) -> None:
        """Raise :class:`ConcurrentWriteError` if another writer took over the dataset."""
        if not self._lock.held():
            raise ConcurrentWriteError(
                f"The write {self.write_id} to {self.target.url!r} lost its lock "
                f"{LOCK_NAME} (it was broken as stale, or another writer took it); nothing "
                "was committed. Fix: make sure one writer at a time writes this path, and "
                "re-run the write."
            )
        if _manifest_token(self.target) != self.base:
            raise self.overtaken()

    def overtaken(self) -> ConcurrentWriteError:
        """The error of a write that another writer's commit overtook."""
        return ConcurrentWriteError(
            f"{self.target.url!r} was committed by another writer while the write "
            f"{self.write_id} ran; that write was kept and this one was not committed. "
            "Fix: make sure one writer at a time writes this path, and re-run the write."
        )

    def release(self) -> None:
        """Release the writer lock (idempotent)."""
        self._lock.release()

    def abort(self) -> None:
        """Remove what this write left (staging, moved shards) and release its lock."""
        with contextlib.suppress(Exception):  # already failing: keep the first error
            fs = self.target.fs
            if fs.exists(self.staging.path):
                fs.rm(self.staging.path, recursive=True)
            if not self.committed and _committed_write(self.target) != self.write_id:
                for name in _names(self.target):
                    match = _WRITE_SHARD.fullmatch(name)
                    if match and match.group(1) == self.write_id:
                        fs.rm_file(self.target.join(name))
        self.release()


def _committed_write(target: Location) -> str | None:
    try:
        doc = json.loads(_manifest_bytes(target))
        return str(doc["write"]["id"])
    except Exception:  # noqa: BLE001 - no (readable) manifest: no committed write id
        return None


@dataclass(frozen=True)
class WriteBase:
    """The committed version a write started from, noted when the write was asked for
    (:func:`note_base`), before any work: the sha256 of the manifest's bytes (``None``: no
    manifest) and, on S3, its ETag."""

    token: str | None
    version: str | None = None
    #: the write adds its shards to this version (``mode="append"``) instead of replacing it
    append: bool = False


def note_base(target: Location) -> WriteBase:
    """The version committed at ``target`` now: what a write asked for now starts from.

    ``Dataset.write`` notes it first thing and hands it to the engine, whose commit then
    fails with :class:`ConcurrentWriteError` if another writer committed in between, however
    long the fits, the schema inference or the shards took, and whether or not the other
    writer still held the lock when this one took it.

    Examples
    --------
    >>> import tempfile, feedline as fl
    >>> from feedline.io.storage.paths import resolve
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> note_base(resolve(out))
    WriteBase(token=None, version=None, append=False)
    >>> _ = fl.range(3).write(out)
    >>> note_base(resolve(out)).token is not None
    True
    """
    if not target.fs.isdir(target.path):  # no dataset yet (or a file: refused later)
        return WriteBase(None)
    return WriteBase(*_manifest_base(target))


def begin_write(
    target: Location, base: WriteBase | None = None, write_id: str | None = None
) -> PendingWrite:
    """Check ``target``, take its writer lock and note the manifest the write starts from.

    With ``base`` (:func:`note_base`, noted when the write was asked for), a manifest
    committed since raises :class:`ConcurrentWriteError` at once, and the commit stays
    conditional on ``base``. ``write_id`` resumes the interrupted write of that id (its
    staging folder, :mod:`feedline.store.write_journal`); by default the id is new.
    """
    prepare_target(target)
    write = PendingWrite(target, write_id)
    write._lock.acquire()
    try:
        write.base, write.base_version = _manifest_base(target)
        if base is not None:
            if write.base != base.token:
                raise write.overtaken()
            write.base_version = base.version
            write.append = base.append
    except BaseException:
        write.release()
        raise
    return write


@contextlib.contextmanager
def writing(
    target: Location, base: WriteBase | None = None, write_id: str | None = None
) -> Iterator[PendingWrite]:
    """:func:`begin_write` as a context: anything but a committed write is aborted on exit.

    A full disk (or quota, or file size limit) anywhere in the write is raised as a
    :class:`~feedline.errors.StorageError` naming the dataset, after the abort.

    Examples
    --------
    >>> import tempfile, pyarrow as pa
    >>> from feedline.io.storage.paths import resolve
    >>> from feedline.store.shards import ShardWriter
    >>> target = resolve(tempfile.mkdtemp() + "/ds")
    >>> with writing(target) as write:
    ...     shards = ShardWriter(write.staging, write_id=write.write_id)
    ...     shards.write(pa.record_batch({"x": [1, 2]}))
    ...     commit(write, Manifest(shards.schema, shards.close()))
    >>> sorted(n.split("-")[0] for n in _names(target))
    ['_feedline.json', '_versions', 'part']
    """
    with out_of_space_as_storage_error(target.url):  # after the abort below cleaned up
        write = begin_write(target, base, write_id)
        try:
            yield write
        finally:
            if write.committed:
                write.release()
            else:
                write.abort()


def commit(write: PendingWrite, manifest: Manifest) -> None:
    """Make ``manifest`` the dataset's next version; its shards are in ``write.staging`` or,
    on object stores, may already be in the dataset folder (:attr:`PendingWrite.shard_folder`).

    Steps 3 to 5 of the protocol in this module's docstring; the write's lock is released.
    An append (:attr:`PendingWrite.append`) commits the committed version's shards followed
    by ``manifest``'s, after checking that the schemas match (:func:`check_append_schema`).
    """
    target, staging, fs = write.target, write.staging, write.target.fs
    # a schema that names a column twice cannot be read back: never commit one
    check_unique(
        manifest.schema.names,
        f"The schema of the write {write.write_id} to {target.url!r}",
        "rename or drop the repeated columns before writing (ds.rename, ds.drop, ds.select); "
        "nothing was committed.",
    )
    manifest.write = dict(manifest.write) | {"id": write.write_id}
    # one listing of each folder, not a request per shard (on S3 an existence check is a
    # HEAD, and a missing key a HEAD and a LIST)
    in_staging = files_under(staging)
    in_target: set[str] | None = set() if target.is_local else None
    staged = []
    for shard in manifest.shards:
        if shard.path in in_staging:
            staged.append(shard.path)
            continue
        if in_target is None:
            in_target = files_under(target)
        if shard.path not in in_target:
            raise FormatError(
                f"The shard {shard.path} of the write {write.write_id} is missing from "
                f"{staging.url}; nothing was committed. Fix: re-run the write."
            )
    base = _base_manifest(write)
    _as_version(write, manifest, base)
    _reached("staged")
    write.check_unchanged()

    def move_in(name: str) -> None:
        if target.is_local:
            fsync_file(staging.join(name))
        fs.mv(staging.join(name), target.join(name))
        _reached("moved")

    if staged:  # in parallel: an fsync waits on the disk, a move on S3 is a copy
        with ThreadPoolExecutor(min(_MOVERS, len(staged))) as pool:
            list(pool.map(move_in, staged))
    text = manifest.to_json().encode()
    if base is not None and read_version(target, base.version_id) is None:
        # a dataset written before versions (or whose version file was lost): keep it as one
        if not base.version:
            base.version = {"id": 1, "time": base.created, "operation": "write", "parent": None}
        write_version(target, base.version_id, base.to_json().encode())
    write_version(target, manifest.version_id, text)  # not yet a version: the manifest says
    _reached("version-staged")
    _publish(write, text)
    _reached("committed")
    logger.info(
        "Committed %s version %d (%s): %d shard(s), %d rows, %d bytes (write %s)",
        target.url, manifest.version_id, manifest.version["operation"], len(manifest.shards),
        manifest.rows, manifest.bytes, write.write_id,
    )  # fmt: skip
    with contextlib.suppress(Exception):  # the commit stands; the next write cleans up
        _collect_garbage(target, retained_shards(target, manifest))
    write.release()


def _base_manifest(write: PendingWrite) -> Manifest | None:
    """The committed manifest the write started from (``None``: there was none); a manifest
    committed since raises :class:`ConcurrentWriteError`."""
    try:
        data = _manifest_bytes(write.target)
    except FileNotFoundError:
        data = None
    if (None if data is None else hashlib.sha256(data).hexdigest()) != write.base:
        raise write.overtaken()
    if data is None:
        return None
    return Manifest.from_json(data, f"{write.target.url.rstrip('/')}/{MANIFEST_NAME}")


def _as_version(write: PendingWrite, manifest: Manifest, base: Manifest | None) -> None:
    """Make ``manifest`` the version after ``base``: its id, time and operation, and for an
    append the base's shards and fitted preprocessors before its own."""
    if write.append and base is not None:
        check_append_schema(base.schema, manifest.schema, write.target.url)
        if manifest.preprocessors != base.preprocessors:
            raise ConfigurationError(
                f"The append to {write.target.url!r} carries fitted preprocessor state that "
                "differs from the dataset's; an append keeps the dataset's fitted state. "
                "Nothing was committed. Fix: append the data unfitted (the dataset's state is "
                'applied), or write it with mode="overwrite" to refit.'
            )
        manifest.shards = [*base.shards, *manifest.shards]
        manifest.statistics = {}  # the base's statistics describe fewer rows
    operation = "write" if base is None else ("append" if write.append else "overwrite")
    manifest.version = {
        "id": 1 if base is None else base.version_id + 1,
        "time": now(),
        "operation": operation,
        "parent": None if base is None else base.version_id,
    }


def check_append_schema(existing: pa.Schema, appended: pa.Schema, where: str) -> None:
    """Raise :class:`SchemaError` unless ``appended`` has ``existing``'s columns and types
    (in the same order), naming the columns that differ.

    Examples
    --------
    >>> import pyarrow as pa
    >>> check_append_schema(pa.schema({"x": pa.int64()}), pa.schema({"y": pa.int64()}), "ds")
    Traceback (most recent call last):
    ...
    feedline.errors.SchemaError: Cannot append to ds: the columns differ (missing: ['x']; ...
    """
    old = [(f.name, f.type) for f in existing]
    new = [(f.name, f.type) for f in appended]
    if old == new:
        return
    old_types, new_types = dict(old), dict(new)
    missing = [n for n in old_types if n not in new_types]
    extra = [n for n in new_types if n not in old_types]
    changed = [
        f"{n}: {old_types[n]} -> {new_types[n]}"
        for n in old_types
        if n in new_types and old_types[n] != new_types[n]
    ]
    details = [f"missing: {missing}"] if missing else []
    details += [f"not in the dataset: {extra}"] if extra else []
    details += [f"other types: {changed}"] if changed else []
    if not details:
        details = [f"the order differs: {list(old_types)} vs {list(new_types)}"]
    raise SchemaError(
        f"Cannot append to {where}: the columns differ ({'; '.join(details)}). Nothing was "
        "committed. Fix: select, rename or cast the columns to the dataset's schema "
        f'{list(old_types)}, or write with mode="overwrite".'
    )


def retained_shards(target: Location, current: Manifest) -> set[str]:
    """The shard paths of every version ``target`` retains: ``current`` and each version file
    with a smaller id. A version file that cannot be read raises (nothing is then deleted)."""
    keep = {s.path for s in current.shards}
    for number in version_numbers(target):
        if number < current.version_id:
            manifest = read_version(target, number)
            if manifest is not None:
                keep.update(s.path for s in manifest.shards)
    return keep


def _publish(write: PendingWrite, text: bytes) -> None:
    """Step 4: replace the manifest in one step, after a last check of lock and manifest."""
    target = write.target
    if target.is_local:
        fsync_dir(target.path)
        temporary = target.join(f"{_TEMP_MANIFEST}{write.write_id}")
        with open(temporary, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        _reached("manifest-staged")
        write.check_unchanged()
        os.replace(temporary, target.join(MANIFEST_NAME))
        fsync_dir(target.path)
    elif conditional(target):
        write.check_unchanged()
        # the commit point: a PUT only if the manifest is still the one the write started from
        if target.fs.write_if(target.join(MANIFEST_NAME), text, write.base_version) is None:
            raise write.overtaken()
    else:
        write.check_unchanged()
        target.fs.pipe_file(target.join(MANIFEST_NAME), text)  # the object store's commit point
    write.committed = True


def replace_manifest(target: Location, expected: Manifest, manifest: Manifest) -> None:
    """Replace the committed manifest ``expected`` by ``manifest`` (same shards, new metadata).

    Runs under the writer lock with the same atomic replace as a commit, so it never
    overwrites a dataset that another write committed meanwhile
    (:class:`ConcurrentWriteError`). Used to store statistics after a write.

    Examples
    --------
    >>> import dataclasses, tempfile, feedline as fl
    >>> from feedline.io.storage.paths import resolve
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(3).write(out)
    >>> old = fl.open(out).manifest
    >>> replace_manifest(resolve(out), old, dataclasses.replace(old, statistics={"n": 3}))
    >>> fl.open(out).manifest.statistics
    {'n': 3}
    """
    with writing(target) as write:
        where = f"{target.url.rstrip('/')}/{MANIFEST_NAME}"
        try:
            current = Manifest.from_json(_manifest_bytes(target), where)
        except FileNotFoundError:
            current = None
        if current is None or (current.shards, current.write.get("id")) != (
            expected.shards,
            expected.write.get("id"),
        ):
            raise ConcurrentWriteError(
                f"{target.url!r} was rewritten after it was opened, so its manifest was not "
                "replaced. Fix: open it again and retry."
            )
        if manifest.shards != expected.shards:
            raise ConfigurationError(
                "replace_manifest keeps the shards; only metadata may change. Fix: write the "
                "dataset again to change its data."
            )
        text = manifest.to_json().encode()
        if manifest.version:  # the version's file holds the same manifest
            write_version(target, manifest.version_id, text)
        _publish(write, text)


def _collect_garbage(target: Location, keep: set[str]) -> None:
    """Delete the files of older and interrupted writes that no retained version names
    (``keep``: :func:`retained_shards`)."""
    fs = target.fs
    for name in _names(target):
        if name in keep or name in (MANIFEST_NAME, LOCK_NAME, VERSIONS_DIR):
            continue
        path = target.join(name)
        if name.startswith(STAGING_PREFIX):
            fs.rm(path, recursive=True)
        elif _is_file_to_collect(name):
            fs.rm_file(path)
        _reached("collected")


def _reached(step: str) -> None:
    """Called as a commit passes each step (a no-op; the crash tests pause the writer here)."""


def _is_file_to_collect(name: str) -> bool:
    # _OLD_SHARD: shards of datasets written before shard names carried write ids
    return bool(
        name.startswith((_TEMP_MANIFEST, LOCK_NAME + "."))
        or _WRITE_SHARD.fullmatch(name)
        or _OLD_SHARD.fullmatch(name)
    )


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a local file's bytes to disk (raises ``OSError`` when that fails)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make renames inside a local folder durable; best effort (some filesystems refuse)."""
    try:
        fsync_file(path)
    except OSError:
        return
