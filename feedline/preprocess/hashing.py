"""``HashingEncoder``: the hashing trick with a stable, vectorized MurmurHash3."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError
from feedline.preprocess.encoders import as_strings
from feedline.preprocess.preprocessor import Preprocessor, register
from feedline.preprocess.scalers import check_outputs, put_column

__all__ = ["HashingEncoder", "murmur3_32"]


@register
class HashingEncoder(Preprocessor):
    """Hash categories into ``num_features`` buckets (the hashing trick): ``int64`` ids.

    Stateless (nothing to fit). The id is ``murmur3_32(utf8(value), seed) % num_features``
    with MurmurHash3 x86 32-bit over the UTF-8 bytes (unsigned), the same on every process
    and platform (equal to ``sklearn.utils.murmurhash3_32(value, seed, positive=True)``).
    Non-strings are hashed by their Arrow string form; nulls stay null. Each batch is
    dictionary-encoded first, so every distinct value is hashed once (by the vectorized
    :func:`murmur3_32`): about 20M rows/s for categories, 2M rows/s for unique strings.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.preprocess.hashing import HashingEncoder
    >>> he = HashingEncoder("c", num_features=1000)
    >>> he.transform_batch(pa.record_batch({"c": ["red", "blue", None]}))["c"].to_pylist()
    [621, 331, None]
    """

    needs_fit = False

    def __init__(
        self,
        columns: str | Sequence[str],
        num_features: int,
        output: str | Sequence[str] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(columns, output)
        check_outputs(self)
        if not isinstance(num_features, int) or not 1 <= num_features <= 2**32:
            raise ConfigurationError(
                f"HashingEncoder(num_features={num_features!r}) must be an int in [1, 2**32]. "
                "Fix: e.g. num_features=2**18."
            )
        self.num_features = num_features
        self.seed = int(seed) & 0xFFFFFFFF

    def params(self) -> dict[str, Any]:
        return super().params() | {"num_features": self.num_features, "seed": self.seed}

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        out = batch
        for column, name in zip(self.columns, self.output, strict=True):
            encoded = pc.dictionary_encode(as_strings(batch.column(column)))  # hash uniques
            ids = murmur3_32(encoded.dictionary, self.seed).astype(np.int64) % self.num_features
            out = put_column(out, name, pc.take(pa.array(ids), encoded.indices))
        return out


_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k(k: np.ndarray) -> np.ndarray:
    return _rotl(k * _C1, 15) * _C2


def _byte(data: np.ndarray, pos: np.ndarray, shift: int) -> np.ndarray:
    # gather from the compact uint8 buffer (cache friendly), then widen
    return data[pos].astype(np.uint32) << np.uint32(shift)


def murmur3_32(values: pa.Array, seed: int = 0) -> np.ndarray:
    """MurmurHash3 (x86, 32-bit) of each string's UTF-8 bytes, vectorized over the column.

    Rows are processed 4-byte block by block, longest strings first, so the cost is one
    NumPy pass per block position over the rows that still have bytes there. Null rows
    get an unspecified value.

    Examples
    --------
    >>> import pyarrow as pa
    >>> [int(h) for h in murmur3_32(pa.array(["", "a", "hello"]))]
    [0, 1009084850, 613153351]
    """
    n = len(values)
    if n == 0:
        return np.empty(0, dtype=np.uint32)
    large = pa.types.is_large_string(values.type)
    _, offs_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offs_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[values.offset : values.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, "u1")
    data = np.ascontiguousarray(data[offsets[0] : offsets[-1]])  # slices share the parent buffer
    offsets = offsets - offsets[0]
    lengths = offsets[1:] - offsets[:-1]
    blocks = lengths // 4
    order = np.argsort(-blocks, kind="stable")
    starts, blocks, lengths = offsets[:-1][order], blocks[order], lengths[order]
    h = np.full(n, seed, dtype=np.uint32)
    neg_blocks = -blocks
    for j in range(int(blocks[0]) if n else 0):
        m = int(np.searchsorted(neg_blocks, -j, side="left"))  # rows with more than j blocks
        pos = starts[:m] + 4 * j
        k = _byte(data, pos, 0) | _byte(data, pos + 1, 8)  # little-endian block
        k |= _byte(data, pos + 2, 16) | _byte(data, pos + 3, 24)
        hm = _rotl(h[:m] ^ _mix_k(k), 13)
        h[:m] = hm * np.uint32(5) + np.uint32(0xE6546B64)
    tail = lengths & 3
    tail_start = starts + 4 * blocks
    k = np.zeros(n, dtype=np.uint32)
    for t in (2, 1, 0):
        sel = tail > t
        k[sel] ^= _byte(data, tail_start[sel] + t, 8 * t)
    sel = tail > 0
    h[sel] ^= _mix_k(k[sel])
    h ^= lengths.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    out = np.empty(n, dtype=np.uint32)
    out[order] = h
    return out
