"""Walking a batch of ``tf.train.Example`` records with NumPy, all records at once.

Records written by protobuf serializers (TensorFlow, feedline) share one canonical layout:
``0a len Features{ (0a len entry{ 0a len key 12 len Feature{ kind len List }}) * }`` with
numbers packed (``0a len payload``). :func:`parse_records` walks every record of a batch in
lockstep: one NumPy step reads the next map entry of all records (tags, varint lengths,
key, kind, value range), so the Python cost is per batch and per map-entry position, not
per record. Keys are matched by comparing their bytes as little-endian 64-bit words.
Records that leave the canonical layout anywhere (unpacked values, unknown fields, fields
out of order, duplicated keys, malformed bytes) are walked again one by one by
:func:`feedline.io.tfrecord.decode.walk_records`, which accepts everything protobuf does,
and the two results are merged.

Examples
--------
>>> from feedline.io.tfrecord.decode import bytes_values, int64_values
>>> from feedline.io.tfrecord.writer import encode_examples
>>> import pyarrow as pa
>>> recs = encode_examples(pa.record_batch({"x": [[1, 2], [300]], "s": ["a", "bc"]}))
>>> buf = b"".join(recs)
>>> p = parse_records(buf, [0, len(recs[0])], [len(recs[0]), len(buf)], {b"x": 0, b"s": 1})
>>> int64_values(buf, p, 0)[0].tolist(), bytes_values(buf, p, 1)[0].to_pylist()
([1, 2, 300], [b'a', b'bc'])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from feedline.io.tfrecord.decode import (
    BYTES,
    EMPTY,
    FLOAT,
    INT64,
    Parsed,
    walk_records,
)

__all__ = ["parse_records"]


def _at(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return a[np.minimum(pos, a.size - 1)]


def _varints(a: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(value, size in bytes, ok)`` of the varints at ``pos`` (up to 5 bytes: lengths)."""
    b = _at(a, pos).astype(np.int64)
    value = b & 0x7F
    more = b >= 0x80
    size = np.ones(pos.size, np.int64)
    for k in range(1, 5):
        if not more.any():
            break
        b = _at(a, pos + k).astype(np.int64)
        value = np.where(more, value | ((b & 0x7F) << (7 * k)), value)
        size += more
        more &= b >= 0x80
    return value, size, ~more


def _words(a: np.ndarray, pos: np.ndarray, nbytes: int) -> np.ndarray:
    """The ``nbytes`` (<= 8) bytes at each ``pos`` as little-endian uint64."""
    raw = _at(a, pos[:, None] + np.arange(8))
    words = np.ascontiguousarray(raw).view("<u8").ravel()
    return words & np.uint64((1 << (8 * nbytes)) - 1) if nbytes < 8 else words


def _key_words(key: bytes) -> list[tuple[int, int]]:
    padded = key + b"\0" * (-len(key) % 8)
    return [
        (int.from_bytes(padded[i : i + 8], "little"), min(8, len(key) - i))
        for i in range(0, len(key), 8)
    ]


