"""Resolving paths and URLs to filesystems (fsspec for storage, pyarrow for reading).

Any fsspec URL works (``s3://``, ``gs://``, ``az://``, ``memory://``, ``file://``, chained
URLs) as well as local paths; ``storage_options`` go to the fsspec backend. Local paths and
in-memory filesystems are used as they are (pyarrow's native local filesystem for reads).
Every other filesystem is wrapped in
:class:`~feedline.io.storage.retrying_fs.RetryingFileSystem`, so transient faults are retried
under one :class:`~feedline.io.storage.retry.RetryPolicy`, chosen with
the reserved storage option ``"retry"`` (a policy, a dict of its fields, or the attempts;
``1`` turns retries off)::

    fl.open("s3://bucket/ds", storage_options={"anon": False, "retry": fl.RetryPolicy(8)})

Its ``attempts`` bound every request once, whichever layer retries: on S3 (s3fs) botocore is
configured to retry up to that many times and s3fs's own retry loop is off
(:mod:`feedline.io.storage.s3`); feedline's loop runs only where nothing below retries.

Listings cached by the backend (s3fs caches directory listings per filesystem instance) are
dropped for the resolved path and everything below it, so a dataset rewritten by another
process since the last call is seen as it is now.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from feedline.errors import ConfigurationError, DataError
from feedline.io.storage import s3
from feedline.io.storage.local_files import regular_size
from feedline.io.storage.retry import RetryPolicy
from feedline.io.storage.retrying_fs import RetryingFileSystem

__all__ = ["RETRY_OPTION", "Location", "expand_paths", "parse_storage_options", "resolve"]

#: the storage option feedline takes for itself (never passed to the fsspec backend)
RETRY_OPTION = "retry"
#: filesystems used as they are: local disk and process memory have no transient faults
_UNWRAPPED = (LocalFileSystem, MemoryFileSystem)


@dataclass(frozen=True)
class Location:
    """A filesystem plus a path on it.

    Attributes
    ----------
    fs:
        The fsspec filesystem.
    path:
        The path on ``fs`` (protocol stripped).
    url:
        The path as the user gave it (kept for messages).
    """

    fs: fsspec.AbstractFileSystem
    path: str
    url: str

    @property
    def is_local(self) -> bool:
        """True when the path is on the local disk."""
        return isinstance(self.fs, LocalFileSystem)

    def arrow_filesystem(self) -> pafs.FileSystem:
        """A pyarrow filesystem for this location (native for local paths)."""
        if self.is_local:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    def join(self, *parts: str) -> str:
        """Join ``parts`` onto this location's path with ``/``."""
        return "/".join([self.path.rstrip("/"), *parts])

    def child(self, *parts: str) -> Location:
        """A new location below this one."""
        path = self.join(*parts)
        url = "/".join([self.url.rstrip("/"), *parts])
        return Location(self.fs, path, url)


