"""Exact ``sum``, ``mean`` and ``std`` of ``groupby().agg``: the same bits on every engine.

Floating-point addition is not associative, so a ``sum``/``avg``/``stddev`` of doubles
computed by DuckDB threads, Spark partitions or Ray blocks depends on how the rows met:
the last bits differ from engine to engine and from run to run, and a split or shuffle that
hashes the rows (:mod:`feedline.plan.rowhash`) then puts other rows on each side. feedline
computes these aggregates *exactly* instead, in three steps that every engine runs:

1. **Partials in the batch stage.** :meth:`RelationalSource.engine_inputs` appends the
   :class:`~feedline.plan.plan.ExactPartials` operator to the aggregate's input; every
   engine runs it with :func:`add_partials` (this code). Each batch's rows are grouped by
   the aggregate's keys and each group gets one *partial* per column: its count of values,
   of NaN, of +inf and -inf, and the exact sum of its finite values and of their squares as
   integers (a float64 is ``mantissa · 2**exponent``, so a sum of them is an integer
   multiple of ``2**-1126``; integers are exact as they are). The partial is a binary value
   on the group's first row of the batch, null on its other rows.
2. **The engine's own groupby** collects each group's non-null partials (a list as long as
   the number of batches holding the group): DuckDB ``list(...) FILTER``, Spark
   ``collect_list``, a Ray ``AggregateFnV2`` that adds them as it goes.
3. **Finish** (:func:`finish`): the partials are added (integer addition: any order gives
   the same total) and rounded once. ``sum`` is the exact sum correctly rounded (±inf when
   it is beyond float64); ``mean`` is the exact sum divided by the count, correctly
   rounded; ``std`` (ddof=1) is ``sqrt((n·Σx² − (Σx)²) / (n·(n − 1)))`` from the exact
   integers with 66 significant bits before its one rounding (within one unit in the last
   place of the true value, and the same bits everywhere).

SQL's special cases hold as before: nulls are skipped; a group without values gives null
(``std``: fewer than two values); a NaN makes ``sum``/``mean``/``std`` NaN; ``+inf`` gives
``+inf`` (``-inf`` likewise, both give NaN) for ``sum``/``mean`` and NaN for ``std``.

Which aggregates take this path: ``sum`` of a floating-point column and ``mean``/``std`` of
any numeric column (integers, booleans and decimals too: their values are summed exactly
as integers, decimals after their cast to float64). ``sum`` of integers and decimals stays
the engines' own (already exact).

Examples
--------
>>> import pyarrow as pa
>>> batch = pa.record_batch({"k": ["a", "b", "a"], "x": [0.1, 0.2, 0.7]})
>>> out = add_partials(batch, ("k",), (("x", False),))
>>> column = out.column(partial_column("x"))
>>> column.is_valid().to_pylist()  # one partial per group: on the group's first row
[True, True, False]
>>> finish([column[0].as_py()], "sum") == 0.1 + 0.7, finish([column[0].as_py()], "mean")
(True, 0.39999999999999997)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "PARTIAL_PREFIX",
    "Partial",
    "add_partials",
    "exact_columns",
    "exact_outputs",
    "finish",
    "finish_array",
    "finish_columns",
    "is_exact",
    "partial_column",
]

#: prefix of the binary helper columns holding the partials (dropped after the aggregate)
PARTIAL_PREFIX = "__feedline_exact_"
#: a float64 value is an integer multiple of ``2**-SHIFT`` (the smallest: 2**52 · 2**-1126)
SHIFT = 1126
#: exponent slots: a value is ``mantissa · 2**(slot - SHIFT)`` with ``0 <= slot < SLOTS``
SLOTS = 2098
#: rows summed at once in int64 (squares of 16-bit limbs: 4 · 2**32 per row, no overflow)
CHUNK = 1 << 24
_VERSION = 1
_HEADER = struct.Struct("<BBqqqq")
_LIMB = np.uint64(0xFFFF)


def partial_column(column: str) -> str:
    """The helper column holding ``column``'s partials.

    Examples
    --------
    >>> partial_column("x")
    '__feedline_exact_x'
    """
    return PARTIAL_PREFIX + column


def is_exact(fn: str, kind: pa.DataType | None) -> bool:
    """Whether aggregate ``fn`` of a column of type ``kind`` takes the exact path.

    Examples
    --------
    >>> is_exact("sum", pa.float32()), is_exact("sum", pa.int64()), is_exact("mean", pa.int8())
    (True, False, True)
    """
    if kind is None:
        return False
    if fn == "sum":
        return pa.types.is_floating(kind)
    if fn in ("mean", "std"):
        return (
            pa.types.is_floating(kind)
            or pa.types.is_integer(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_decimal(kind)
        )
    return False


def exact_columns(
    aggs: Sequence[tuple[str, str | None, str]], schema: pa.Schema
) -> tuple[tuple[str, bool], ...]:
    """``(column, with squares)`` for every column an exact aggregate of ``aggs`` reads
    (``(output, column, fn)`` triples over ``schema``), in first-use order.

    Examples
    --------
    >>> s = pa.schema([("x", pa.float64()), ("i", pa.int64())])
    >>> exact_columns([("a", "x", "sum"), ("b", "i", "sum"), ("c", "x", "std")], s)
    (('x', True),)
    """
    found: dict[str, bool] = {}
    for _, column, fn in aggs:
        if column is None or column == "*" or schema.get_field_index(column) < 0:
            continue
        if is_exact(fn, schema.field(column).type):
            found[column] = found.get(column, False) or fn == "std"
    return tuple(found.items())


# ----------------------------------------------------------------------------- partials


@dataclass
class Partial:
    """The exact running totals of one group's values.

    ``total`` is the sum of the finite values times ``2**SHIFT``; ``squares`` the sum of
    their squares times ``2**(2 * SHIFT)`` (``None`` when not computed).

    Examples
    --------
    >>> p = Partial(n=2, total=3 << SHIFT, squares=5 << (2 * SHIFT))
    >>> q = Partial.decode(p.encode())
    >>> q == p, q.merge(p).n
    (True, 4)
    """

    n: int = 0
    nan: int = 0
    pos_inf: int = 0
    neg_inf: int = 0
    total: int = 0
    squares: int | None = field(default=None)

    def merge(self, other: Partial) -> Partial:
        """The totals of both (exact: any order of merging gives the same result)."""
        squares = None
        if self.squares is not None and other.squares is not None:
            squares = self.squares + other.squares
        return Partial(
            self.n + other.n,
            self.nan + other.nan,
            self.pos_inf + other.pos_inf,
            self.neg_inf + other.neg_inf,
            self.total + other.total,
            squares,
        )

    def encode(self) -> bytes:
        """A compact binary form (what travels through the engines)."""
        head = _HEADER.pack(
            _VERSION, self.squares is not None, self.n, self.nan, self.pos_inf, self.neg_inf
        )
        tail = _int_bytes(self.squares) if self.squares is not None else b""
        return head + _int_bytes(self.total) + tail

    @classmethod
    def decode(cls, data: bytes) -> Partial:
        version, has_squares, n, nan, pos_inf, neg_inf = _HEADER.unpack_from(data, 0)
        if version != _VERSION:
            raise ValueError(f"unknown exact-partial version {version}")
        total, at = _read_int(data, _HEADER.size)
        squares = _read_int(data, at)[0] if has_squares else None
        return cls(n, nan, pos_inf, neg_inf, total, squares)

    def value(self, fn: str) -> float | None:
        """``sum``, ``mean`` or ``std`` of the values (see the module docstring)."""
        if self.n == 0 or (fn == "std" and self.n < 2):
            return None
        if self.nan or (self.pos_inf and self.neg_inf):
            return math.nan
        if self.pos_inf or self.neg_inf:
            if fn == "std":
                return math.nan
            return math.inf if self.pos_inf else -math.inf
        if fn == "sum":
            return _ratio(self.total, 1 << SHIFT)
        if fn == "mean":
            return _ratio(self.total, self.n << SHIFT)
        if fn == "std":
            return self._std()
        raise ValueError(f"{fn!r} is not an exact aggregate")

    def _std(self) -> float:
        if self.squares is None:
            raise ValueError("this partial holds no sum of squares (std)")
        n = self.n
        numerator = n * self.squares - self.total * self.total  # >= 0, exactly
        denominator = n * (n - 1) << (2 * SHIFT)
        if numerator <= 0:
            return 0.0
        # sqrt(numerator / denominator) with >= 66 significant bits, then one rounding
        spare = 132 - (numerator.bit_length() - denominator.bit_length())
        half = max(0, (spare + 1) // 2 + 1)
        root = math.isqrt((numerator << (2 * half)) // denominator)
        return _ratio(root, 1 << half)


def _ratio(numerator: int, denominator: int) -> float:
    """``numerator / denominator`` correctly rounded (CPython's int division), ±inf beyond
    float64."""
    try:
        return numerator / denominator
    except OverflowError:
        return math.inf if numerator > 0 else -math.inf


def _int_bytes(value: int) -> bytes:
    size = (value.bit_length() + 8) // 8
    return struct.pack("<I", size) + value.to_bytes(size, "little", signed=True)


def _read_int(data: bytes, at: int) -> tuple[int, int]:
    (size,) = struct.unpack_from("<I", data, at)
    start = at + 4
    return int.from_bytes(data[start : start + size], "little", signed=True), start + size


def finish(partials: Iterable[bytes | None] | None, fn: str) -> float | None:
    """The value of ``fn`` (``sum``, ``mean``, ``std``) over a group's encoded partials
    (nulls ignored; none: null).

    Examples
    --------
    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"x": [1.0, 2.0, 4.0]})
    >>> whole = add_partials(batch, (), (("x", True),))[1][0].as_py()
    >>> parts = [add_partials(batch.slice(i, 1), (), (("x", True),))[1][0].as_py()
    ...          for i in range(3)]
    >>> finish([whole], "std") == finish(parts, "std") == finish(parts[::-1], "std")
    True
    >>> finish([], "sum") is None
    True
    """
    total: Partial | None = None
    for data in partials or ():
        if data is None:
            continue
        part = Partial.decode(data)
        total = part if total is None else total.merge(part)
    return None if total is None else total.value(fn)


def finish_array(lists: pa.Array | pa.ChunkedArray, fn: str) -> pa.Array:
    """:func:`finish` of every list of partials in ``lists`` (a list<binary> column), as
    float64.

    Examples
    --------
    >>> import pyarrow as pa
    >>> finish_array(pa.array([[], None], pa.list_(pa.binary())), "mean").to_pylist()
    [None, None]
    """
    return pa.array([finish(v, fn) for v in lists.to_pylist()], pa.float64())


# ----------------------------------------------------------------------------- the batch side


def add_partials(
    batch: pa.RecordBatch, keys: Sequence[str], columns: Sequence[tuple[str, bool]]
) -> pa.RecordBatch:
    """``batch`` with one binary column of partials per ``(column, with squares)``: the
    partial of each group of ``keys`` on the group's first row in the batch, null on the
    others (see the module docstring). Any split of the rows into batches gives partials
    whose merge is the same.

    Examples
    --------
    >>> import pyarrow as pa
    >>> b = pa.record_batch({"k": [1, 1, 2], "x": [1.5, None, float("nan")]})
    >>> out = add_partials(b, ["k"], [("x", False)])
    >>> [Partial.decode(v).n if v else None for v in out[2].to_pylist()]
    [1, None, 1]
    """
    if not columns:
        return batch
    ids, firsts = _group_ids(batch, keys)
    for column, squares in columns:
        totals = _Totals.of(batch.column(column), ids, len(firsts), squares)
        values: list[bytes | None] = [None] * batch.num_rows
        for group, row in enumerate(firsts.tolist()):
            values[row] = totals.partial(group).encode()
        batch = batch.append_column(partial_column(column), pa.array(values, pa.binary()))
    return batch


def _group_ids(batch: pa.RecordBatch, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(group id of each row, first row of each group)`` by the exact values of ``keys``.

    Floats group by their bits (``-0.0`` apart from ``0.0``, each NaN payload apart): at
    least as fine as any engine's groups, which is all a partial needs (a group of the
    engine may get several partials from one batch, never one partial of two groups).
    Keys Arrow cannot group (nested types) give every row its own group.
    """
    rows = batch.num_rows
    if not keys:
        return np.zeros(rows, np.int64), np.zeros(1 if rows else 0, np.int64)
    arrays = []
    for name in keys:
        array = batch.column(name)
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if pa.types.is_floating(array.type):
            width = {2: pa.int16(), 4: pa.int32(), 8: pa.int64()}[array.type.byte_width]
            array = array.view(width)
        arrays.append(array)
    names = [f"k{i}" for i in range(len(arrays))]
    table = pa.Table.from_arrays([*arrays, pa.array(np.arange(rows))], [*names, "row"])
    try:
        grouped = table.group_by(names, use_threads=False).aggregate([("row", "list")])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        every = np.arange(rows, dtype=np.int64)
        return every, every
    lists = grouped.column("row_list").combine_chunks()
    members = lists.flatten().to_numpy()
    sizes = np.diff(lists.offsets.to_numpy())
    ids = np.empty(rows, np.int64)
    ids[members] = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    firsts = members[np.concatenate([[0], np.cumsum(sizes)[:-1]])].astype(np.int64)
    return ids, firsts


