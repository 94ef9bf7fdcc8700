"""The versions of a feedline dataset on disk: ``_versions/v000001.json`` and so on.

Every commit is a version: a whole manifest (:class:`~feedline.store.manifest.Manifest`,
plain JSON) whose ``version`` entry holds its id (1, 2, 3 ...), its time (UTC, ISO 8601) and
its operation (``write``, ``overwrite`` or ``append``). The commit writes the version's
manifest to ``_versions/v<id, 6 digits>.json`` first and then replaces ``_feedline.json``
with the same text, so the dataset's current manifest is always its newest version and
readers that know nothing of versions read it as before.

The versions a dataset *retains* are the current one and every version file with a smaller
id; a version file with a larger id is what a commit killed before its commit point left
(never opened, overwritten by the next commit). A dataset written before versions has no
``_versions`` folder: it is version 1, and the next commit stores it there first.

Examples
--------
>>> import feedline as fl, tempfile
>>> from feedline.io.storage.paths import resolve
>>> out = tempfile.mkdtemp() + "/ds"
>>> _ = fl.range(3).write(out)
>>> _ = fl.range(5).write(out)
>>> version_numbers(resolve(out))
[1, 2]
"""

from __future__ import annotations

import os
import posixpath
import re
import uuid
from datetime import datetime, timezone

from feedline.errors import ConfigurationError, FormatError
from feedline.io.storage.paths import Location
from feedline.store.manifest import MAX_MANIFEST_BYTES, Manifest
from feedline.store.stored_files import read_small

__all__ = [
    "VERSIONS_DIR",
    "now",
    "parse_time",
    "read_version",
    "remove_version",
    "retained_versions",
    "version_file",
    "version_manifest",
    "version_numbers",
    "write_version",
]

VERSIONS_DIR = "_versions"
_FILE = re.compile(r"v(\d{6,})\.json")


def version_file(target: Location, number: int) -> Location:
    """Where the manifest of version ``number`` is kept."""
    return target.child(f"{VERSIONS_DIR}/v{number:06d}.json")


def version_numbers(target: Location) -> list[int]:
    """The ids of the version files at ``target``, ascending (``[]``: no ``_versions``)."""
    folder = target.join(VERSIONS_DIR)
    try:
        names = [posixpath.basename(p.rstrip("/")) for p in target.fs.ls(folder, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for m in map(_FILE.fullmatch, names) if m)


def read_version(target: Location, number: int) -> Manifest | None:
    """The manifest of version ``number`` (``None`` when its file is gone); the file must say
    it is that version, else :class:`FormatError`."""
    location = version_file(target, number)
    try:
        text = read_small(location, MAX_MANIFEST_BYTES, what="the version manifest")
    except FileNotFoundError:
        return None
    manifest = Manifest.from_json(text, location.url)
    if manifest.version_id != number:
        raise FormatError(
            f"The version manifest {location.url} says it is version {manifest.version_id}, "
            f"not {number}. Fix: restore the file or vacuum the dataset."
        )
    return manifest


def write_version(target: Location, number: int, text: bytes) -> None:
    """Store ``text`` as the manifest of version ``number`` (replacing a leftover file of a
    killed commit): whole or not at all (local disk: temporary file, ``fsync``, rename)."""
    location = version_file(target, number)
    fs = target.fs
    fs.makedirs(target.join(VERSIONS_DIR), exist_ok=True)
    if not target.is_local:
        fs.pipe_file(location.path, text)  # an object appears whole
        return
    temporary = f"{location.path}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        with open(temporary, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, location.path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    _fsync_dir(target.join(VERSIONS_DIR))


def remove_version(target: Location, number: int) -> None:
    """Delete the file of version ``number`` (a no-op when it is gone)."""
    location = version_file(target, number)
    if target.fs.exists(location.path):
        target.fs.rm_file(location.path)


def now() -> str:
    """The time of a commit: UTC, ISO 8601 with microseconds.

    Examples
    --------
    >>> parse_time(now()).tzinfo is not None
    True
    """
    return datetime.now(timezone.utc).isoformat()


def parse_time(text: str) -> datetime:
    """A version's time as an aware ``datetime`` (a time without zone is taken as UTC; an
    unreadable one as the earliest time).

    Examples
    --------
    >>> parse_time("2024-05-01T12:00:00Z").isoformat()
    '2024-05-01T12:00:00+00:00'
    """
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def retained_versions(target: Location, current: Manifest) -> list[int]:
    """The ids of the versions ``target`` retains, ascending: each version file below the
    current version, then the current version."""
    current_id = current.version_id
    return [n for n in version_numbers(target) if n < current_id] + [current_id]


def version_manifest(
    target: Location,
    current: Manifest,
    *,
    version: int | None = None,
    as_of: datetime | None = None,
) -> Manifest:
    """The manifest of ``version`` (an id) or of the newest version committed at or before
    ``as_of`` (a naive ``datetime`` is local time), given the ``current`` one; neither:
    ``current``. A version that is not retained raises :class:`ConfigurationError`.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> from feedline.store.dataset_files import read_manifest
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(3).write(out)
    >>> _ = fl.range(5).write(out)
    >>> version_manifest(resolve(out), read_manifest(resolve(out)), version=1).rows
    3
    """
    if version is not None and as_of is not None:
        raise ConfigurationError("Pass either version= or as_of=, not both. Fix: drop one of them.")
    if version is None and as_of is None:  # the current version: no listing of the versions
        return current
    retained = retained_versions(target, current)
    if as_of is not None:
        if not isinstance(as_of, datetime):
            raise ConfigurationError(
                f"as_of must be a datetime, got {type(as_of).__name__}. "
                "Fix: pass e.g. datetime(2024, 5, 1, tzinfo=timezone.utc)."
            )
        moment = as_of.astimezone(timezone.utc)
        chosen = None
        for number in retained:
            manifest = current if number == current.version_id else read_version(target, number)
            if manifest is not None and _time_of(manifest) <= moment:
                chosen = manifest
        if chosen is None:
            raise ConfigurationError(
                f"{target.url!r} has no retained version committed at or before "
                f"{moment.isoformat()} (retained: {_listed(target, current, retained)}). "
                "Fix: pass a later as_of, or fl.history(path) to see the versions."
            )
        return chosen
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise ConfigurationError(
            f"version must be an int, got {type(version).__name__}. Fix: pass e.g. version=1."
        )
    if version is None or version == current.version_id:
        return current
    manifest = read_version(target, version) if 1 <= version < current.version_id else None
    if manifest is None:
        state = "was vacuumed" if 1 <= version < current.version_id else "does not exist"
        raise ConfigurationError(
            f"Version {version} of {target.url!r} {state} (retained versions: "
            f"{retained}). Fix: open a retained version (fl.history(path) lists them)."
        )
    return manifest


def _time_of(manifest: Manifest) -> datetime:
    return parse_time(str(manifest.version.get("time") or manifest.created))


def _listed(target: Location, current: Manifest, retained: list[int]) -> str:
    first = current if retained[0] == current.version_id else read_version(target, retained[0])
    since = f", the oldest from {_time_of(first).isoformat()}" if first is not None else ""
    return f"{retained}{since}"
