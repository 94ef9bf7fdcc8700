"""How Arrow columns become loader arrays: the dtype mapping, size estimates and conversion.

The mapping (one place, used by the cache, the streaming reader and ``to_tf_dataset``):

=========================================  ==================================================
Arrow type                                 loader array (NumPy dtype, shape per row)
=========================================  ==================================================
bool                                       ``bool`` → ``torch.bool``
int8/16/32/64, uint8, float16/32/64        the same dtype → the same torch dtype
uint16, uint32                             widened to int32 / int64 when ``widen_unsigned``
                                           (``format="torch"``: torch has no arithmetic on
                                           them); kept for ``format="numpy"``/``"tf"``
uint64                                     refused for torch (:class:`SchemaError`, cast to int64)
``arrow.fixed_shape_tensor`` / fixed-size  an N-d array ``(rows, *shape)`` of the value type
list of the above
list / large_list / fixed_size_list of     an N-d array ``(rows, *shape)`` when every row has
numbers, nested (``list<list<float>>``)    the same length: ``shape`` given (``shapes=``) or
                                           taken from the first row; ragged rows raise or are
                                           padded / cut (``ragged=``, see
                                           :mod:`feedline.arrow.list_tensors`)
string / binary (also large and view)      refused (:class:`SchemaError`) unless
                                           ``strings="list"``: then a ``list`` of str / bytes
anything else (timestamps, decimals,       refused (:class:`SchemaError`) naming the column
dictionaries, lists of strings,            and the cast or encoding to make for its type
structs, maps, null)
=========================================  ==================================================

Nulls are refused with a :class:`DataError` naming the column and where the null was found.
The ``dtype=`` conversion of these specs is :func:`~feedline.loader.data.column_dtypes.with_dtypes`
(re-exported here).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.arrow.list_tensors import (
    check_ragged,
    infer_list_shape,
    level_sizes,
    list_levels,
    list_to_numpy,
    needs_shape,
    schema_shape,
)
from feedline.arrow.sizes import parse_bytes
from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.loader.checks import MAX_COUNT

__all__ = [
    "ColumnSpec",
    "check_batch_bytes",
    "chunk_to_numpy",
    "column_specs",
    "estimate_bytes",
    "infer_shapes",
    "parse_budget",
]

#: bytes per row assumed for a string column read as a Python list (object + text)
STRING_ROW_BYTES = 80
_WIDEN: dict[np.dtype[Any], np.dtype[Any]] = {
    np.dtype(np.uint16): np.dtype(np.int32),
    np.dtype(np.uint32): np.dtype(np.int64),
}


@dataclass(frozen=True)
class ColumnSpec:
    """One loader column: its name, kind and the NumPy array it becomes.

    ``kind`` is ``"numeric"`` (1-d), ``"tensor"`` (N-d, ``shape`` per row) or ``"string"``
    (a Python list per batch, ``dtype=object``). A list column's tensor is fitted to
    ``shape`` as ``ragged`` says, with ``pad_value`` (see :mod:`feedline.arrow.list_tensors`).
    """

    name: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...] = ()
    ragged: str = "raise"
    pad_value: float = 0

    @property
    def row_bytes(self) -> int:
        """Bytes one row takes in the loader's array (an estimate for strings)."""
        if self.kind == "string":
            return STRING_ROW_BYTES
        return self.dtype.itemsize * math.prod(self.shape)  # Python ints: no overflow


def _numeric_dtype(name: str, arrow_type: pa.DataType, widen_unsigned: bool) -> np.dtype:
    ok = (
        pa.types.is_boolean(arrow_type)
        or pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
    )
    if not ok:
        raise SchemaError(
            f"Column {name!r} has type {arrow_type}, which the loader cannot turn into a tensor. "
            f"Fix: {_tensor_fix(arrow_type)}, or leave the column out with columns=[...]."
        )
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    if widen_unsigned and dtype == np.uint64:
        raise SchemaError(
            f"Column {name!r} is uint64, which torch cannot compute with and which does not fit a "
            "wider integer. Fix: cast it to int64 (pc.cast(col, pa.int64())) before writing, or "
            "use format='numpy'."
        )
    return _WIDEN.get(dtype, dtype) if widen_unsigned else dtype


