"""Arrow columns from Python values: lists, NumPy arrays, torch tensors and Arrow arrays.

One conversion serves ``fl.from_dict`` (a dataset from a dict of columns) and the fused
batch operators (a user function that returns a dict of columns). NumPy arrays with more
than one dimension become ``arrow.fixed_shape_tensor`` columns, one row per first-axis entry.
Each caller words its own errors (a bad column, columns of different lengths) through the
two error builders it passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import FeedlineError

__all__ = ["arrays_from_columns", "is_torch_tensor", "to_arrow_array"]

#: what converting a column raises when Arrow cannot hold its values
CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError)


def is_torch_tensor(value: Any) -> bool:
    """True for a torch tensor, checked without importing torch.

    Examples
    --------
    >>> is_torch_tensor(np.zeros(2))
    False
    """
    kind = type(value)
    return kind.__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def to_arrow_array(values: Any) -> pa.Array:
    """An Arrow array from a NumPy array (n-d → fixed-shape tensor), list or Arrow array.

    Examples
    --------
    >>> import numpy as np
    >>> to_arrow_array(np.zeros((2, 3), np.float32)).type.shape
    [3]
    >>> to_arrow_array([1, 2]).to_pylist()
    [1, 2]
    """
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    if is_torch_tensor(values):
        values = values.detach().cpu().numpy()
    if isinstance(values, np.ndarray) and values.ndim > 1:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))
    return pa.array(values)


def arrays_from_columns(
    columns: Mapping[Any, Any],
    *,
    bad_column: Callable[[Any, Exception], FeedlineError],
    uneven: Callable[[dict[Any, int]], FeedlineError],
) -> dict[Any, pa.Array]:
    """Each column of ``columns`` as an Arrow array, all of one length.

    Parameters
    ----------
    columns
        Column name → values (see :func:`to_arrow_array`).
    bad_column
        Builds the error raised (from the Arrow error) when a column cannot become an Arrow
        array; it gets the column name and the Arrow error.
    uneven
        Builds the error raised when the columns differ in length; it gets name → length.

    Examples
    --------
    >>> from feedline.errors import SchemaError
    >>> def bad(name, exc):
    ...     return SchemaError(f"bad {name!r}. Fix: one value per row.")
    >>> def uneven(lengths):
    ...     return SchemaError(f"lengths {lengths}. Fix: equal lengths.")
    >>> arrays = arrays_from_columns({"x": [1, 2]}, bad_column=bad, uneven=uneven)
    >>> arrays["x"].to_pylist()
    [1, 2]
    >>> arrays_from_columns({"x": [1, 2], "y": [3]}, bad_column=bad, uneven=uneven)
    Traceback (most recent call last):
    ...
    feedline.errors.SchemaError: lengths {'x': 2, 'y': 1}. Fix: equal lengths.
    """
    arrays = {}
    for name, values in columns.items():
        try:
            arrays[name] = to_arrow_array(values)
        except CONVERSION_ERRORS as exc:
            raise bad_column(name, exc) from exc
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise uneven(lengths)
    return arrays
