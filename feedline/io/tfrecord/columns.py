"""Arrow columns from parsed ``tf.train.Example`` records, checked against their specs.

:func:`decode_columns` works in two steps so that bad records can be dropped from every
column alike: it first decodes each feature's values for the whole batch and lists the
records that do not fit their spec (a wrong kind, count or value, a missing feature, a
malformed encoding), then returns a function that builds the columns of the records kept.

Problems come in two categories: ``"schema"`` (the record does not match the spec: wrong
kind, wrong count, missing or unknown feature) and ``"data"`` (bytes that cannot be
decoded, values out of the dtype's range, invalid UTF-8).

Examples
--------
>>> from feedline.io.tfrecord.scan import parse_records
>>> from feedline.io.tfrecord.spec import FixedLen
>>> rec = bytes.fromhex("0a0c0a0a0a017812051a030a0105")
>>> parsed = parse_records(rec, [0], [len(rec)], {b"x": 0})
>>> problems, build = decode_columns(rec, parsed, ["x"], [FixedLen((), "int32")])
>>> problems, build(np.ones(1, bool))[0].to_pylist()
({}, [5])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.io.tfrecord.decode import (
    BYTES,
    EMPTY,
    FLOAT,
    INT64,
    KIND_NAMES,
    MISSING,
    Parsed,
    bytes_values,
    float_values,
    int64_values,
)
from feedline.io.tfrecord.spec import FixedLen, Spec, VarLen, wire_kind

__all__ = ["Problems", "decode_columns"]

#: record index -> (category, reason); the first problem of a record wins
Problems = dict[int, tuple[str, str]]
Builder = Callable[[np.ndarray], pa.Array]


def _note(problems: Problems, rows: Any, category: str, reason: Callable[[int], str]) -> None:
    for row in rows:
        row = int(row)
        if row not in problems:
            problems[row] = (category, reason(row))


def _subset(parsed: Parsed, column: int, drop: np.ndarray) -> Parsed:
    """``parsed`` with the pieces of column ``column`` in records ``drop`` removed."""
    keep = ~np.isin(parsed.rows[column], drop)
    starts, stops, rows = list(parsed.starts), list(parsed.stops), list(parsed.rows)
    starts[column] = parsed.starts[column][keep]
    stops[column] = parsed.stops[column][keep]
    rows[column] = parsed.rows[column][keep]
    return Parsed(parsed.n, parsed.kinds, starts, stops, rows)


def decode_columns(
    buf: bytes, parsed: Parsed, names: list[str], specs: list[Spec]
) -> tuple[Problems, Callable[[np.ndarray], list[pa.Array]]]:
    """Problems of the ``parsed`` records and a builder of the kept records' columns."""
    problems: Problems = {}
    for row, reason in parsed.malformed:
        problems.setdefault(row, ("data", reason))
    builders = [
        _column(buf, parsed, index, name, spec, problems)
        for index, (name, spec) in enumerate(zip(names, specs, strict=True))
    ]

    def build(keep: np.ndarray) -> list[pa.Array]:
        return [builder(keep) for builder in builders]

    return problems, build


def _column(
    buf: bytes, parsed: Parsed, c: int, name: str, spec: Spec, problems: Problems
) -> Builder:
    kinds = np.asarray(parsed.kinds[c], np.int8)
    expected = wire_kind(spec.dtype)
    seen = set(np.unique(kinds).tolist()) - {MISSING, EMPTY}
    raw = isinstance(spec, FixedLen) and expected != BYTES and seen == {BYTES}
    kind = BYTES if raw else expected
    wrong = np.flatnonzero((kinds != kind) & (kinds != MISSING) & (kinds != EMPTY))
    if wrong.size:
        _note(problems, wrong, "schema", lambda r: (
            f"has feature {name!r} as {KIND_NAMES[int(kinds[r])]}, but the spec {spec} needs "
            f"{KIND_NAMES[expected]}"))  # fmt: skip
        parsed = _subset(parsed, c, wrong)
    if kind == BYTES:
        values, counts = bytes_values(buf, parsed, c)
        bad: set[int] = set()
    else:
        values, counts, bad = (float_values if kind == FLOAT else int64_values)(buf, parsed, c)
    _note(problems, sorted(bad), "data", lambda r: f"has malformed {name!r} values")
    offsets = np.concatenate([[0], np.cumsum(counts)])
    if kind == INT64 and spec.dtype not in ("int64", "uint64", "bool"):
        limits = np.iinfo(np.dtype(spec.dtype))
        out = np.flatnonzero((values < limits.min) | (values > limits.max))
        _note(problems, np.searchsorted(offsets, out, side="right") - 1, "data",
              lambda r: f"has a {name!r} value outside the range of {spec.dtype}")  # fmt: skip
    if spec.dtype == "string":
        _check_utf8(values, offsets, name, problems)
    if isinstance(spec, VarLen):
        return _var_builder(values, offsets, spec)
    missing = (kinds == MISSING) | ((kinds == EMPTY) & (counts == 0))
    if spec.default is None:
        _note(problems, np.flatnonzero(missing), "schema",
              lambda r: f"lacks feature {name!r} (FixedLen without a default)")  # fmt: skip
    if raw:
        return _raw_builder(values, counts, missing, name, spec, problems)
    wrong_count = np.flatnonzero(~missing & (counts != spec.size))
    _note(problems, wrong_count, "schema", lambda r: (
        f"has {int(counts[r])} values in feature {name!r}, but the spec {spec} needs "
        f"{spec.size}"))  # fmt: skip
    if spec.dtype in ("bytes", "string"):
        return _bytes_builder(values, offsets, missing, spec)
    return _numeric_builder(values, offsets, missing, spec)


