"""A dataset's history and its retention: ``fl.history(path)`` and ``fl.vacuum(path)``.

Every commit is a version (:mod:`feedline.store.version_files`); ``fl.open(path,
version=N)`` or ``as_of=datetime`` opens a retained one. Versions stay retained, and their
shards on disk, until :func:`vacuum` drops them: it deletes the version files it drops and
then every shard file that no retained version names. It runs under the writer lock
(:mod:`feedline.store.commit`), so it never races a commit; a reader of a retained version
is never disturbed, and a SIGKILL at any point leaves every retained version readable (the
version files go first; a shard only they named is an orphan the next vacuum or commit
deletes).

Examples
--------
>>> import feedline as fl, tempfile
>>> out = tempfile.mkdtemp() + "/ds"
>>> _ = fl.range(3).write(out)
>>> _ = fl.range(4).write(out, mode="append")
>>> [(v.version, v.operation, v.rows) for v in history(out)]
[(1, 'write', 3), (2, 'append', 7)]
>>> vacuum(out, keep_versions=1).versions_removed
[1]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from feedline.errors import ConfigurationError, FormatError
from feedline.io.storage.paths import Location, resolve
from feedline.store import commit
from feedline.store.commit import begin_write, retained_shards
from feedline.store.dataset_files import read_manifest
from feedline.store.manifest import MANIFEST_NAME, Manifest
from feedline.store.version_files import (
    parse_time,
    read_version,
    remove_version,
    retained_versions,
)

__all__ = ["VacuumReport", "Version", "history", "vacuum"]


@dataclass(frozen=True)
class Version:
    """One retained version of a dataset (a row of :func:`history`)."""

    version: int
    time: datetime
    operation: str
    rows: int
    shards: int
    bytes: int
    current: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe fields (the time as ISO 8601)."""
        return {
            "version": self.version, "time": self.time.isoformat(),
            "operation": self.operation, "rows": self.rows, "shards": self.shards,
            "bytes": self.bytes, "current": self.current,
        }  # fmt: skip


@dataclass(frozen=True)
class VacuumReport:
    """What :func:`vacuum` did: the versions it dropped, the versions it kept and the files
    it deleted."""

    versions_removed: list[int]
    versions_kept: list[int]
    files_removed: int


def _current(target: Location) -> Manifest:
    manifest = read_manifest(target) if target.fs.isdir(target.path) else None
    if manifest is None:
        raise FormatError(
            f"{target.url!r} is not a feedline dataset (no {MANIFEST_NAME}), so it has no "
            "versions. Fix: check the path."
        )
    return manifest


def _entry(manifest: Manifest, current: bool) -> Version:
    return Version(
        manifest.version_id,
        parse_time(str(manifest.version.get("time") or manifest.created)),
        str(manifest.version.get("operation", "write")),
        manifest.rows,
        len(manifest.shards),
        manifest.bytes,
        current,
    )


def history(
    path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> list[Version]:
    """The retained versions of the feedline dataset at ``path``, oldest first.

    Each has its id, commit time (UTC), operation (``write``, ``overwrite``, ``append``),
    rows, shards and bytes; the last is the current one. A dataset written before versions
    has one version, 1. ``feedline history PATH`` prints the same.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(3).write(out)
    >>> _ = fl.range(2).write(out)
    >>> [(v.version, v.operation, v.current) for v in fl.history(out)]
    [(1, 'write', False), (2, 'overwrite', True)]
    """
    target = resolve(path, storage_options)
    current = _current(target)
    versions = []
    for number in retained_versions(target, current):
        if number == current.version_id:
            versions.append(_entry(current, True))
        else:
            manifest = read_version(target, number)
            if manifest is not None:  # vacuumed while listed
                versions.append(_entry(manifest, False))
    return versions


def vacuum(
    path: str | os.PathLike[str],
    *,
    keep_versions: int = 1,
    older_than: timedelta | datetime | None = None,
    storage_options: dict[str, Any] | None = None,
) -> VacuumReport:
    """Drop old versions of the dataset at ``path`` and delete the shards only they used.

    A version is dropped when it is not among the newest ``keep_versions`` and, with
    ``older_than`` (a ``timedelta`` before now, or a ``datetime``), was committed before
    that time. The current version is always kept, and so is every shard a kept version
    names, so a reader iterating a kept version is never broken. Shards and staging folders
    of interrupted writes go too. Runs under the writer lock: a write in progress makes it
    fail with :class:`~feedline.errors.ConcurrentWriteError`.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> for n in (1, 2, 3):
    ...     _ = fl.range(n).write(out)
    >>> fl.vacuum(out, keep_versions=2).versions_kept
    [2, 3]
    >>> fl.open(out, version=1)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Version 1 of ... was vacuumed (retained versions: [2, 3])...
    """
    if not isinstance(keep_versions, int) or isinstance(keep_versions, bool) or keep_versions < 1:
        raise ConfigurationError(
            f"keep_versions must be an int >= 1 (the current version is always kept), got "
            f"{keep_versions!r}. Fix: pass e.g. keep_versions=5."
        )
    if older_than is not None and not isinstance(older_than, timedelta | datetime):
        raise ConfigurationError(
            f"older_than must be a timedelta or a datetime, got {type(older_than).__name__}. "
            "Fix: pass e.g. older_than=timedelta(days=7)."
        )
    if isinstance(older_than, timedelta):
        cutoff: datetime | None = datetime.now(timezone.utc) - older_than
    else:
        cutoff = None if older_than is None else older_than.astimezone(timezone.utc)
    target = resolve(path, storage_options)
    _current(target)  # a missing dataset is refused before any lock is taken
    write = begin_write(target)
    try:
        current = _current(target)  # under the lock: no commit moves it now
        retained = retained_versions(target, current)
        candidates = retained[:-keep_versions] if len(retained) > keep_versions else []
        dropped = []
        for number in candidates:
            manifest = read_version(target, number)
            if manifest is None:
                continue
            if cutoff is not None and _entry(manifest, False).time >= cutoff:
                continue
            dropped.append(number)
        for number in dropped:  # version files first: a shard is deleted once none names it
            remove_version(target, number)
            commit._reached("vacuumed-version")
        keep = retained_shards(target, current)
        before = set(commit._names(target))
        commit._collect_garbage(target, keep)
        removed = len(before - set(commit._names(target)))
    finally:
        write.release()
    kept = [n for n in retained if n not in dropped]
    return VacuumReport(dropped, kept, removed)
