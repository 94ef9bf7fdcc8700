"""Ray datasets as feedline sources: ``fl.from_ray(ds)`` reads a ``ray.data.Dataset``.

On the local engine its blocks are pulled with ``iter_batches(batch_format="pyarrow")``
(Ray still computes them in parallel); on the Ray engine the feedline operators are
appended to the Ray dataset's own plan, so nothing goes through the driver.

Ray's own tensor columns (``ray.data``'s ``ArrowTensorType``, from NumPy batches) are
converted to Arrow's canonical ``arrow.fixed_shape_tensor`` on the way in, so shards
written by feedline never need Ray to be read.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.arrow.python_columns import to_arrow_array
from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.io.source import ExecutionReport, ReadTask, Source, check_columns, fingerprint_of

if TYPE_CHECKING:
    pass

__all__ = ["RaySource", "filter_by_expression", "source_batch", "to_canonical"]


class RaySource(Source):
    """A ``ray.data.Dataset`` as a feedline source (see :func:`from_ray`)."""

    kind = "ray"

    def __init__(self, dataset: Any, name: str = "ray dataset") -> None:
        if importlib.util.find_spec("ray") is None:
            raise MissingDependencyError("ray", "ray", "fl.from_ray")
        import ray.data

        if not isinstance(dataset, ray.data.Dataset):
            raise ConfigurationError(
                f"from_ray() needs a ray.data.Dataset, got {type(dataset).__name__}. "
                "Fix: pass e.g. ray.data.read_parquet(...)."
            )
        self.dataset = dataset
        self._name = name
        self._schema: pa.Schema | None = None

    def schema(self) -> pa.Schema:
        if self._schema is None:
            found = self.dataset.schema(fetch_if_missing=True)
            base = getattr(found, "base_schema", None)
            if isinstance(base, pa.Schema) and not any(_is_ray_tensor(f.type) for f in base):
                self._schema = base
            else:  # pandas blocks or Ray tensor columns: the schema of a converted batch
                batches = self.dataset.limit(1).iter_batches(batch_format="pyarrow")
                head: pa.Table = next(iter(batches))  # Ray types it as any batch format
                self._schema = to_canonical(head.to_batches()[0]).schema
        return self._schema

    def describe(self) -> str:
        return f"{self._name}: columns {', '.join(self.schema().names)}"

    def fingerprint(self) -> str:
        return fingerprint_of(self.describe(), id(self.dataset))

    def count_rows(self) -> int | None:
        return None  # ds.count() may run the whole Ray pipeline: leave it to a scan

    def private_copy(self) -> Any:
        """The wrapped dataset with its own copy of Ray's ``DataContext`` (feedline sets
        execution options on it without touching the caller's dataset)."""
        import ray.data

        return ray.data.Dataset.copy(self.dataset, _deep_copy=True)

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if columns is not None:
            check_columns(self.schema(), columns, self._name)

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
            tables = self.dataset.iter_batches(batch_size=None, batch_format="pyarrow")
            table: pa.Table  # (Ray types the batches as any batch format)
            for table in tables:
                for batch in table.to_batches():
                    report.add(rows_read=batch.num_rows)
                    yield source_batch(batch, columns, predicate)

        return [ReadTask(label=self._name, read=read)]


def source_batch(
    batch: pa.RecordBatch, columns: Sequence[str] | None, predicate: pc.Expression | None
) -> pa.RecordBatch:
    """A batch of a Ray dataset in feedline's types, filtered by ``predicate``, then
    restricted to ``columns``."""
    batch = to_canonical(batch)
    if predicate is not None:
        batch = filter_by_expression(batch, predicate)
    return batch.select(list(columns)) if columns is not None else batch


def filter_by_expression(batch: pa.RecordBatch, predicate: pc.Expression) -> pa.RecordBatch:
    """``batch.filter(predicate)``, also when ``batch`` has tensor columns (pyarrow's
    expression filter cannot rebuild extension columns: the mask is computed without them).

    Examples
    --------
    >>> import numpy as np
    >>> vec = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((3, 2), np.float32))
    >>> b = pa.RecordBatch.from_arrays([pa.array([1, 2, 3]), vec], names=["id", "vec"])
    >>> filter_by_expression(b, pc.field("id") >= 2).num_rows
    2
    """
    if not any(isinstance(f.type, pa.BaseExtensionType) for f in batch.schema):
        return batch.filter(predicate)
    import pyarrow.dataset as pads

    plain = [f.name for f in batch.schema if not isinstance(f.type, pa.BaseExtensionType)]
    table = pa.Table.from_batches([batch.select(plain)])
    mask = pads.dataset(table).to_table(columns={"mask": predicate})["mask"]
    return batch.filter(mask.combine_chunks())


def _is_ray_tensor(kind: pa.DataType) -> bool:
    return isinstance(kind, pa.ExtensionType) and kind.extension_name.startswith("ray.data.")


def to_canonical(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Replace Ray's fixed-shape tensor columns by ``arrow.fixed_shape_tensor`` columns."""
    if not any(_is_ray_tensor(f.type) for f in batch.schema):
        return batch

    arrays = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if _is_ray_tensor(field.type):
            column = to_arrow_array(column.to_numpy(zero_copy_only=False))
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)
