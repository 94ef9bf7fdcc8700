"""The mergeable core of :func:`feedline.stats` for one schema (see :class:`Profiler`).

Columns are profiled by kind with the accumulators of :mod:`feedline.statistics.accumulators`;
numeric columns also feed pairwise co-moments (Pearson), and a second pass turns their values
into ranks by the merged sketches (Spearman).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.statistics.accumulators import Categorical, CoMoments, Images, Numeric, Other
from feedline.statistics.result import Stats
from feedline.statistics.tensor_accumulator import Tensor, is_tensor
from feedline.ui.notebook import short_type

if TYPE_CHECKING:
    from feedline.statistics.result import Stats

__all__ = ["Profiler"]


_KINDS: dict[str, Any] = {
    "numeric": Numeric,
    "categorical": Categorical,
    "image": Images,
    "tensor": Tensor,
    "other": Other,
}


def _kind(field: pa.Field, image_columns: Sequence[str], categorical: Sequence[str] = ()) -> str:
    t = field.type
    if field.name in categorical and (pa.types.is_integer(t) or pa.types.is_boolean(t)):
        return "categorical"  # integer codes (an indexed label column): counted, not binned
    categorical_tests = (
        pa.types.is_dictionary,
        pa.types.is_boolean,
        pa.types.is_string,
        pa.types.is_large_string,
        getattr(pa.types, "is_string_view", bool),
    )
    if any(test(t) for test in categorical_tests):
        return "categorical"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "numeric"
    if (
        (pa.types.is_binary(t) or pa.types.is_large_binary(t))
        and field.name in image_columns
        and importlib.util.find_spec("PIL") is not None
    ):
        return "image"
    if is_tensor(t):
        return "tensor"
    return "other"


def _type_name(t: pa.DataType) -> str:
    """The type as statistics record it: Arrow's name, tensors short (``tensor<float, 4×3>``)."""
    if isinstance(t, pa.FixedShapeTensorType):
        return short_type(t)
    return str(t)


@dataclasses.dataclass(frozen=True)
class _Partial:
    rows: int
    columns: dict[str, Any]
    pearson: CoMoments | None  # None with fewer than two numeric columns


class Profiler:
    """The mergeable core of :func:`stats` for one schema: ``partial``, ``merge``, ``finish``.

    Engines run ``partial`` per batch and ``merge`` the results in any order; ``rank_partial``
    is the second (Spearman) pass, given the merged first-pass partial. Integer columns named
    in ``categorical`` (label ids) are profiled as categories, not numbers.

    Examples
    --------
    >>> batch = pa.record_batch({"x": [1.0, 2.0, 4.0], "y": [1, 3, 2]})
    >>> p = Profiler(batch.schema)
    >>> merged = p.merge(p.partial(batch.slice(0, 1)), p.partial(batch.slice(1)))
    >>> p.finish(merged)["x"]["mean"]
    2.3333333333333335
    """

    def __init__(
        self,
        schema: pa.Schema,
        *,
        top_k: int = 20,
        image_columns: Sequence[str] = ("bytes", "image"),
        categorical: Sequence[str] = (),
    ) -> None:
        self.schema, self.top_k = schema, top_k
        self.kinds = {f.name: _kind(f, image_columns, categorical) for f in schema}
        self.numeric = [name for name, kind in self.kinds.items() if kind == "numeric"]

    def _matrix(self, batch: pa.RecordBatch) -> np.ndarray:
        columns = [
            pc.cast(batch.column(c), pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            for c in self.numeric
        ]
        return np.column_stack(columns) if columns else np.empty((batch.num_rows, 0))

    def partial(self, batch: pa.RecordBatch) -> _Partial:
        x = self._matrix(batch)
        where = {c: i for i, c in enumerate(self.numeric)}
        columns = {
            name: _KINDS[kind].of(
                batch.column(name), x[:, where.get(name, 0)] if kind == "numeric" else None
            )
            for name, kind in self.kinds.items()
        }
        return _Partial(batch.num_rows, columns, CoMoments.of(x) if x.shape[1] > 1 else None)

    def merge(self, a: _Partial, b: _Partial) -> _Partial:
        return _Partial(
            a.rows + b.rows,
            {k: v.merge(b.columns[k]) for k, v in a.columns.items()},
            # both or neither: pearson is there when the schema has two numeric columns
            a.pearson.merge(b.pearson) if a.pearson and b.pearson else None,
        )

    def empty(self) -> _Partial:
        return self.partial(pa.RecordBatch.from_pylist([], schema=self.schema))

    def rank_partial(self, batch: pa.RecordBatch, merged: _Partial) -> CoMoments:
        x = self._matrix(batch)
        ranks = [merged.columns[c].ranks(x[:, i]) for i, c in enumerate(self.numeric)]
        return CoMoments.of(np.column_stack(ranks))

    def finish(self, merged: _Partial, ranks: CoMoments | None = None) -> Stats:

        columns = {
            name: {"type": _type_name(self.schema.field(name).type)}
            | (acc.summary() if isinstance(acc, Numeric) else acc.summary(self.top_k))
            for name, acc in merged.columns.items()
        }
        scale = np.array(
            [max(abs(columns[c]["min"] or 0), abs(columns[c]["max"] or 0)) for c in self.numeric],
            np.float64,
        )
        correlation = {
            "columns": list(self.numeric),
            "pearson": merged.pearson.correlation(scale) if merged.pearson else None,
            "spearman": ranks.correlation(np.full(len(scale), merged.rows + 1.0))
            if ranks is not None
            else None,
        }
        return Stats(merged.rows, columns, correlation)
