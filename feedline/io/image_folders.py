"""Reading folders of image files as rows of ``path``, ``label`` and encoded ``bytes``.

Decoding happens later, in a preprocessor, so reading stays cheap and parallel.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    describe_files,
    fingerprint_of,
)
from feedline.io.storage.paths import Location, expand_paths

__all__ = ["IMAGE_SUFFIXES", "ImageFolderSource"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")
_FILES_PER_TASK = 64


class ImageFolderSource(Source):
    """Image files under one or more folders.

    Parameters
    ----------
    paths:
        Folders (searched recursively), files or glob patterns.
    label:
        ``"parent"`` (default): the name of the folder holding the file;
        a regular expression: applied to the path relative to its root folder, the first
        group (or the whole match) is the label; ``None``: no ``label`` column.
    """

    kind = "images"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        label: str | re.Pattern[str] | None = "parent",
        suffixes: Sequence[str] = IMAGE_SUFFIXES,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        roots = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
        self._files: list[tuple[Location, str]] = []
        for root in roots:
            found = expand_paths(root, tuple(s.lower() for s in suffixes), storage_options, "image")
            base = found[0].fs._strip_protocol(os.fspath(root)) if found else ""
            for loc in found:
                rel = posixpath.relpath(loc.path, base) if loc.path != base else loc.path
                self._files.append((loc, rel))
        if label is None or label == "parent":
            self._pattern = None
        else:
            try:
                self._pattern = re.compile(label) if isinstance(label, str) else label
            except re.error as exc:
                raise ConfigurationError(
                    f"label={label!r} is not a valid regular expression: {exc}. Fix: use "
                    "'parent', None, or a valid pattern such as r'(\\w+)_\\d+\\.jpg'."
                ) from exc
        self._label_mode = label

    def labels(self) -> list[str | None]:
        """The label of every file, in order (computed from paths, no reading)."""
        return [self._label(loc, rel) for loc, rel in self._files]

    def _label(self, loc: Location, rel: str) -> str | None:
        if self._label_mode is None:
            return None
        if self._pattern is None:
            return posixpath.basename(posixpath.dirname(loc.path))
        match = self._pattern.search(rel)
        if match is None:
            raise DataError(
                f"The label pattern {self._pattern.pattern!r} does not match {loc.url!r}. "
                "Fix: adjust the pattern or move the file."
            )
        return match.group(1) if match.groups() else match.group(0)

    def schema(self) -> pa.Schema:
        fields = [pa.field("path", pa.string())]
        if self._label_mode is not None:
            fields.append(pa.field("label", pa.string()))
        fields.append(pa.field("bytes", pa.binary()))
        return pa.schema(fields)

    def describe(self) -> str:
        return describe_files("images", [loc.url for loc, _ in self._files] or ["?"])

    def fingerprint(self) -> str:
        return fingerprint_of(*[(loc.url, loc.fs.size(loc.path)) for loc, _ in self._files])

    def count_rows(self) -> int:
        return len(self._files)

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the image input {self.describe()}")
        chunks = [
            self._files[i : i + _FILES_PER_TASK]
            for i in range(0, len(self._files), _FILES_PER_TASK)
        ]
        return [
            ReadTask(label=chunk[0][0].url, read=self._reader(chunk, schema, columns, predicate))
            for chunk in chunks
        ]

    def _reader(
        self,
        chunk: list[tuple[Location, str]],
        schema: pa.Schema,
        columns: Sequence[str] | None,
        predicate: pc.Expression | None,
    ) -> ReadFn:
        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            wanted = schema.names if columns is None else list(columns)
            need_bytes = "bytes" in wanted or predicate is not None
            paths, labels, blobs = [], [], []
            for loc, rel in chunk:
                paths.append(loc.url)
                labels.append(self._label(loc, rel))
                if need_bytes:
                    try:
                        blobs.append(loc.fs.cat_file(loc.path))
                    except OSError as exc:
                        raise DataError(
                            f"Cannot read the image file {loc.url!r}: {exc}. Fix: check that "
                            "the file exists and is readable, or remove it from the folder."
                        ) from exc
            arrays: dict[str, pa.Array] = {"path": pa.array(paths, pa.string())}
            if self._label_mode is not None:
                arrays["label"] = pa.array(labels, pa.string())
            arrays["bytes"] = pa.array(blobs if need_bytes else [b""] * len(paths), pa.binary())
            batch = pa.RecordBatch.from_pydict(arrays, schema=schema)
            report.add(files_read=len(chunk), rows_read=len(chunk), bytes_read=sum(map(len, blobs)))
            if predicate is not None:
                batch = batch.filter(predicate)
            yield batch.select(wanted)

        return read
