"""A stable, vectorized 64-bit hash of a row's content, for seeded shuffles and splits.

``random_shuffle(seed)`` and ``split(..., seed)`` must give the same order and the same
partition of rows on every engine, however the rows are batched, chunked or distributed.
So each row gets a key computed from ``(seed, the row's values)`` alone, by this module,
inside the fused batch stage that every engine runs (:mod:`feedline.engines.batch.fusion`); the
engines then sort or rank by that key with their own native operators.

The hash, precisely (all arithmetic on unsigned 64-bit integers, wrapping):

- ``mix`` is the splitmix64 finalizer.
- A value hashes by its canonical form: integers, booleans and dictionary-encoded values as
  their integer (or decoded) value; floats of any width as float64 bits with ``-0.0`` turned
  into ``0.0`` and every NaN into one NaN; timestamps, times and durations as nanoseconds
  (dates as days) whatever their unit or time zone; strings and binaries (any offset
  width, views, fixed size) and decimals (by their text) by their bytes; lists (any kind,
  fixed-shape tensors) by their elements and positions; structs by their fields, by name.
- A null hashes to ``NULL_HASH``, whatever its type.
- A row's key is ``mix`` folded over the columns in sorted name order, starting from
  ``mix(seed)``; each column contributes ``mix(value_hash ^ name_hash)`` with ``name_hash``
  the first 8 bytes of the column name's BLAKE2b digest.

Identical rows share a key (they are interchangeable). The key is stored as int64 (the
same 64 bits) because Spark and Ray have no unsigned 64-bit column type.

Every column counts, floats by their bits: the key is stable across engines as long as the
rows are, which feedline guarantees for its own operators (a ``groupby().agg`` float
``sum``/``mean``/``std`` is exact, :mod:`feedline.plan.exact_aggregates`; the fused batch
stage is the same code everywhere). A user function must be deterministic for that too.

Examples
--------
>>> import pyarrow as pa
>>> t = pa.table({"x": [1.0, -0.0, None], "s": ["a", "b", None]})
>>> keys = row_hash(t, seed=0)
>>> keys.type
DataType(int64)
>>> whole = keys.to_pylist()
>>> parts = row_hash(t.slice(1), seed=0).to_pylist()
>>> whole[1:] == parts
True
>>> row_hash(t, seed=1).to_pylist() != whole
True
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import SchemaError

__all__ = ["NULL_HASH", "ROW_HASH_COLUMN", "add_row_hash", "column_hash", "row_hash"]

#: the name of the key column engines add for random_shuffle and split (dropped after)
ROW_HASH_COLUMN = "__feedline_row_hash"
#: the hash of a null value, of any type
NULL_HASH = np.uint64(0x6A09E667F3BCC909)

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_POS = np.uint64(0x9E3779B97F4A7C15)
_LEN = np.uint64(0xC2B2AE3D27D4EB4F)
_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on a uint64 array (a new array; wraps, never warns).

    Examples
    --------
    >>> int(mix(np.array([1], dtype=np.uint64))[0])
    6238072747940578789
    """
    x = np.asarray(x, dtype=np.uint64).copy()
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def name_hash(name: str) -> np.uint64:
    """The stable 64-bit hash of a column name (first 8 bytes of its BLAKE2b digest)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def row_hash(data: pa.RecordBatch | pa.Table, seed: int) -> pa.Array:
    """The int64 key of every row of ``data`` (see the module docstring for the definition).

    Examples
    --------
    >>> import pyarrow as pa
    >>> a = row_hash(pa.table({"x": pa.array([1, 2], pa.int32())}), seed=7)
    >>> b = row_hash(pa.table({"x": pa.array([1, 2], pa.int64())}), seed=7)
    >>> a.equals(b)
    True
    """
    seed_word = np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    keys = np.repeat(mix(seed_word), data.num_rows)
    for name in sorted(data.schema.names):
        values = column_hash(data.column(name), name)
        keys = mix(keys + mix(values ^ name_hash(name)))
    return pa.array(keys.view(np.int64), pa.int64())


def add_row_hash(batch: pa.RecordBatch, seed: int) -> pa.RecordBatch:
    """``batch`` with its row keys appended as the column ``ROW_HASH_COLUMN``.

    Examples
    --------
    >>> import pyarrow as pa
    >>> add_row_hash(pa.record_batch({"x": [1]}), seed=0).schema.names
    ['x', '__feedline_row_hash']
    """
    return batch.append_column(ROW_HASH_COLUMN, row_hash(batch, seed))


def column_hash(array: pa.Array | pa.ChunkedArray, name: str = "column") -> np.ndarray:
    """The uint64 hash of each value of ``array`` (nulls hash to ``NULL_HASH``).

    Examples
    --------
    >>> import pyarrow as pa
    >>> h = column_hash(pa.array([0.0, -0.0, float("nan"), None]))
    >>> bool(h[0] == h[1]), bool(h[3] == NULL_HASH)
    (True, True)
    """
    if isinstance(array, pa.ChunkedArray):
        parts = [column_hash(chunk, name) for chunk in array.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_null(array.type):
        return np.full(len(array), NULL_HASH, dtype=np.uint64)
    hashed = _values_hash(array, name)
    if array.null_count:
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        hashed = np.where(valid, hashed, NULL_HASH)
    return hashed


def _values_hash(array: pa.Array, name: str) -> np.ndarray:
    """Hashes of the values of ``array``; what null slots get is overwritten by the caller."""
    kind = array.type
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        return mix(_integers(array))
    if pa.types.is_floating(kind):
        values = pc.fill_null(array, 0).to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.where(values == 0.0, 0.0, values)  # -0.0 -> 0.0
        values[np.isnan(values)] = np.nan  # one NaN
        return mix(values.view(np.uint64))
    if pa.types.is_temporal(kind) and not pa.types.is_interval(kind):
        return mix(_temporal(array))
    if pa.types.is_decimal(kind):
        return _bytes_hash(pc.cast(array, pa.string()))
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_binary_view(kind)
    ):
        return _bytes_hash(array)
    if pa.types.is_struct(kind):
        fields = sorted(zip((f.name for f in kind), array.flatten(), strict=True))
        out = np.zeros(len(array), dtype=np.uint64)
        for field_name, child in fields:
            out = mix(out + mix(column_hash(child, name) ^ name_hash(field_name)))
        return out
    if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        return _list_hash(array.cast(pa.large_list(kind.value_type)), name)
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_map(kind)
    ):
        return _list_hash(array, name)
    raise SchemaError(
        f"Column {name!r} has type {kind}, which the row hash of random_shuffle()/split() "
        "cannot hash. Fix: cast it to a supported type (numbers, strings, binary, temporal, "
        "decimal, lists, structs) or drop it before the shuffle or split."
    )


def _integers(array: pa.Array) -> np.ndarray:
    if pa.types.is_boolean(array.type):  # False -> 0, True -> 1 (a null is marked apart)
        array = array.cast(pa.int8())
    values = pc.fill_null(array, 0).to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64:
        return values.copy()
    return values.astype(np.int64).view(np.uint64)


def _temporal(array: pa.Array) -> np.ndarray:
    kind = array.type
    if pa.types.is_date32(kind):
        return _integers(array.cast(pa.int32()))
    if pa.types.is_date64(kind):
        return _integers(array.cast(pa.int64())) // np.uint64(86_400_000)
    unit = getattr(kind, "unit", "ns")
    width = pa.int32() if pa.types.is_time32(kind) else pa.int64()
    return _integers(array.view(width)) * np.uint64(_NS[unit])


def _bytes_hash(array: pa.Array) -> np.ndarray:
    """Hash each value's bytes: the wrapped sum of mix(byte, position), then its length."""
    kind = array.type
    if pa.types.is_fixed_size_binary(kind):
        width = kind.byte_width
        data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        start = array.offset * width
        data = data[start : start + len(array) * width]
        offsets = np.arange(len(array) + 1, dtype=np.int64) * width
    else:
        if not (pa.types.is_large_binary(kind) or pa.types.is_large_string(kind)):
            array = array.cast(pa.large_string() if "string" in str(kind) else pa.large_binary())
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[
            array.offset : array.offset + len(array) + 1
        ]
        data = (
            np.frombuffer(buffers[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
            if len(array) and buffers[2] is not None
            else np.zeros(0, dtype=np.uint8)
        )
        offsets = offsets - offsets[0] if len(offsets) else np.zeros(1, dtype=np.int64)
    lengths = np.diff(offsets)
    positions = np.arange(len(data), dtype=np.uint64) - np.repeat(
        offsets[:-1].astype(np.uint64), lengths
    )
    words = mix(data.astype(np.uint64) | ((positions + np.uint64(1)) << np.uint64(8)))
    return mix(_segment_sums(words, offsets) + mix(lengths.astype(np.uint64) ^ _LEN))


def _list_hash(array: pa.Array, name: str) -> np.ndarray:
    """Hash each list by its elements' hashes mixed with their positions, then its length."""
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    lengths = lengths.astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    elements = column_hash(array.flatten(), name)
    positions = np.arange(len(elements), dtype=np.uint64) - np.repeat(
        offsets[:-1].astype(np.uint64), lengths
    )
    words = mix(elements + mix(positions ^ _POS))
    return mix(_segment_sums(words, offsets) + mix(lengths.astype(np.uint64) ^ _LEN))


def _segment_sums(words: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Wrapped uint64 sums of ``words[offsets[i]:offsets[i + 1]]`` (0 for empty segments)."""
    running = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(words, dtype=np.uint64)])
    return running[offsets[1:]] - running[offsets[:-1]]