@dataclass
class _Totals:
    """The totals of every group of one batch's column, as arrays (``total`` and
    ``squares`` hold Python integers)."""

    n: np.ndarray
    nan: np.ndarray
    pos_inf: np.ndarray
    neg_inf: np.ndarray
    total: np.ndarray
    squares: np.ndarray | None

    def partial(self, group: int) -> Partial:
        squares = None if self.squares is None else int(self.squares[group])
        return Partial(
            int(self.n[group]),
            int(self.nan[group]),
            int(self.pos_inf[group]),
            int(self.neg_inf[group]),
            int(self.total[group]),
            squares,
        )

    @classmethod
    def of(cls, array: pa.Array, ids: np.ndarray, groups: int, squares: bool) -> _Totals:
        """The totals of the values of ``array`` per group id (``ids``)."""
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        zeros = np.zeros(groups, np.int64)
        n = np.bincount(ids[valid], minlength=groups)
        kind = array.type
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            ints = array.cast(pa.int8()) if pa.types.is_boolean(kind) else array
            raw = pc.fill_null(ints, 0).to_numpy(zero_copy_only=False)
            magnitude, negative = _integer_terms(raw)
            finite = valid
            slots = np.full(len(raw), SHIFT, np.int64)
            totals = cls(n, zeros, zeros, zeros, _object_zeros(groups), None)
        else:
            values = pc.fill_null(array.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
            values = values.astype(np.float64, copy=False)
            nan = np.bincount(ids[np.isnan(values) & valid], minlength=groups)
            pos = np.bincount(ids[valid & (values == np.inf)], minlength=groups)
            neg = np.bincount(ids[valid & (values == -np.inf)], minlength=groups)
            finite = valid & np.isfinite(values)
            mantissa, exponent = np.frexp(np.where(finite, values, 0.0))
            magnitude = (np.abs(mantissa) * 2.0**53).astype(np.uint64)  # exact: 53 bits
            negative = mantissa < 0
            slots = exponent.astype(np.int64) - 53 + SHIFT
            totals = cls(n, nan, pos, neg, _object_zeros(groups), None)
        if squares:
            totals.squares = _object_zeros(groups)
        keep = finite & (magnitude != 0)
        for start in range(0, len(ids), CHUNK):
            window = slice(start, start + CHUNK)
            chosen = keep[window]
            totals._add(
                ids[window][chosen],
                slots[window][chosen],
                magnitude[window][chosen],
                negative[window][chosen],
            )
        return totals

    def _add(
        self, ids: np.ndarray, slots: np.ndarray, magnitude: np.ndarray, negative: np.ndarray
    ) -> None:
        """Add ``±magnitude · 2**(slot - SHIFT)`` (and the squares) per group: summed per
        (group, slot) in int64 over 16-bit limbs (at most :data:`CHUNK` rows: no overflow),
        then shifted and added as Python integers."""
        if not len(ids):
            return
        codes = ids * SLOTS + slots
        order = np.argsort(codes, kind="stable")
        codes = codes[order]
        starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
        magnitude, negative = magnitude[order], negative[order]
        limbs = [((magnitude >> np.uint64(16 * i)) & _LIMB).astype(np.int64) for i in range(4)]
        bucket_groups, bucket_slots = np.divmod(codes[starts], SLOTS)
        slot = bucket_slots.astype(object)
        firsts = np.flatnonzero(np.concatenate([[True], np.diff(bucket_groups) != 0]))
        where = bucket_groups[firsts]
        total = _object_zeros(len(starts))
        for i, limb in enumerate(limbs):
            part = np.add.reduceat(np.where(negative, -limb, limb), starts).astype(object)
            total += part << (16 * i)
        self.total[where] += np.add.reduceat(total << slot, firsts)
        if self.squares is not None:
            square = _object_zeros(len(starts))
            for k in range(7):
                terms = [limbs[i] * limbs[k - i] for i in range(max(0, k - 3), min(k, 3) + 1)]
                square += np.add.reduceat(sum(terms), starts).astype(object) << (16 * k)
            self.squares[where] += np.add.reduceat(square << (2 * slot), firsts)


def _object_zeros(size: int) -> np.ndarray:
    out = np.empty(size, dtype=object)
    out[:] = 0
    return out


def _integer_terms(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(magnitude as uint64, negative)`` of integers (``-2**63`` included)."""
    if raw.dtype == np.uint64:
        return raw.astype(np.uint64), np.zeros(len(raw), bool)
    signed = raw.astype(np.int64)
    negative = signed < 0
    magnitude = signed.view(np.uint64).copy()
    magnitude[negative] = ~magnitude[negative] + np.uint64(1)  # two's complement, wraps
    return magnitude, negative


def exact_outputs(
    aggs: Sequence[tuple[str, str | None, str]], schema: pa.Schema
) -> tuple[tuple[str, str, str], ...]:
    """``(output, column, fn)`` of the exact aggregates among ``aggs`` over ``schema``.

    Examples
    --------
    >>> s = pa.schema([("x", pa.float64()), ("i", pa.int64())])
    >>> exact_outputs([("a", "x", "sum"), ("b", "i", "sum"), ("c", "i", "mean")], s)
    (('a', 'x', 'sum'), ('c', 'i', 'mean'))
    """
    return tuple(
        (out, column, fn)
        for out, column, fn in aggs
        if column not in (None, "*")
        and schema.get_field_index(column) >= 0
        and is_exact(fn, schema.field(column).type)
    )


def finish_columns(
    batch: pa.RecordBatch, outputs: Sequence[tuple[str, str, str]]
) -> pa.RecordBatch:
    """``batch`` with each exact output column (a list of partials, as the engines collect
    them) replaced by its value (float64); columns not in ``batch`` are skipped.

    Examples
    --------
    >>> p = add_partials(pa.record_batch({"x": [1.0, 2.0]}), (), [("x", False)])[1][0]
    >>> b = pa.record_batch({"m": pa.array([[p.as_py()]], pa.list_(pa.binary()))})
    >>> finish_columns(b, [("m", "x", "mean")]).to_pydict()
    {'m': [1.5]}
    """
    for out, _, fn in outputs:
        index = batch.schema.get_field_index(out)
        if index >= 0:
            batch = batch.set_column(index, out, finish_array(batch.column(index), fn))
    return batch
