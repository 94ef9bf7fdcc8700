"""Feature specs of ``tf.train.Example`` records and their Arrow columns.

``FixedLen(shape, dtype, default=None)`` is a feature with ``prod(shape)`` values in every
record (``tf.io.FixedLenFeature``): a scalar column for ``shape=()``, an
``arrow.fixed_shape_tensor`` column otherwise (bytes and strings: a ``fixed_size_list``).
Its shape is checked when it is built (:class:`~feedline.errors.ConfigurationError`): every
dimension a positive integer, at most :data:`MAX_VALUES` values (Arrow's largest fixed-size
list) taking at most :data:`MAX_VALUE_BYTES` in memory, and no more than one record can
hold (:data:`~feedline.io.tfrecord.frames.MAX_RECORD_BYTES`).
A numeric ``FixedLen`` also reads a ``bytes_list`` holding one raw buffer of exactly
``prod(shape) * itemsize`` bytes (like ``tf.io.decode_raw``): how images are usually stored.
``VarLen(dtype)`` is a list column (``tf.io.VarLenFeature``); a record without the feature
gets an empty list. A plain dtype string means ``FixedLen((), dtype)``.

dtypes: ``int8`` … ``int64``, ``uint8`` … ``uint64``, ``bool`` (from ``int64_list``);
``float16``, ``float32``, ``float64`` (from ``float_list``); ``bytes`` (binary) and
``string`` (UTF-8 checked) from ``bytes_list``.

Examples
--------
>>> FixedLen((64, 64, 3), "uint8").arrow_type()
FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=uint8, shape=[64,64,3]]>)
>>> as_spec("float32"), VarLen("int64").arrow_type()
(FixedLen(shape=(), dtype='float32', default=None), ListType(list<item: int64>))
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError
from feedline.io.tfrecord.decode import BYTES, EMPTY, FLOAT, INT64, MISSING
from feedline.io.tfrecord.frames import MAX_RECORD_BYTES

__all__ = [
    "MAX_VALUES",
    "MAX_VALUE_BYTES",
    "FixedLen",
    "Spec",
    "VarLen",
    "as_spec",
    "as_specs",
    "value_bytes",
    "wire_kind",
]

#: the most values one ``FixedLen`` feature may have: Arrow's largest fixed-size list
MAX_VALUES = 2**31 - 1
#: the most bytes one record's ``FixedLen`` value may take once decoded
MAX_VALUE_BYTES = 2**31 - 1
#: the fewest bytes one value takes inside a record, per wire kind (a 1-byte varint, a
#: float32, a bytes value's tag and length)
_WIRE_BYTES = {INT64: 1, FLOAT: 4, BYTES: 2}

_ALIASES = {"int": "int64", "float": "float32", "double": "float64", "binary": "bytes",
            "str": "string", "utf8": "string"}  # fmt: skip
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")
_FLOATS = ("float16", "float32", "float64")
_TEXT = ("bytes", "string")


def _dtype(dtype: Any) -> str:
    text = _ALIASES.get(str(dtype), str(dtype))
    if text not in _INTS + _FLOATS + _TEXT:
        raise ConfigurationError(
            f"dtype {dtype!r} is not a TFRecord feature type. Fix: use one of "
            f"{', '.join(_INTS + _FLOATS + _TEXT)}."
        )
    return text


def _value_type(dtype: str) -> pa.DataType:
    if dtype == "bytes":
        return pa.binary()
    if dtype == "string":
        return pa.string()
    if dtype == "bool":
        return pa.bool_()
    return pa.from_numpy_dtype(np.dtype(dtype))


def wire_kind(dtype: str) -> int:
    """The ``Feature`` kind that holds values of ``dtype``."""
    return INT64 if dtype in _INTS else FLOAT if dtype in _FLOATS else BYTES


def value_bytes(dtype: str) -> int:
    """Bytes one decoded value of ``dtype`` takes (bytes and strings: their 8-byte offset,
    the least they take).

    Examples
    --------
    >>> value_bytes("float64"), value_bytes("bool"), value_bytes("string")
    (8, 1, 8)
    """
    if dtype in _TEXT:
        return 8
    return np.dtype("uint8" if dtype == "bool" else dtype).itemsize


def _checked_shape(shape: Any, dtype: str) -> tuple[int, ...]:
    """``shape`` as a tuple of positive ints, refused when it cannot be a feature's shape."""
    dims = (shape,) if not isinstance(shape, tuple | list) else tuple(shape)
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
            raise ConfigurationError(
                f"FixedLen shape {shape!r} has the dimension {d!r}, which is not a positive "
                "integer. Fix: pass a tuple of positive ints, e.g. (64, 64, 3), or () for one "
                "value."
            )
        out.append(int(d))
    size = math.prod(out)
    if size > MAX_VALUES:
        raise ConfigurationError(
            f"FixedLen shape {tuple(out)} has {size:,} values, more than an Arrow fixed-size "
            f"list holds ({MAX_VALUES:,}). Fix: use VarLen, or split the feature."
        )
    if size * value_bytes(dtype) > MAX_VALUE_BYTES:
        raise ConfigurationError(
            f"FixedLen shape {tuple(out)} of {dtype} takes {size * value_bytes(dtype):,} bytes "
            f"per record, more than 2 GiB. Fix: check the shape; use VarLen, or split it."
        )
    if dtype not in _INTS and size * _WIRE_BYTES[wire_kind(dtype)] > MAX_RECORD_BYTES:
        raise ConfigurationError(
            f"FixedLen shape {tuple(out)} of {dtype} needs more bytes than a tf.train.Example "
            f"can hold ({MAX_RECORD_BYTES:,}), so no record could match it. Fix: check the "
            "shape."
        )
    return tuple(out)


