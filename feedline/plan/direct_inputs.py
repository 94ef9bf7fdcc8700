"""Which relational inputs an engine's own query engine may read itself.

A relational operator's input plan usually runs through the engine's feedline path (read
tasks and the fused batch stage). When the plan is nothing but a read of plain local Parquet
files (at most a column selection) whose every footer has exactly the source's schema, the
engine's native reader (DuckDB's ``read_parquet``, Spark's ``spark.read.parquet``) gives the
same rows faster: in parallel, pruning columns, with the statistics its planner uses (Spark
broadcasts a small join side only when it knows its size). :func:`plain_parquet` decides.

Examples
--------
>>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
>>> import feedline as fl
>>> folder = tempfile.mkdtemp()
>>> pq.write_table(pa.table({"a": [1, 2]}), os.path.join(folder, "p.parquet"))
>>> scan = plain_parquet(fl.read_parquet(folder).select(["a"]).plan)
>>> scan.columns, scan.rows, len(scan.paths)
(['a'], 2, 1)
>>> plain_parquet(fl.read_parquet(folder).map_batches(lambda b: b).plan) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from feedline.io.parquet import ParquetSource, read_footer, same_schema
from feedline.plan.plan import only_selects

if TYPE_CHECKING:
    from feedline.io.source import ExecutionReport
    from feedline.plan.plan import Plan

__all__ = ["ParquetScan", "plain_parquet"]

#: characters a native reader takes for a glob pattern in a path
_GLOB = frozenset("*?[]{}")


@dataclass(frozen=True)
class ParquetScan:
    """Plain local Parquet files read as they are: their paths, the columns wanted (in
    order), their schema, and what the read counts in an execution report."""

    paths: list[str]
    columns: list[str]
    schema: pa.Schema
    files: int
    row_groups: int
    rows: int

    def count(self, report: ExecutionReport) -> None:
        """Add this read to ``report`` as feedline's own reader would."""
        report.add(
            files_read=self.files,
            row_groups_total=self.row_groups,
            row_groups_read=self.row_groups,
            rows_read=self.rows,
        )


def plain_parquet(
    plan: Plan, supported: Callable[[pa.DataType], bool] | None = None
) -> ParquetScan | None:
    """``plan`` as a :class:`ParquetScan` when it is a plain read of local Parquet files
    with no extension-typed column and every column type ``supported`` (default: any);
    ``None`` when it must run through the engine's feedline path."""
    if not only_selects(plan.ops) or type(plan.source) is not ParquetSource:
        return None
    source = plan.source
    files = source.files
    schema = source.schema()
    columns = list(plan.ops[-1].columns) if plan.ops else list(schema.names)
    types = [schema.field(c).type for c in columns]
    if (
        not files
        or any(isinstance(f.type, pa.ExtensionType) for f in schema)
        or (supported is not None and not all(supported(t) for t in types))
        or not all(f.is_local and not _GLOB & set(f.path) for f in files)
    ):
        return None
    footers = [read_footer(f) for f in files]  # a corrupt footer raises DataError here
    if not all(same_schema(m.schema.to_arrow_schema(), schema) for m in footers):
        return None  # types Parquet stores otherwise, or drift: the feedline reader handles both
    return ParquetScan(
        paths=[f.path for f in files],
        columns=columns,
        schema=pa.schema([schema.field(c) for c in columns]),
        files=len(files),
        row_groups=sum(m.num_row_groups for m in footers),
        rows=sum(m.num_rows for m in footers),
    )