def resolve(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Location:
    """Resolve a local path or fsspec URL to a :class:`Location`.

    Parameters
    ----------
    url:
        A local path or an fsspec URL.
    storage_options:
        Options for the fsspec backend (credentials, endpoint…), plus feedline's own
        ``"retry"`` option (see the module docstring).

    Examples
    --------
    >>> loc = resolve("/tmp")
    >>> loc.is_local
    True
    >>> remote = resolve("memory://resolve-doc/x")
    >>> remote.url, remote.path
    ('memory://resolve-doc/x', '/resolve-doc/x')
    """
    text = os.fspath(url)
    if not text:
        raise ConfigurationError("An empty path was given. Fix: pass a file, folder or URL.")
    options = dict(storage_options or {})
    policy = RetryPolicy.from_option(options.pop(RETRY_OPTION, None))
    try:
        fs, path = fsspec.core.url_to_fs(text, **options)
    except (ImportError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"Cannot open storage for {text!r}: {exc}. Fix: install the fsspec backend for this "
            "protocol (for example s3fs for s3://), check the URL and the storage_options."
        ) from exc
    if isinstance(fs, _UNWRAPPED):
        return Location(fs, path, text)

    bare = None
    if type(fs).__module__.split(".", 1)[0] == "s3fs":
        fs, bare = s3.backends(fs, policy)  # botocore retries, under the policy's bound
        _forget_listings(bare, path)
    _forget_listings(fs, path)
    return Location(RetryingFileSystem(fs, policy, bare), path, text)


def _forget_listings(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Drop cached listings of ``path``, its parents and everything below it."""
    cache = getattr(fs, "dircache", None)
    if not cache:
        return
    root = path.rstrip("/")
    for key in [k for k in list(cache) if k == root or k.startswith(root + "/")]:
        cache.pop(key, None)
    fs.invalidate_cache(path)


def _has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def expand_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    suffixes: tuple[str, ...],
    storage_options: dict[str, Any] | None = None,
    what: str = "file",
) -> list[Location]:
    """Expand files, folders (recursively) and glob patterns into a sorted list of files.

    Hidden files and folders (``.name`` / ``_name``) inside folders are skipped, so a
    dataset's manifest and staging folders are never read as data. A path that exists is
    taken literally even when it holds glob characters (``[``, ``]``, ``*``, ``?``). A local
    file that is not a regular file (a FIFO, a device, a socket) is refused with a
    :class:`~feedline.errors.DataError`: reading it would block or never end.

    Parameters
    ----------
    paths:
        One path/URL or a list of them.
    suffixes:
        File name endings that count when a folder is listed (case-insensitive);
        explicit file paths are always taken.
    what:
        A word for error messages ("Parquet file", "image").

    Examples
    --------
    >>> expand_paths([], (".csv",))
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: No input paths were given. Fix: ...
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise ConfigurationError(
            "No input paths were given. Fix: pass at least one file or folder."
        )
    found: list[Location] = []
    for item in items:
        loc = resolve(item, storage_options)
        fs = loc.fs
        # an existing path is taken as it is: "scan [1].csv" names a file, not a pattern
        if _has_glob(loc.path) and not fs.exists(loc.path):
            matches = sorted(fs.glob(loc.path))
            if not matches:
                raise DataError(f"The pattern {loc.url!r} matched no {what}s. Fix: check the path.")
            found.extend(_from(loc, m) for m in matches if fs.isfile(m))
            continue
        if not fs.exists(loc.path):
            raise DataError(f"{loc.url!r} does not exist. Fix: check the path.")
        if fs.isdir(loc.path):
            files = [f for f in sorted(fs.find(loc.path)) if _wanted(f, loc.path, suffixes)]
            if not files:
                raise DataError(
                    f"The folder {loc.url!r} holds no {what}s (looked for {', '.join(suffixes)}). "
                    "Fix: point at the right folder or pass the files explicitly."
                )
            found.extend(_from(loc, f) for f in files)
        else:
            found.append(loc)
    for location in found:
        if location.is_local:  # a FIFO would hang the reader, a device stream without end
            regular_size(location.path, what=f"the {what}", error=DataError)
    return found


def _from(base: Location, path: str) -> Location:
    protocol = base.fs.protocol
    protocol = protocol[0] if isinstance(protocol, tuple | list) else protocol
    url = path if base.is_local else f"{protocol}://{path}"
    return Location(base.fs, path, url)


def _wanted(path: str, root: str, suffixes: tuple[str, ...]) -> bool:
    rel = path[len(root.rstrip("/")) :].lstrip("/")
    if any(part.startswith((".", "_")) for part in rel.split("/")):
        return False
    return path.lower().endswith(suffixes) if suffixes else True


def parse_storage_options(items: Sequence[str] | None) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` strings (the CLI's ``--storage-option``).

    A dotted key nests (``client_kwargs.endpoint_url=…``); a value that reads as JSON
    (numbers, ``true``/``false``, objects) is decoded, anything else stays a string.

    Examples
    --------
    >>> parse_storage_options(["anon=true", "client_kwargs.endpoint_url=http://127.0.0.1:9000"])
    {'anon': True, 'client_kwargs': {'endpoint_url': 'http://127.0.0.1:9000'}}
    >>> parse_storage_options(["retry={\\"attempts\\": 8}", "key=abc"])
    {'retry': {'attempts': 8}, 'key': 'abc'}
    """
    import json

    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"--storage-option {item!r} is not KEY=VALUE. Fix: write it like "
                "--storage-option client_kwargs.endpoint_url=http://host:9000"
            )
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        *parents, last = key.strip().split(".")
        node = options
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigurationError(
                    f"--storage-option {item!r} nests under {part!r}, which already has a "
                    "value. Fix: give each key once."
                )
        node[last] = value
    return options