def _tensor_fix(kind: pa.DataType) -> str:
    """How to make a column of ``kind`` loadable (the start of a ``Fix:`` sentence).

    Examples
    --------
    >>> _tensor_fix(pa.decimal128(10, 2))
    'cast it to float64 with map_batches before writing (pc.cast(col, pa.float64()))'
    """
    t = pa.types
    before = "with map_batches before writing"
    if t.is_timestamp(kind) or t.is_duration(kind) or t.is_time(kind):
        since = " since the epoch" if t.is_timestamp(kind) else ""
        return f"cast it to int64 {before} (pc.cast(col, pa.int64()) counts its {kind.unit}{since})"
    if t.is_date(kind):
        days = "pc.cast(col, pa.date32()).cast(pa.int32())"
        return f"cast it to days since the epoch {before} ({days})"
    if t.is_decimal(kind):
        return f"cast it to float64 {before} (pc.cast(col, pa.float64()))"
    if t.is_dictionary(kind):
        if t.is_string(kind.value_type) or t.is_large_string(kind.value_type):
            return "encode its categories as integers before writing (fl.StringIndexer)"
        return f"decode it {before} (pc.cast(col, pa.{kind.value_type}()))"
    if t.is_list(kind) or t.is_large_list(kind) or t.is_list_view(kind):
        return (
            f"make it a list of numbers of one length per row {before} (lists of numbers load "
            "as tensors: shapes={...}, ragged='pad'; fl.Tokenize does this for text)"
        )
    if t.is_struct(kind) or t.is_map(kind):
        return f"turn its fields into columns of their own {before} (e.g. pc.struct_field)"
    if t.is_null(kind):
        return "drop it (it holds no values)"
    return f"cast it to a numeric type {before}"


def column_specs(
    schema: pa.Schema,
    columns: Sequence[str] | None = None,
    *,
    strings: str = "raise",
    widen_unsigned: bool = False,
    shapes: Mapping[str, Sequence[int]] | None = None,
    ragged: str | Mapping[str, str] = "raise",
    pad_value: float = 0,
) -> list[ColumnSpec]:
    """The loader arrays the ``columns`` of ``schema`` become (all columns when ``None``).

    A list column (``list`` / ``large_list`` / ``fixed_size_list`` of numbers, nested or
    not) becomes a tensor of ``shapes[name]``, or of its fixed sizes when every level is
    fixed-size; a variable-length one needs its shape in ``shapes`` (the loader infers it
    from the data first, see :func:`infer_shapes`). ``ragged`` (one policy, or one per
    column) and ``pad_value`` say how rows of another length are fitted.

    Raises
    ------
    SchemaError
        For a missing column, a string column with ``strings="raise"``, an unsupported type,
        or a variable-length list column without a shape.
    ConfigurationError
        For a shape or ``pad_value`` that does not fit its column.

    Examples
    --------
    >>> import pyarrow as pa
    >>> [(s.name, s.kind, str(s.dtype)) for s in column_specs(pa.schema({"x": pa.uint16()}),
    ...                                                       widen_unsigned=True)]
    [('x', 'numeric', 'int32')]
    >>> column_specs(pa.schema({"im": pa.list_(pa.uint8())}), shapes={"im": (3, 4, 4)})[0].shape
    (3, 4, 4)
    """
    if strings not in ("raise", "list"):
        raise ConfigurationError(
            f"strings={strings!r} must be 'raise' or 'list'. Fix: pass strings='list' to get "
            "string columns as Python lists, or drop them with columns=[...]."
        )
    names = list(schema.names) if columns is None else list(columns)
    missing = [c for c in names if schema.get_field_index(c) < 0]
    if missing:
        raise SchemaError(
            f"Loader column(s) {missing} are not in the dataset. Available: {schema.names}. "
            "Fix: check columns=[...]."
        )
    shapes = _check_shapes(schema, shapes)
    specs = []
    for name in names:
        t = schema.field(name).type
        if list_levels(t) is not None and not isinstance(t, pa.FixedShapeTensorType):
            policy = ragged.get(name, "raise") if isinstance(ragged, Mapping) else ragged
            if policy == "list":  # variable-length rows kept as they are (token lists)
                specs.append(_ragged_list_spec(name, t))
                continue
            policy = check_ragged(policy)
            specs.append(_list_spec(name, t, shapes.get(name), policy, pad_value, widen_unsigned))
        elif _is_text(t):
            if strings != "list":
                raise SchemaError(
                    f"Column {name!r} holds {t} values, which cannot become a tensor. Fix: encode "
                    "it first (fl.StringIndexer / fl.Tokenize), leave it out with columns=[...], "
                    "or pass strings='list' to get a Python list per batch."
                )
            specs.append(ColumnSpec(name, "string", np.dtype(object)))
        elif isinstance(t, pa.FixedShapeTensorType):
            if list(t.permutation or range(len(t.shape))) != list(range(len(t.shape))):
                raise SchemaError(
                    f"Column {name!r} is a fixed-shape tensor with permutation {t.permutation}. "
                    "Fix: store it in row-major order (permutation=None)."
                )
            dtype = _numeric_dtype(name, t.value_type, widen_unsigned)
            specs.append(ColumnSpec(name, "tensor", dtype, tuple(int(d) for d in t.shape)))
        else:
            specs.append(ColumnSpec(name, "numeric", _numeric_dtype(name, t, widen_unsigned)))
    return specs


