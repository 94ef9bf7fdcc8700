"""Relational inputs Spark reads with its own Parquet scan (see
:func:`feedline.plan.direct_inputs.plain_parquet`): a plain read of local Parquet files with
flat types becomes ``spark.read.parquet`` (column pruning, and the size statistics that let
Spark broadcast a small join side) instead of feedline's read tasks in ``mapInArrow``.

The wanted columns' schema is known (every footer was checked), so Spark is given it and
does not infer it again.

Examples
--------
>>> import pyarrow as pa
>>> spark_reads_back(pa.int8()), spark_reads_back(pa.uint16())
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.spark.types import to_spark_schema
from feedline.plan.direct_inputs import plain_parquet

if TYPE_CHECKING:
    from feedline.io.source import ExecutionReport
    from feedline.plan.plan import Plan

__all__ = ["native_parquet", "spark_reads_back"]


def native_parquet(spark: Any, plan: Plan, jobs: list[Any]) -> Any:
    """A plain read of local Parquet files (:func:`feedline.plan.direct_inputs.plain_parquet`)
    as Spark's own Parquet scan (column pruning, size statistics for broadcast joins), or
    ``None``. Only flat types Spark reads back unchanged qualify."""

    scan = plain_parquet(plan, spark_reads_back)
    if scan is None:
        return None
    jobs.append(_Counted(scan))
    schema = to_spark_schema(scan.schema)
    # Spark reads exactly the wanted columns, in that order, without inferring the schema
    return spark.read.schema(schema).parquet(*("file://" + path for path in scan.paths))


def spark_reads_back(kind: pa.DataType) -> bool:
    """Whether Spark reads a Parquet column of this Arrow type back as the same type."""
    return (
        pa.types.is_boolean(kind)
        or pa.types.is_signed_integer(kind)
        or pa.types.is_float32(kind)
        or pa.types.is_float64(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_date32(kind)
    )


@dataclass
class _Counted:
    """Counts a native Parquet read in the plan's report when the job is finished."""

    scan: Any
    done: bool = False

    def finish(self, report: ExecutionReport | None) -> None:
        if report is not None and not self.done:
            self.done = True
            self.scan.count(report)
