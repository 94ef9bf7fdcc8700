"""Inputs DuckDB scans itself: an in-memory Arrow table or plain local Parquet files.

The local engine hands a relational operator's inputs to DuckDB as Arrow streams produced by
its own executor (:mod:`feedline.engines.local.relational`). When an input plan is nothing but
a read (at most a column selection) of an Arrow table or of local Parquet files whose every
footer matches the source's schema (:func:`feedline.plan.direct_inputs.plain_parquet`),
DuckDB scans the data itself instead: in parallel, with its
projection pushdown and without a Python generator between the two. The result is the same
rows (the operator's output is cast to its schema afterwards either way).

Examples
--------
>>> import duckdb, pyarrow as pa
>>> from feedline.io.memory import ArrowSource
>>> from feedline.io.source import ExecutionReport
>>> from feedline.plan.plan import Plan
>>> con = duckdb.connect()
>>> scan = register_direct(con, "input_0", Plan(ArrowSource(pa.table({"a": [2, 1]}))),
...                        ExecutionReport())
>>> scan.schema.names, con.sql("SELECT sum(a) FROM input_0").fetchall()
(['a'], [(3,)])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.local.duckdb_sql import quote
from feedline.io.memory import ArrowSource
from feedline.plan.direct_inputs import plain_parquet
from feedline.plan.plan import only_selects

if TYPE_CHECKING:
    from feedline.io.source import ExecutionReport
    from feedline.plan.plan import Plan

__all__ = ["DirectScan", "arrow_table", "register_direct"]


@dataclass
class DirectScan:
    """An input DuckDB scans itself: its schema and the files it reads (none for a table)."""

    schema: pa.Schema
    files: list[str] = field(default_factory=list)


def arrow_table(plan: Plan) -> pa.Table | None:
    """The rows of ``plan`` when it is nothing but a read of an in-memory Arrow table (at
    most a column selection): that table (selected), no copy; else ``None``.

    Examples
    --------
    >>> import feedline as fl
    >>> arrow_table(fl.from_arrow(pa.table({"a": [1], "b": [2]})).select(["b"]).plan).num_columns
    1
    >>> arrow_table(fl.range(3).plan) is None
    True
    """
    source = plan.source
    if type(source) is not ArrowSource or not only_selects(plan.ops):
        return None
    return source.table if not plan.ops else source.table.select(list(plan.ops[-1].columns))


def register_direct(con: Any, name: str, plan: Plan, report: ExecutionReport) -> DirectScan | None:
    """Make ``plan``'s rows the table ``name`` of ``con`` scanned by DuckDB itself, when the
    plan is a plain read (see the module); ``None`` when it must stream through the engine."""
    table = arrow_table(plan)
    if table is not None:
        if any(isinstance(f.type, pa.ExtensionType) for f in table.schema):
            return None
        con.register(name, table)
        report.add(rows_read=table.num_rows)
        return DirectScan(table.schema)
    scan = plain_parquet(plan)
    if scan is None:
        return None
    paths = ", ".join("'" + path.replace("'", "''") + "'" for path in scan.paths)
    selected = ", ".join(quote(c) for c in scan.columns)
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT {selected} FROM read_parquet("
        f"[{paths}], hive_partitioning = false, union_by_name = false)"
    )
    scan.count(report)
    return DirectScan(scan.schema, scan.paths)
