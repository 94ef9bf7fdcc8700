"""The mergeable accumulator of tensor columns behind :func:`feedline.stats`.

A tensor column is an ``arrow.fixed_shape_tensor`` column or a (fixed-size or variable)
list column whose innermost values are numbers. :class:`Tensor` keeps each row's shape
(``4×3``; a variable list's length: ``5``, ``5×3`` with fixed inner sizes, ``5×…`` without)
as counted categories, and the statistics of every element of every row pooled together
(a :class:`~feedline.statistics.accumulators.Numeric`: mean, std, min, max, quantiles).

Examples
--------
>>> import numpy as np, pyarrow as pa
>>> arr = pa.FixedShapeTensorArray.from_numpy_ndarray(np.arange(12.0).reshape(2, 3, 2))
>>> s = Tensor.of(arr).summary(5)
>>> s["shapes"], s["elements"]["count"], s["elements"]["mean"], s["elements"]["max"]
([['3×2', 2]], 12, 5.5, 11.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.statistics.accumulators import Categorical, Numeric
from feedline.statistics.hll import hash_values, hll_registers

__all__ = ["Tensor", "is_tensor"]

_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)


def _is_list(t: pa.DataType) -> bool:
    return any(test(t) for test in _LISTS)


def is_tensor(t: pa.DataType) -> bool:
    """True for ``arrow.fixed_shape_tensor`` and lists (at any depth) of numbers.

    Examples
    --------
    >>> is_tensor(pa.list_(pa.float32())), is_tensor(pa.list_(pa.string())), is_tensor(pa.int8())
    (True, False, False)
    """
    if isinstance(t, pa.FixedShapeTensorType):
        return True
    if not _is_list(t):
        return False
    while _is_list(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _inner(t: pa.DataType) -> str:
    """The shape suffix of a list's items: ``×3`` for fixed-size lists of 3, ``×…`` else."""
    out = ""
    while _is_list(t):
        size = getattr(t, "list_size", None)
        out += f"×{size}" if pa.types.is_fixed_size_list(t) else "×…"
        t = t.value_type
    return out


def _constant(shape: str, n: int) -> Categorical:
    """A :class:`Categorical` of ``n`` rows that all have ``shape`` (no per-row strings)."""
    registers = hll_registers(hash_values(pa.array([shape] if n else [], pa.string())))
    return Categorical(0, n, {shape: n} if n else {}, 0, registers)


@dataclasses.dataclass(frozen=True)
class Tensor:
    nulls: int
    shapes: Categorical
    elements: Numeric

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> Tensor:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        nulls = arr.null_count
        if isinstance(arr.type, pa.FixedShapeTensorType):
            shape = "×".join(str(d) for d in arr.type.shape)
            valid = pc.drop_null(arr.storage)
            shapes = _constant(shape, len(valid))
        else:
            valid = pc.drop_null(arr)
            if pa.types.is_fixed_size_list(valid.type):
                shapes = _constant(
                    f"{valid.type.list_size}{_inner(valid.type.value_type)}", len(valid)
                )
            else:
                lengths = pc.cast(pc.list_value_length(valid), pa.string())
                suffix = _inner(valid.type.value_type)
                shapes = Categorical.of(pc.binary_join_element_wise(lengths, suffix, ""))
        values = valid
        while _is_list(values.type):
            values = pc.list_flatten(values)
        x = pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        return cls(nulls, shapes, Numeric.of(values, x))

    def merge(self, other: Tensor) -> Tensor:
        return Tensor(
            self.nulls + other.nulls,
            self.shapes.merge(other.shapes),
            self.elements.merge(other.elements),
        )

    def summary(self, top_k: int) -> dict[str, Any]:
        return {
            "kind": "tensor",
            "count": self.shapes.n,
            "nulls": self.nulls,
            "shapes": self.shapes.summary(top_k)["top"],
            "elements": self.elements.summary(),
        }