def parse_records(
    buf: bytes,
    starts: Sequence[int],
    stops: Sequence[int],
    keys: dict[bytes, int],
    *,
    extra: bool = False,
    known: set[bytes] | None = None,
) -> Parsed:
    """Like :func:`~feedline.io.tfrecord.decode.walk_records` (same result), vectorized.

    With ``extra``, keys neither in ``keys`` nor in ``known`` are listed in ``Parsed.extra``.
    """
    n = len(starts)
    width = len(keys)
    a = np.frombuffer(buf, np.uint8)
    st = np.asarray(starts, np.int64)
    sp = np.asarray(stops, np.int64)
    slow = np.zeros(n, bool)
    kinds = [np.zeros(n, np.int8) for _ in range(width)]
    found: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(width)]
    table = [(index, len(key), _key_words(key)) for key, index in keys.items()]
    if extra:
        table += [(-2, len(key), _key_words(key)) for key in (known or set()) - set(keys)]
    extras: list[tuple[int, bytes]] = []

    rec = np.flatnonzero(sp - st >= 2)
    slow[sp - st < 2] = True
    if a.size:
        p = st[rec]
        size, width_bytes, ok = _varints(a, p + 1)
        cur = p + 1 + width_bytes
        end = cur + size
        good = (_at(a, p) == 0x0A) & ok & (end == sp[rec])
        slow[rec[~good]] = True
        rec, cur, end = rec[good], cur[good], end[good]
    else:
        rec = cur = end = np.zeros(0, np.int64)
    while rec.size:  # one map entry of every record still in the walk
        elen, esz, ok1 = _varints(a, cur + 1)
        es = cur + 1 + esz
        ee = es + elen
        klen, ksz, ok2 = _varints(a, es + 1)
        ks = es + 1 + ksz
        ke = ks + klen
        vlen, vsz, ok3 = _varints(a, ke + 1)
        vs = ke + 1 + vsz
        ve = vs + vlen
        ft = _at(a, vs)
        llen, lsz, ok4 = _varints(a, vs + 1)
        ls = vs + 1 + lsz
        empty = vlen == 0
        good = (_at(a, cur) == 0x0A) & ok1 & (_at(a, es) == 0x0A) & ok2 & (ee <= end)
        good &= (_at(a, ke) == 0x12) & ok3 & (ve == ee)
        good &= empty | (((ft == 0x0A) | (ft == 0x12) | (ft == 0x1A)) & ok4 & (ls + llen == ve))
        kind = np.where(empty, EMPTY, ft >> 3).astype(np.int8)
        ls = np.where(empty, vs, ls)
        column = np.full(rec.size, -1, np.int64)
        for index, length, words in table:
            match = good & (klen == length)
            for i, (word, nbytes) in enumerate(words):
                where = np.flatnonzero(match)
                if not where.size:
                    break
                match[where] = _words(a, ks[where] + 8 * i, nbytes) == np.uint64(word)
            column[match] = index
        slow[rec[~good]] = True
        if extra:
            for i in np.flatnonzero(good & (column == -1)).tolist():
                extras.append((int(rec[i]), buf[int(ks[i]) : int(ke[i])]))
        for c in np.unique(column[good & (column >= 0)]).tolist():
            sel = good & (column == c)
            rows = rec[sel]
            twice = kinds[c][rows] != 0  # a duplicated key: the Python walk decides
            slow[rows[twice]] = True
            kinds[c][rows] = kind[sel]
            found[c].append((rows, kind[sel], ls[sel], ve[sel]))
        keep = good & (ee < end)
        rec, cur, end = rec[keep], ee[keep], end[keep]

    starts_out, stops_out, rows_out = [], [], []
    for c in range(width):
        pieces = _pieces(a, found[c], slow)
        starts_out.append(pieces[0])
        stops_out.append(pieces[1])
        rows_out.append(pieces[2])
    parsed = Parsed(n, kinds, starts_out, stops_out, rows_out, [], extras)
    return _merge(buf, parsed, np.flatnonzero(slow), st, sp, keys, extra, known)


def _pieces(
    a: np.ndarray, found: list[tuple[np.ndarray, ...]], slow: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Value pieces ``(starts, stops, rows)`` of one feature's lists, in record order.
    Lists that are not canonical mark their record ``slow``."""
    empty = np.zeros(0, np.int64)
    if not found:
        return empty, empty, empty
    rows, kind, ls, le = (np.concatenate(parts) for parts in zip(*found, strict=True))
    out = []
    numeric = ((kind == FLOAT) | (kind == INT64)) & (le > ls)
    if numeric.any():
        r, p, e = rows[numeric], ls[numeric], le[numeric]
        size, sz, ok = _varints(a, p + 1)
        good = (_at(a, p) == 0x0A) & ok & (p + 1 + sz + size == e)
        slow[r[~good]] = True
        out.append((r[good], (p + 1 + sz)[good], e[good]))
    text = (kind == BYTES) & (le > ls)
    r, cur, end = rows[text], ls[text], le[text]
    while r.size:
        size, sz, ok = _varints(a, cur + 1)
        vs = cur + 1 + sz
        ve = vs + size
        good = (_at(a, cur) == 0x0A) & ok & (ve <= end)
        slow[r[~good]] = True
        out.append((r[good], vs[good], ve[good]))
        keep = good & (ve < end)
        r, cur, end = r[keep], ve[keep], end[keep]
    if not out:
        return empty, empty, empty
    r, s, e = (np.concatenate(parts) for parts in zip(*out, strict=True))
    order = np.argsort(r, kind="stable")
    return s[order], e[order], r[order]


def _merge(
    buf: bytes,
    parsed: Parsed,
    slow: np.ndarray,
    st: np.ndarray,
    sp: np.ndarray,
    keys: dict[bytes, int],
    extra: bool,
    known: set[bytes] | None,
) -> Parsed:
    """Replace the records in ``slow`` by their one-by-one walk."""
    if not slow.size:
        return parsed
    walked = walk_records(buf, st[slow].tolist(), sp[slow].tolist(), keys, extra=extra)
    for c in range(len(keys)):
        mine = ~np.isin(parsed.rows[c], slow)
        rows = np.concatenate([parsed.rows[c][mine], slow[walked.rows[c]]])
        order = np.argsort(rows, kind="stable")
        parsed.rows[c] = rows[order]
        parsed.starts[c] = np.concatenate([parsed.starts[c][mine], walked.starts[c]])[order]
        parsed.stops[c] = np.concatenate([parsed.stops[c][mine], walked.stops[c]])[order]
        parsed.kinds[c][slow] = walked.kinds[c]
    skip = set(slow.tolist())
    parsed.extra = [(r, k) for r, k in parsed.extra if r not in skip]
    parsed.extra += [(int(slow[r]), k) for r, k in walked.extra
                     if known is None or k not in known]  # fmt: skip
    parsed.malformed = [(int(slow[r]), reason) for r, reason in walked.malformed]
    return parsed
