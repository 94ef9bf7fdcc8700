"""In-memory sources: Arrow tables, pandas and Polars frames, and synthetic ranges."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    fingerprint_of,
)

__all__ = ["ArrowSource", "RangeSource"]

_ROWS_PER_TASK = 64 * 1024


class ArrowSource(Source):
    """An Arrow table held in memory, read in slices (zero-copy)."""

    kind = "arrow"

    def __init__(
        self, table: pa.Table, name: str = "arrow table", rows_per_task: int | None = None
    ):
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise ConfigurationError(
                f"Expected a pyarrow.Table or RecordBatch, got {type(table).__name__}. "
                "Fix: convert it first (pa.table(...))."
            )
        self._table = table
        self._name = name
        self._rows_per_task = rows_per_task or _ROWS_PER_TASK

    @property
    def table(self) -> pa.Table:
        """The table read (engines with a query engine of their own may scan it directly)."""
        return self._table

    def schema(self) -> pa.Schema:
        return self._table.schema

    def describe(self) -> str:
        return f"{self._name}: {self._table.num_rows} rows × {self._table.num_columns} columns"

    def fingerprint(self) -> str:
        return fingerprint_of(self.describe(), id(self._table))

    def count_rows(self) -> int:
        return self._table.num_rows

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        table = self._table
        if columns is not None:
            check_columns(table.schema, columns, self._name)
        step = self._rows_per_task
        starts = range(0, table.num_rows, step) if table.num_rows else []

        def reader(piece: pa.Table) -> ReadFn:
            def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
                for batch in piece.to_batches():
                    report.add(rows_read=batch.num_rows)
                    # filter first: the predicate may use columns that are not selected
                    if predicate is not None:
                        batch = batch.filter(predicate)
                    yield batch.select(list(columns)) if columns is not None else batch

            return read

        return [
            ReadTask(label=f"{self._name}[{s}:{s + step}]", read=reader(table.slice(s, step)))
            for s in starts
        ]


class RangeSource(Source):
    """Rows ``id = 0 .. n-1`` generated lazily (int64), for tests, benchmarks and demos."""

    kind = "range"

    def __init__(self, n: int, rows_per_task: int = _ROWS_PER_TASK, batch_rows: int = 8192):
        if n < 0 or rows_per_task < 1 or batch_rows < 1:
            raise ConfigurationError(
                "range() needs n >= 0 and positive rows_per_task/batch_rows. Fix: check them."
            )
        self._n = n
        self._rows_per_task = rows_per_task
        self._batch_rows = batch_rows

    def schema(self) -> pa.Schema:
        return pa.schema([pa.field("id", pa.int64(), nullable=False)])

    def describe(self) -> str:
        return f"range: {self._n} rows"

    def count_rows(self) -> int:
        return self._n

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if columns is not None:
            check_columns(self.schema(), columns, "range()")
        schema = self.schema()

        def reader(start: int, stop: int) -> ReadFn:
            def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
                for lo in range(start, stop, self._batch_rows):
                    hi = min(stop, lo + self._batch_rows)
                    batch = pa.RecordBatch.from_arrays(
                        [pa.array(np.arange(lo, hi, dtype=np.int64))], schema=schema
                    )
                    report.add(rows_read=batch.num_rows)
                    yield batch.filter(predicate) if predicate is not None else batch

            return read

        return [
            ReadTask(
                label=f"range[{s}:{min(self._n, s + self._rows_per_task)}]",
                read=reader(s, min(self._n, s + self._rows_per_task)),
            )
            for s in range(0, self._n, self._rows_per_task)
        ]


def table_from_pandas(df: Any) -> pa.Table:
    """A pandas DataFrame as an Arrow table (index dropped unless named)."""
    return pa.Table.from_pandas(df, preserve_index=None if _named_index(df) else False)


def _named_index(df: Any) -> bool:
    return any(name is not None for name in getattr(df.index, "names", [None]))
