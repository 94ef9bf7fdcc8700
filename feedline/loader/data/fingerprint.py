"""What names the data a loader reads, for its checkpoints (``state_dict()["fingerprint"]``).

A loader state is refused on other data than it was taken on
(:func:`~feedline.loader.order.state.check_position`): its positions would name other
samples. A written feedline dataset is named by its manifest (the fingerprint of its shards'
checksums); data without a manifest is named here, cheaply:

- a plain Parquet folder: ``"parquet:"`` and the sha256 of every file's name, size and
  row groups and of the footers of up to :data:`FOOTER_FILES` files spread over the folder.
  A footer holds every column chunk's sizes, offsets and (as pyarrow and Spark write them)
  min/max statistics, so another file of as many rows has another footer; one small read
  per footer, so a folder of many remote files costs a bounded number of reads.
- computed and in-memory data (a :class:`~feedline.store.shard_source.BatchStream`, always
  cached by the loader): ``"content:"`` and the sha256 of the values the loader serves: every
  row when they take at most :data:`CONTENT_BYTES`, else rows spread evenly over the data up
  to that many bytes (first and last included). Each batch key's values are hashed in a
  canonical dtype (``int64``, ``float64``, ``bool``; text and bytes as UTF-8 / raw), so the
  fingerprint does not change with ``format=`` (torch widens ``uint16``); it does with the
  columns, ``stack=`` or ``dtype=``: resume with the loader options of the checkpoint.

Examples
--------
>>> import feedline as fl
>>> a, b = fl.range(100).loader(batch_size=10), fl.range(100).loader(batch_size=10)
>>> fp = data_fingerprint(a._source(), a._prepare())
>>> fp.startswith("content:"), fp == data_fingerprint(b._source(), b._prepare())
(True, True)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from feedline.errors import DataError
from feedline.loader.data.backend import Backend
from feedline.store.footers import footer_of
from feedline.store.shard_source import BatchStream, ShardSource

__all__ = ["CONTENT_BYTES", "FOOTER_FILES", "data_fingerprint", "sample_rows"]

#: footers read at most for a ``parquet:`` fingerprint
FOOTER_FILES = 16

#: bytes of loader values hashed at most for a ``content:`` fingerprint
CONTENT_BYTES = 16 << 20
#: rows gathered at once while hashing
_CHUNK_ROWS = 4096
#: bytes assumed for one value of an object column (a string) when sizing the sample
_OBJECT_BYTES = 80


def data_fingerprint(source: ShardSource | BatchStream, backend: Backend) -> str:
    """The fingerprint of the data ``backend`` serves from ``source`` (see the module docs).

    The manifest's for a written dataset; else ``"parquet:..."`` for a Parquet folder and
    ``"content:..."`` for computed or in-memory data.

    Raises
    ------
    DataError
        When a Parquet file's footer cannot be read (the file was removed or damaged).
    """
    if source.fingerprint is not None:
        return source.fingerprint
    if isinstance(source, ShardSource):
        return "parquet:" + _parquet_digest(source)
    return "content:" + _content_digest(backend)


def _parquet_digest(source: ShardSource) -> str:
    digest = hashlib.sha256()
    for loc, shard in zip(source.files, source.shards, strict=False):
        name = loc.url.rstrip("/").rsplit("/", 1)[-1]
        digest.update(f"{name}|{shard.bytes}|{tuple(shard.row_groups)}\n".encode())
    picked = sample_rows(len(source.files), 1, budget=FOOTER_FILES)
    for index in picked.tolist():
        loc = source.files[index]
        try:
            footer = footer_of(loc)
        except FileNotFoundError as exc:
            raise DataError(
                f"Cannot fingerprint the Parquet file {loc.url!r} for the loader state: it is "
                "gone. Fix: restore it, or load the state on the data it was taken on."
            ) from exc
        digest.update(footer.digest.encode() + b"\n")
    return digest.hexdigest()


def sample_rows(num_rows: int, row_bytes: int, budget: int = CONTENT_BYTES) -> np.ndarray:
    """The rows hashed: all of them when they fit ``budget`` bytes, else as many as fit,
    spread evenly from the first row to the last.

    Examples
    --------
    >>> sample_rows(5, 8).tolist(), sample_rows(100, 10, budget=50).tolist()
    ([0, 1, 2, 3, 4], [0, 25, 50, 74, 99])
    """
    if num_rows <= 0:
        return np.zeros(0, dtype=np.int64)
    count = max(2, budget // max(1, row_bytes))
    if count >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    return np.unique(np.linspace(0, num_rows - 1, count).round().astype(np.int64))


def _content_digest(backend: Backend) -> str:
    shapes = backend.shapes()
    digest = hashlib.sha256()
    for key in sorted(shapes):
        shape, dtype = shapes[key]
        digest.update(f"{key}|{tuple(shape)}|{_canonical(dtype)}\n".encode())
    digest.update(f"rows={backend.num_samples}\n".encode())
    row_bytes = sum(
        (_OBJECT_BYTES if d.kind == "O" else d.itemsize) * int(np.prod(s, dtype=np.int64))
        for s, d in shapes.values()
    )
    rows = sample_rows(backend.num_samples, row_bytes)
    session = backend.session(shuffle=False, seed=0, epoch=0)
    for start in range(0, rows.size, _CHUNK_ROWS):
        batch: Mapping[str, Any] = session.gather(rows[start : start + _CHUNK_ROWS])
        for key in sorted(batch):
            _hash_values(digest, batch[key])
    return digest.hexdigest()


def _canonical(dtype: np.dtype) -> str:
    """The dtype family values are hashed in (so a widened uint16 hashes as it was)."""
    if dtype.kind in "iu":
        return "int64"
    if dtype.kind == "f":
        return "float64"
    return "bool" if dtype.kind == "b" else dtype.kind


def _hash_values(digest: Any, values: Any) -> None:
    array = np.asarray(values) if not isinstance(values, list) else None
    if array is None or array.dtype.kind == "O":
        for value in _as_iterable(values):
            text = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
            digest.update(len(text).to_bytes(8, "little") + text)
        return
    if array.dtype.kind in "iu":
        array = array.astype(np.int64) if array.dtype != np.uint64 else array.view(np.int64)
    elif array.dtype.kind == "f":
        array = array.astype(np.float64)
    digest.update(np.ascontiguousarray(array).tobytes())


def _as_iterable(values: Any) -> Iterable[Any]:
    return values if isinstance(values, list) else np.asarray(values, dtype=object).reshape(-1)