def _check_utf8(values: Any, offsets: np.ndarray, name: str, problems: Problems) -> None:
    try:
        values.view(pa.string()).validate(full=True)
    except pa.ArrowInvalid:
        for index, value in enumerate(values.to_pylist()):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                row = int(np.searchsorted(offsets, index, side="right") - 1)
                problems.setdefault(row, ("data", f"has a {name!r} value that is not UTF-8"))


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return values != 0
    if dtype == "uint64":
        return values.view(np.uint64)
    return values.astype(dtype, copy=False)


def _arrow(flat: np.ndarray | pa.Array, spec: FixedLen) -> pa.Array:
    flat = flat if isinstance(flat, pa.Array) else pa.array(flat)
    if spec.dtype == "string":
        flat = flat.view(pa.string())
    if not spec.shape:
        return flat
    storage = pa.FixedSizeListArray.from_arrays(flat, spec.size)
    if spec.dtype in ("bytes", "string"):
        return storage
    return pa.ExtensionArray.from_storage(spec.arrow_type(), storage)


def _default(spec: FixedLen) -> np.ndarray:
    value = np.asarray(spec.default)
    return np.broadcast_to(value.reshape(-1), (spec.size,))


def _numeric_builder(
    values: np.ndarray, offsets: np.ndarray, missing: np.ndarray, spec: FixedLen
) -> Builder:
    k = spec.size
    values = _cast(values, spec.dtype)  # once: the matrix below is of the column's own dtype

    def build(keep: np.ndarray) -> pa.Array:
        rows = np.flatnonzero(keep)
        if rows.size == len(keep) and not missing.any() and values.size == rows.size * k:
            matrix = values.reshape(rows.size, k)
        else:
            matrix = np.empty((rows.size, k), values.dtype)
            present = ~missing[rows]
            if present.any():  # (the index is as large as the values the records hold)
                matrix[present] = values[offsets[rows[present]][:, None] + np.arange(k)]
            if not present.all():
                matrix[~present] = _default(spec).astype(values.dtype)
        return _arrow(matrix.reshape(-1), spec)

    return build


def _raw_builder(
    values: pa.Array, counts: np.ndarray, missing: np.ndarray, name: str, spec: FixedLen,
    problems: Problems,
) -> Builder:  # fmt: skip
    """Numeric tensors stored as one raw ``bytes`` value per record."""
    itemsize = np.dtype(spec.dtype if spec.dtype != "bool" else "uint8").itemsize
    width = spec.size * itemsize
    offset_type = np.int32 if values.type == pa.binary() else np.int64
    value_offsets = np.frombuffer(values.buffers()[1], offset_type)
    value_offsets = value_offsets[values.offset : values.offset + len(values) + 1]
    first = np.cumsum(counts) - counts  # index of each record's first value
    row_size = np.full(len(counts), -1, np.int64)
    one = counts == 1
    row_size[one] = np.diff(value_offsets)[first[one]]
    wrong = np.flatnonzero(~missing & (row_size != width))
    _note(problems, wrong, "schema", lambda r: (
        f"has feature {name!r} as {int(counts[r])} bytes value(s) of {int(row_size[r])} bytes, "
        f"but the spec {spec} needs one raw value of {width} bytes"))  # fmt: skip
    data = values.buffers()[2]
    dtype = np.dtype(spec.dtype if spec.dtype != "bool" else "uint8").newbyteorder("<")

    def build(keep: np.ndarray) -> pa.Array:
        rows = np.flatnonzero(keep)
        view = memoryview(data) if data is not None else memoryview(b"")
        if rows.size == len(keep) and not missing.any():
            start = int(value_offsets[0])
            raw: memoryview | bytes = view[start : start + rows.size * width]
        else:
            default = b"" if spec.default is None else _default(spec).astype(dtype).tobytes()
            raw = b"".join([
                default if missing[r] else
                view[int(value_offsets[first[r]]) : int(value_offsets[first[r]]) + width]
                for r in rows.tolist()
            ])  # fmt: skip
        flat = np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="), copy=False)
        return _arrow(_cast(flat, spec.dtype), spec)

    return build


def _bytes_builder(
    values: pa.Array, offsets: np.ndarray, missing: np.ndarray, spec: FixedLen
) -> Builder:
    k = spec.size

    def build(keep: np.ndarray) -> pa.Array:
        rows = np.flatnonzero(keep)
        if rows.size == len(keep) and not missing.any():
            flat = values
        elif not missing[rows].any():
            flat = values.take(pa.array((offsets[rows][:, None] + np.arange(k)).reshape(-1)))
        else:  # the default (one value or k) appended once, then one take: no Python per value
            given = np.asarray(spec.default).reshape(-1)
            default = pa.array([v.encode() if isinstance(v, str) else bytes(v) for v in given],
                               values.type)  # fmt: skip
            combined = pa.concat_arrays([values, default])
            fill = np.arange(k) if given.size == k else np.zeros(k, np.int64)
            index = np.where(
                missing[rows][:, None],
                len(values) + fill,
                offsets[rows][:, None] + np.arange(k),
            )
            flat = combined.take(pa.array(index.reshape(-1)))
        return _arrow(flat, spec)

    return build


def _var_builder(values: np.ndarray | pa.Array, offsets: np.ndarray, spec: VarLen) -> Builder:
    if isinstance(values, np.ndarray):
        items = pa.array(_cast(values, spec.dtype))
    else:
        items = values.view(pa.string()) if spec.dtype == "string" else values

    def build(keep: np.ndarray) -> pa.Array:
        lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), items)
        return lists if keep.all() else lists.filter(pa.array(keep))

    return build
