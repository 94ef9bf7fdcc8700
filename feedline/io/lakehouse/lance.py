"""Lance datasets at a version, through the ``pylance`` library: one read task per fragment.

Each task re-opens the dataset at the pinned version and reads its fragment with lance's own
reader, so lance's deletion files (rows removed by ``delete``) are honoured, and the column
list and the filter are pushed into lance's scan. A task carries only the URI, the version
and the fragment id, so it pickles to any engine's workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError, FormatError, MissingDependencyError
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    fingerprint_of,
)

__all__ = ["LanceSource", "lance_library"]

#: rows per batch handed downstream
SCAN_BATCH_ROWS = 64 * 1024


def lance_library(purpose: str = "fl.read_lance") -> Any:
    """The ``lance`` module, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import lance
    except ImportError as exc:
        raise MissingDependencyError("pylance", "lance", purpose) from exc
    return lance


def _open(uri: str, version: int | datetime | str | None, options: dict[str, str] | None) -> Any:
    lance = lance_library()
    try:
        if isinstance(version, datetime):
            return lance.dataset(uri, asof=version, storage_options=options)
        return lance.dataset(uri, version=version, storage_options=options)
    except (OSError, ValueError) as exc:
        raise FormatError(
            f"Cannot open the Lance dataset {uri!r}"
            + (f" at version {version}" if version is not None else "")
            + f": {exc}. Fix: check the path and that the version is retained (not removed "
            "by cleanup_old_versions)."
        ) from exc


class LanceSource(Source):
    """A Lance dataset pinned at one version, one read task per fragment.

    Examples
    --------
    >>> import lance, pyarrow as pa, tempfile
    >>> root = tempfile.mkdtemp() + "/t.lance"
    >>> _ = lance.write_dataset(pa.table({"x": [1, 2, 3]}), root)
    >>> source = LanceSource(root)
    >>> source.version, source.count_rows()
    (1, 3)
    """

    kind = "lance"
    prunes_with_predicate = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        version: int | None = None,
        as_of: datetime | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if version is not None and as_of is not None:
            raise ConfigurationError(
                f"read_lance({os.fspath(path)!r}) got both version={version!r} and "
                f"as_of={as_of!r}. Fix: pass one of them."
            )
        self._uri = os.fspath(path)
        options = {k: str(v) for k, v in (storage_options or {}).items() if k != "retry"}
        self._options = options or None
        dataset = _open(self._uri, as_of if as_of is not None else version, self._options)
        self.version: int = int(dataset.version)
        self._schema: pa.Schema = dataset.schema
        fragments = dataset.get_fragments()
        self._fragments = [(int(f.fragment_id), int(f.count_rows())) for f in fragments]

    def schema(self) -> pa.Schema:
        return self._schema

    def describe(self) -> str:
        return f"lance: {self._uri} @ version {self.version} ({len(self._fragments):,} fragments)"

    def fingerprint(self) -> str:
        return fingerprint_of(self.kind, self._uri, self.version, *self._fragments)

    def table_snapshot(self) -> dict[str, str] | None:
        return {"kind": self.kind, "table": self._uri, "snapshot": f"version {self.version}"}

    def count_rows(self) -> int | None:
        return sum(rows for _, rows in self._fragments)

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if columns is not None:
            check_columns(self._schema, columns, f"the Lance dataset {self.describe()}")
        return [
            ReadTask(
                label=f"{self._uri}#fragment={fid}",
                read=_fragment_reader(
                    self._uri, self.version, self._options, fid, columns, predicate
                ),
            )
            for fid, _ in self._fragments
        ]


def _fragment_reader(
    uri: str,
    version: int,
    options: dict[str, str] | None,
    fragment_id: int,
    columns: Sequence[str] | None,
    predicate: pc.Expression | None,
) -> ReadFn:
    """A read task's function: one fragment's live rows at the pinned version."""

    def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        where = f"fragment {fragment_id} of the Lance dataset {uri!r} at version {version}"
        dataset = _open(uri, version, options)
        fragment = dataset.get_fragment(fragment_id)
        if fragment is None:
            raise DataError(f"{where} is gone. Fix: read a version that is still retained.")
        report.add(files_read=1)
        try:
            for batch in fragment.to_batches(
                columns=list(columns) if columns is not None else None,
                filter=predicate,
                batch_size=SCAN_BATCH_ROWS,
            ):
                report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
                yield batch
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DataError(
                f"Cannot read {where}: {exc}. Fix: check the dataset's files (or read "
                "another version)."
            ) from exc

    return read