def _check_shapes(
    schema: pa.Schema, shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, ...]]:
    """``shapes`` as tuples of ints, each naming a list column of ``schema``."""
    out = {}
    for name, shape in dict(shapes or {}).items():
        i = schema.get_field_index(name)
        if i < 0 or list_levels(schema.field(i).type) is None:
            kinds = [f.name for f in schema if list_levels(f.type) is not None]
            raise ConfigurationError(
                f"Loader: shapes= names {name!r}, which is not a list column of numbers "
                f"(list columns: {kinds}). Fix: name list columns only (fixed-shape tensor "
                "columns carry their shape)."
            )
        try:
            out[name] = tuple(int(d) for d in shape)
            level_sizes(schema.field(i).type, out[name])
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigurationError(
                f"Loader: shapes[{name!r}]={shape!r} does not fit the column's type "
                f"{schema.field(i).type}: {exc}. Fix: pass a tuple of ints such as (3, 64, 64)."
            ) from None
        _check_elements(name, out[name])
    return out


def _check_elements(name: str, shape: tuple[int, ...]) -> None:
    """Refuse a per-sample shape of more than :data:`~feedline.loader.checks.MAX_COUNT`
    elements (no array of it could exist; NumPy's shape arithmetic would overflow)."""
    if math.prod(shape) > MAX_COUNT:
        raise ConfigurationError(
            f"Loader: the column {name!r} has shape {shape}: {math.prod(shape):.3g} elements a "
            f"sample, more than any array can hold. Fix: pass the shape its rows have in "
            "shapes=."
        )


def check_batch_bytes(specs: Sequence[ColumnSpec], batch_size: int, budget: int) -> None:
    """Refuse columns whose batch of ``batch_size`` samples takes more than ``budget`` bytes.

    Checked before anything is allocated: a list column's tensors take their full shape
    whatever the rows hold (``ragged="pad"`` fills them), so a wrong ``shapes=`` (or a
    file's fixed-size type claiming a huge one) would otherwise ask for that much memory.

    Raises
    ------
    ConfigurationError
        Naming the largest column, its per-sample shape and size, and the batch's size.

    Examples
    --------
    >>> spec = ColumnSpec("x", "tensor", np.dtype("float64"), (2**31,))
    >>> check_batch_bytes([spec], 2, 2 * 10**9)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader: a batch of 2 samples takes 34.4 GB, over ...
    """
    sample = sum(spec.row_bytes for spec in specs)
    if not specs or batch_size * sample <= budget:
        return
    big = max(specs, key=lambda spec: spec.row_bytes)
    raise ConfigurationError(
        f"Loader: a batch of {batch_size} samples takes {_gb(batch_size * sample)}, over "
        f"memory_budget={_gb(budget)}; the largest column, {big.name!r}, holds {big.dtype} "
        f"tensors of shape {big.shape} ({_gb(big.row_bytes)} a sample, whatever its rows hold: "
        "ragged rows are padded to it). Fix: check shapes= for that column (the shape its "
        "rows have), or pass a smaller batch_size or a larger memory_budget."
    )


def _gb(size: int) -> str:
    return f"{size / 10**9:.3g} GB" if size >= 10**7 else f"{size:,} bytes"


