"""Resolving paths and URLs to filesystems (fsspec for storage, pyarrow for reading)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.local import LocalFileSystem

from feedline.errors import ConfigurationError, DataError

__all__ = ["Location", "expand_paths", "resolve"]


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

    Examples
    --------
    >>> loc = resolve("/tmp")
    >>> loc.is_local
    True
    """
    text = os.fspath(url)
    if not text:
        raise ConfigurationError("An empty path was given. Fix: pass a file, folder or URL.")
    try:
        fs, path = fsspec.core.url_to_fs(text, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(
            f"Cannot open storage for {text!r}: {exc}. Fix: install the fsspec backend for this "
            "protocol (for example s3fs for s3://) or check the URL."
        ) from exc
    return Location(fs, path, text)


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
    dataset's manifest and staging folders are never read as data.

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
        if _has_glob(loc.path):
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