@dataclass(frozen=True)
class FixedLen:
    """A feature with ``prod(shape)`` values in every record (``tf.io.FixedLenFeature``).

    Parameters
    ----------
    shape:
        ``()`` for one value per record (a scalar column), else the tensor's shape: positive
        integers, at most ``2**31 - 1`` values taking at most 2 GiB a record, else
        :class:`~feedline.errors.ConfigurationError` here, not an Arrow error at read time.
    dtype:
        The column's value type (see the module docstring).
    default:
        The value(s) of records that lack the feature; ``None`` makes such a record an
        error (or skipped, with ``on_error="skip"``).

    Examples
    --------
    >>> FixedLen(3, "float32")
    FixedLen(shape=(3,), dtype='float32', default=None)
    """

    shape: tuple[int, ...] = ()
    dtype: str = "int64"
    default: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype))
        object.__setattr__(self, "shape", _checked_shape(self.shape, self.dtype))
        if self.default is not None and np.asarray(self.default).size not in (1, self.size):
            raise ConfigurationError(
                f"FixedLen{self.shape} has a default of {np.asarray(self.default).size} values. "
                f"Fix: give one value or {self.size}."
            )

    @property
    def size(self) -> int:
        """Values per record."""
        return math.prod(self.shape)

    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the column."""
        value = _value_type(self.dtype)
        if not self.shape:
            return value
        if self.dtype in _TEXT:
            return pa.list_(value, self.size)
        return pa.fixed_shape_tensor(value, list(self.shape))


@dataclass(frozen=True)
class VarLen:
    """A feature with any number of values per record (``tf.io.VarLenFeature``): a list column.

    Examples
    --------
    >>> VarLen("string").arrow_type()
    ListType(list<item: string>)
    """

    dtype: str = "int64"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype))

    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the column."""
        return pa.list_(_value_type(self.dtype))


Spec = FixedLen | VarLen


def as_spec(spec: Any) -> Spec:
    """A :class:`FixedLen` or :class:`VarLen` from a spec or a dtype string (a scalar)."""
    if isinstance(spec, FixedLen | VarLen):
        return spec
    if isinstance(spec, str | np.dtype) or (isinstance(spec, type) and spec is not str):
        return FixedLen((), np.dtype(spec).name if isinstance(spec, type | np.dtype) else spec)
    raise ConfigurationError(
        f"Feature spec {spec!r} is not understood. Fix: use fl.tfrecord.FixedLen(shape, dtype), "
        "fl.tfrecord.VarLen(dtype) or a dtype string such as 'int64'."
    )


def as_specs(features: Mapping[str, Any]) -> dict[str, Spec]:
    """Normalize a ``features=`` mapping."""
    if not isinstance(features, Mapping) or not features:
        raise ConfigurationError(
            f"features={features!r} must be a non-empty mapping of name -> spec. Fix: pass e.g. "
            "{'label': 'int64', 'image': fl.tfrecord.FixedLen((64, 64, 3), 'uint8')}."
        )
    return {str(name): as_spec(spec) for name, spec in features.items()}


def infer_spec(kinds: np.ndarray, counts: np.ndarray) -> Spec | None:
    """The spec of one feature seen in sample records (``None`` when it has two kinds)."""
    seen = {k for k in kinds if k not in (MISSING, EMPTY)}
    if len(seen) > 1:
        return None
    kind = seen.pop() if seen else BYTES
    dtype = {INT64: "int64", FLOAT: "float32", BYTES: "bytes"}[kind]
    whole = all(k not in (MISSING, EMPTY) for k in kinds)
    if whole and counts.size and (counts == counts[0]).all() and counts[0] > 0:
        try:
            return FixedLen(() if counts[0] == 1 else (int(counts[0]),), dtype)
        except ConfigurationError:  # more values than a FixedLen may have: a list column
            return VarLen(dtype)
    return VarLen(dtype)