def _ragged_list_spec(name: str, kind: pa.DataType) -> ColumnSpec:
    """``ragged="list"``: a 1-D list column of integers kept as one array per row (an object
    array per batch: documents of tokens for packing, see :mod:`feedline.loader.packing`)."""
    levels, leaf = list_levels(kind)  # type: ignore[misc]
    if len(levels) != 1 or not pa.types.is_integer(leaf):
        raise SchemaError(
            f"Column {name!r} ({kind}): ragged='list' keeps rows of integers (token ids) as "
            "they are and needs a list of integers. Fix: pass ragged='pad' with a shape for "
            "other list columns."
        )
    return ColumnSpec(name, "string", np.dtype(object))


def _list_spec(name: str, kind: pa.DataType, shape: tuple[int, ...] | None, ragged: str,
               pad_value: float, widen_unsigned: bool) -> ColumnSpec:  # fmt: skip
    """The tensor spec of list column ``name`` (see :mod:`feedline.arrow.list_tensors`)."""
    levels, leaf = list_levels(kind)  # type: ignore[misc]
    if shape is None:
        if needs_shape(kind):
            raise SchemaError(
                f"Column {name!r} ({kind}) has variable-length lists and no shape. Fix: pass "
                f"shapes={{{name!r}: (...)}} to the loader (it is inferred from the first row "
                "when the loader reads the data itself)."
            )
        shape = schema_shape(kind)
    if ragged == "raise":
        for level, (k, size) in enumerate(zip(levels, level_sizes(kind, shape), strict=True)):
            if pa.types.is_fixed_size_list(k) and k.list_size != size:
                raise SchemaError(
                    f"Column {name!r}: its level {level} lists hold {k.list_size} values, the "
                    f"shape {shape} needs {size}. Fix: pass the shape the data has, or "
                    "ragged='pad' / 'truncate' / 'pad_or_truncate' to fit the rows."
                )
    dtype = _numeric_dtype(name, leaf, widen_unsigned)
    stored = np.dtype(leaf.to_pandas_dtype())
    try:
        fits = np.array(pad_value).astype(stored) == pad_value
    except (TypeError, ValueError, OverflowError):
        fits = False
    if not fits:
        raise ConfigurationError(
            f"Loader: pad_value={pad_value!r} is not a {stored} value (column {name!r}). Fix: "
            "pass a pad_value the column's type holds exactly, e.g. 0."
        )
    return ColumnSpec(name, "tensor", dtype, shape, ragged, pad_value)


def infer_shapes(
    schema: pa.Schema,
    names: Sequence[str],
    batches: Callable[[list[str]], Any],
    given: Mapping[str, Sequence[int]] | None = None,
    ragged: str | Mapping[str, str] = "raise",
) -> dict[str, tuple[int, ...]]:
    """``given`` plus the shapes of the variable-length list columns among ``names`` it
    lacks, taken from their first non-null row in ``batches(columns)`` (an iterable of record
    batches, read only as far as needed; every later row is checked as it loads).

    A column whose ``ragged`` policy pads or cuts rows must have its shape given: fitting
    rows to whatever length the first row has would be arbitrary (ConfigurationError).

    Examples
    --------
    >>> t = pa.table({"v": pa.array([[1, 2, 3]], pa.list_(pa.int8())), "k": [0]})
    >>> infer_shapes(t.schema, ["v", "k"], lambda cols: t.select(cols).to_batches())
    {'v': (3,)}
    """

    shapes: dict[str, tuple[int, ...]] = {}
    for name, wanted in dict(given or {}).items():
        try:
            dims = tuple(operator.index(d) for d in wanted)
        except TypeError:
            dims = ()
        if not dims or min(dims) < 1 or any(isinstance(d, bool) for d in wanted):
            raise ConfigurationError(
                f"Loader: shapes[{name!r}]={wanted!r} is not a shape: it must be a tuple of "
                "positive ints (one per tensor dimension). Fix: pass e.g. shapes={"
                f"{name!r}: (3, 64, 64)}}."
            )
        shapes[name] = dims
    todo = [n for n in names if n not in shapes and schema.get_field_index(n) >= 0
            and needs_shape(schema.field(n).type)]  # fmt: skip
    todo = [n for n in todo if _policy(ragged, n) != "list"]
    for name in todo:
        policy = _policy(ragged, name)
        if policy != "raise":
            raise ConfigurationError(
                f"Loader: ragged={policy!r} for the list column {name!r} needs its shape. Fix: "
                f"pass shapes={{{name!r}: (...)}} (the length to pad or cut its rows to)."
            )
    if not todo:
        return shapes
    found: dict[str, tuple[int, ...]] = {}
    for batch in batches(todo):
        for name in todo:
            if name not in found:
                shape = infer_list_shape(batch.column(name))
                if shape is not None:
                    found[name] = shape
        if len(found) == len(todo):
            break
    for name in todo:  # no non-null row anywhere: the shape matters for no row
        levels, _ = list_levels(schema.field(name).type)  # type: ignore[misc]
        shapes[name] = found.get(name, (0,) * len(levels))
    return shapes


