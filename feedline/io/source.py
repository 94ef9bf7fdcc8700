"""What every source of rows provides to the engines: a schema and parallel read tasks."""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import SchemaError

__all__ = [
    "ExecutionReport",
    "FileSource",
    "ReadFn",
    "ReadTask",
    "Source",
    "check_columns",
    "describe_files",
    "fingerprint_of",
]


@dataclass
class ExecutionReport:
    """Counters filled while a plan executes (thread-safe through :meth:`add`).

    Examples
    --------
    >>> report = ExecutionReport()
    >>> report.add(rows_read=10, files_read=1)
    >>> report.rows_read
    10
    """

    files_read: int = 0
    row_groups_total: int = 0
    row_groups_read: int = 0
    row_groups_skipped: int = 0
    rows_read: int = 0
    bytes_read: int = 0
    rows_out: int = 0
    batches_out: int = 0
    records_skipped: int = 0
    function_calls: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    #: free-form named counters (e.g. ``"imputed:price"``), added with :meth:`count`
    counters: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add ``counts`` to the named counters."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def count(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the free-form counter ``name`` (created at 0)."""
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + value

    def record_skip(self, where: str, reason: str) -> None:
        """Count one skipped record and remember where and why (kept for the write report)."""
        with self._lock:
            self.records_skipped += 1
            if len(self.skipped) < 10_000:
                self.skipped.append({"where": where, "reason": reason})

    def as_dict(self) -> dict[str, object]:
        """The counters as a JSON-safe dict."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


#: what a :class:`ReadTask` calls: the execution report in, the task's record batches out
ReadFn = Callable[[ExecutionReport], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class ReadTask:
    """One unit of parallel reading: usually a file or a group of row groups.

    Attributes
    ----------
    label:
        Where the rows come from (a file path or URL), named in error messages.
    read:
        Called with the execution report; yields the task's record batches.
    estimated_bytes:
        A size hint for scheduling, or ``None``.
    """

    label: str
    read: ReadFn
    estimated_bytes: int | None = None


class Source(ABC):
    """A source of rows. Implementations live in ``feedline.io``."""

    #: short name shown by ``explain()``
    kind: str = "source"

    @abstractmethod
    def schema(self) -> pa.Schema:
        """The schema of the rows, without reading the data where possible."""

    @abstractmethod
    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        """Tasks reading ``columns`` (all when ``None``) of rows matching ``predicate``."""

    @abstractmethod
    def describe(self) -> str:
        """One line for ``explain()`` and the manifest's lineage."""

    def fingerprint(self) -> str:
        """A stable identifier of the input (paths, sizes, modification times)."""
        return fingerprint_of(self.describe())

    def count_rows(self) -> int | None:
        """The number of rows from metadata alone, or ``None`` when it needs a scan."""
        return None

    def table_snapshot(self) -> dict[str, str] | None:
        """The pinned snapshot of a versioned table this source reads (Delta, Iceberg,
        Lance): ``{"kind", "table", "snapshot"}``, JSON-safe; ``None`` for other sources.
        A loader reading the source directly puts it in its state and refuses to resume
        on another snapshot."""
        return None

    #: True when ``read_tasks`` uses the predicate to skip data (not just to filter rows)
    prunes_with_predicate: bool = False


class FileSource(Source):
    """A source over a list of files (``self._files``, a list of ``Location``)."""

    _files: list[Any]

    def describe(self) -> str:
        return describe_files(self.kind, [f.url for f in self._files])

    def fingerprint(self) -> str:
        return fingerprint_of(self.kind, *[(f.url, f.fs.size(f.path)) for f in self._files])


def describe_files(kind: str, urls: Sequence[str]) -> str:
    """``kind: where`` for ``explain()`` and a manifest's lineage: the one file, else the
    folder holding all of them (what the user named), with the number of files.

    Examples
    --------
    >>> describe_files("csv", ["/data/in/a.csv"])
    'csv: /data/in/a.csv'
    >>> describe_files("csv", ["/data/in/a.csv", "/data/in/sub/b.csv"])
    'csv: /data/in (2 files)'
    >>> describe_files("parquet", ["s3://bucket/t/p0.parquet", "s3://bucket/t/p1.parquet"])
    'parquet: s3://bucket/t (2 files)'
    >>> describe_files("csv", ["a.csv", "b/c.csv"])
    'csv: a.csv (+1 more)'
    """
    if len(urls) == 1:
        return f"{kind}: {urls[0]}"
    common: list[str] = []
    for pieces in zip(*(url.split("/")[:-1] for url in urls), strict=False):
        if len(set(pieces)) > 1:
            break
        common.append(pieces[0])
    folder = "/".join(common)
    if not folder.strip("/") or folder.endswith(":/"):  # nothing shared but the root
        return f"{kind}: {urls[0]} (+{len(urls) - 1:,} more)"
    return f"{kind}: {folder} ({len(urls):,} files)"


def fingerprint_of(*parts: object) -> str:
    """A short sha256 hex digest of ``parts``.

    Examples
    --------
    >>> len(fingerprint_of("a", 1))
    16
    """
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:16]


def check_columns(schema: pa.Schema, columns: Sequence[str], where: str) -> None:
    """Raise :class:`SchemaError` when a column in ``columns`` is not in ``schema``."""
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise SchemaError(
            f"Column(s) {missing} not found in {where}. Available columns: {schema.names}. "
            "Fix: check the spelling or select existing columns."
        )


def filter_batch(batch: pa.RecordBatch, predicate: pc.Expression) -> pa.RecordBatch:
    """Rows of ``batch`` for which ``predicate`` is true (nulls count as false)."""
    return batch.filter(predicate)
