"""``ListToTensor``: list columns (Spark ``ArrayType``, pyarrow lists) as fixed-shape tensors.

The loader already reads list columns as tensors (``loader(shapes=..., ragged=...)``), but a
Parquet list is slow to decode (a repetition and a definition level per value). Declaring
the shape in the plan turns the column into an ``arrow.fixed_shape_tensor``, which
``ds.write()`` stores as fixed-size binary (:mod:`feedline.arrow.tensor_codec`): reading it back
is a memory copy. Nothing is converted without a declared shape: a list column written as
it is stays a list (ragged data is legitimate there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from feedline.arrow.list_tensors import check_ragged, level_sizes, list_levels, list_to_numpy
from feedline.errors import ConfigurationError, SchemaError
from feedline.preprocess.preprocessor import Preprocessor, register

__all__ = ["ListToTensor"]


@register
class ListToTensor(Preprocessor):
    """Turn list columns whose rows hold one tensor each into fixed-shape tensor columns.

    Parameters
    ----------
    columns:
        The list column(s) (``list`` / ``large_list`` / ``fixed_size_list`` of numbers,
        nested or not); all take the same ``shape``.
    shape:
        One row's tensor shape, e.g. ``(3, 64, 64)`` for ``list<uint8>`` rows of 12288
        values, or ``(4, 8)`` for ``list<list<float>>`` rows of 4 lists of 8.
    ragged, pad_value:
        Rows of another length, and null rows: ``"raise"`` (a :class:`DataError` naming the
        row), ``"pad"`` (short and null rows filled with ``pad_value``), ``"truncate"``
        (long rows cut) or ``"pad_or_truncate"`` (see :mod:`feedline.arrow.list_tensors`).
    output:
        Output column name(s); by default the tensors replace the lists.

    Examples
    --------
    >>> batch = pa.record_batch({"v": pa.array([[1, 2, 3, 4], [5, 6]], pa.list_(pa.uint8()))})
    >>> out = ListToTensor("v", shape=(2, 2), ragged="pad").transform_batch(batch)
    >>> out.schema.field("v").type
    FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=uint8, shape=[2,2]]>)
    >>> out.column("v").to_numpy_ndarray().tolist()
    [[[1, 2], [3, 4]], [[5, 6], [0, 0]]]
    """

    needs_fit: ClassVar[bool] = False

    def __init__(
        self,
        columns: str | Sequence[str],
        shape: Sequence[int] = (),
        *,
        ragged: str = "raise",
        pad_value: float = 0,
        output: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__(columns, output)
        try:
            self.shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            self.shape = ()
        if not self.shape or min(self.shape) < 0 or len(self.output) != len(self.columns):
            raise ConfigurationError(
                f"ListToTensor needs a shape of non-negative ints and one output per column, "
                f"got shape={shape!r}, output={output!r}. Fix: e.g. ListToTensor('image', "
                "shape=(3, 64, 64))."
            )
        self.ragged = check_ragged(ragged)
        self.pad_value = pad_value

    def params(self) -> dict[str, Any]:
        output = None if self.output == self.columns else list(self.output)
        return {"columns": list(self.columns), "shape": list(self.shape), "ragged": self.ragged,
                "pad_value": self.pad_value, "output": output}  # fmt: skip

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        for name, out in zip(self.columns, self.output, strict=True):
            column = batch.column(name)
            if list_levels(column.type) is None:
                raise SchemaError(
                    f"ListToTensor needs a list column of numbers; {name!r} in {where} is "
                    f"{column.type}. Fix: name a list / large_list / fixed_size_list column."
                )
            try:
                level_sizes(column.type, self.shape)
            except ValueError as exc:
                raise SchemaError(
                    f"ListToTensor({name!r}): {exc}. Fix: pass a shape with a dimension per "
                    "list level at least."
                ) from None
            values = list_to_numpy(column, self.shape, ragged=self.ragged,
                                   pad_value=self.pad_value, column=name, where=where)  # fmt: skip
            batch = _put(batch, out, _tensor(values))
        return batch


def _tensor(values: np.ndarray) -> pa.ExtensionArray:
    """A fixed-shape tensor array over a ``(n, *shape)`` array (no copy when contiguous)."""
    shape = list(values.shape[1:])
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(shape, dtype=np.int64)))
    kind = pa.fixed_shape_tensor(pa.from_numpy_dtype(values.dtype), shape)
    return pa.ExtensionArray.from_storage(kind, storage)


def _put(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    index, field = batch.schema.get_field_index(name), pa.field(name, values.type)
    if index >= 0:
        return batch.set_column(index, field, values)
    return batch.append_column(field, values)