def _policy(ragged: str | Mapping[str, str], name: str) -> str:
    return ragged.get(name, "raise") if isinstance(ragged, Mapping) else ragged


def _is_text(kind: pa.DataType) -> bool:
    """Strings and byte strings of any layout (loaded as Python lists with strings="list")."""
    t = pa.types
    return (
        t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_string_view(kind)
        or t.is_binary(kind)
        or t.is_large_binary(kind)
        or t.is_binary_view(kind)
    )


def estimate_bytes(specs: Sequence[ColumnSpec], rows: int) -> int:
    """Bytes the loader arrays of ``specs`` take for ``rows`` rows (from the schema alone).

    Examples
    --------
    >>> import pyarrow as pa
    >>> estimate_bytes(column_specs(pa.schema({"a": pa.float32(), "b": pa.int64()})), 1000)
    12000
    """
    return int(rows) * sum(spec.row_bytes for spec in specs)


def parse_budget(value: int | str) -> int:
    """A memory budget in bytes from an int or a size such as ``"2GB"`` / ``"512MiB"``.

    Examples
    --------
    >>> parse_budget("2GB")
    2000000000
    """

    return parse_bytes(value)


def chunk_to_numpy(
    chunk: pa.Array,
    spec: ColumnSpec,
    where: str,
    convert: bool = True,
    row_of: Callable[[int], int] | None = None,
) -> np.ndarray:
    """One Arrow chunk as an array matching ``spec`` (zero-copy where Arrow allows it).

    ``where`` (file, row group) is named in the error raised for nulls. ``convert=False``
    leaves the values in their own dtype (for a caller copying them into an array of
    ``spec.dtype``, which converts as it copies). A list chunk is decoded by
    :func:`~feedline.arrow.list_tensors.list_to_numpy`; its errors name the row
    ``row_of(i)`` for the chunk's row ``i`` (the dataset's row when the caller knows it).

    Examples
    --------
    >>> import pyarrow as pa
    >>> spec = column_specs(pa.schema({"v": pa.list_(pa.float32(), 2)}))[0]
    >>> chunk_to_numpy(pa.array([[1, 2], [3, 4]], pa.list_(pa.float32(), 2)), spec, "x").shape
    (2, 2)
    """
    if spec.kind == "tensor" and list_levels(chunk.type) is not None:  # not an extension
        out = list_to_numpy(chunk, spec.shape, ragged=spec.ragged, pad_value=spec.pad_value,
                            column=spec.name, where=where, row_of=row_of)  # fmt: skip
        return out if out.dtype == spec.dtype or not convert else out.astype(spec.dtype)
    if chunk.null_count:
        first = int(np.flatnonzero(~np.asarray(chunk.is_valid()))[0])
        raise DataError(
            f"Column {spec.name!r} has {chunk.null_count} null value(s) in {where} (the first at "
            f"row {first} of that piece); loader tensors cannot hold nulls. Fix: fill them "
            "(fl.Imputer) or filter the rows out before writing."
        )
    if spec.kind == "string":
        return np.asarray(chunk.to_numpy(zero_copy_only=False), dtype=object)
    if spec.kind == "tensor":
        if isinstance(chunk, pa.ExtensionArray):
            chunk = chunk.storage
        values = chunk.flatten()  # honours the slice offset
        if values.null_count:
            raise DataError(
                f"Column {spec.name!r} has null tensor elements in {where}. Fix: fill them "
                "before writing."
            )
        flat = values.to_numpy(zero_copy_only=False)
        out = flat.reshape((len(chunk), *spec.shape))
    else:
        out = chunk.to_numpy(zero_copy_only=False)
    return out if out.dtype == spec.dtype or not convert else out.astype(spec.dtype)
