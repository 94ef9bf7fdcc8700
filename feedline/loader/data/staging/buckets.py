"""One rank's rows of a staged epoch, served from memory bucket by bucket.

Pass 2 of staging (:mod:`feedline.loader.data.staging.stager`): a rank's plan is cut into
buckets of ``bucket_rows`` consecutive positions (a sixteenth of ``memory_budget`` each, an
eighth with one rank on one node). When
the rank reaches a bucket, every sender's file of it is read from the node's inbox (one
sequential read each, :mod:`feedline.loader.data.staging.exchange`) and its rows are put in
order in memory (:func:`order_bucket`); the batches are taken from there. The next
:data:`AHEAD` bucket is read and ordered ahead by a thread of its own (a bucket's file is
read whole before it is ordered, so a bucket being read holds twice its size): three
buckets at most. Bucket arrays are anonymous maps, given back to the system
as soon as they are dropped. Nothing is written back: the
rows are written and read back once (the exchange's bucket files), not twice (those, then a
staged file per rank).

Examples
--------
>>> ids = np.array([7, 5, 9, 1, 3])
>>> data = {"x": ids * 10}
>>> def load(b, spare):  # bucket b: positions [2b, 2b + 2); spare: a dropped one's arrays
...     return {"x": data["x"][2 * b : 2 * b + 2]}
>>> held = Buckets(ids, 2, load)
>>> rows, waited = held.rows(1, 3)
>>> rows["x"].tolist()
[50, 90, 10]
>>> held.close()
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future

import numpy as np

from feedline.errors import IntegrityError
from feedline.loader.data.packed_columns import Packing

__all__ = ["AHEAD", "Buckets", "anonymous", "order_bucket"]

#: buckets read and ordered ahead of the one served, each by its own thread (two ahead, with
#: buckets of an eighth of the budget, read faster on a 600 MB bench but got the 300 MiB
#: cgroup test OOM-killed now and then)
AHEAD = 1


def order_bucket(
    records: Iterable[tuple[np.ndarray, Mapping[str, np.ndarray]]],
    packing: Packing,
    *,
    at: int,
    rows: int,
    epoch: int,
    rank: int,
    bucket: int,
    into: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Positions ``[at, at + rows)`` of a rank's plan in order, from the ``records`` sent for
    them (each: positions, and rows keyed as the packing's storage), checked to fill each
    position of the bucket once; in ``into`` (a dropped bucket's arrays) where they hold
    ``rows`` rows, else in new memory.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> from feedline.loader.data.packed_columns import plan_packing
    >>> packing = plan_packing(column_specs(pa.schema({"y": pa.int64()})))
    >>> (key,) = packing.allocate(0)
    >>> got = order_bucket([(np.array([11, 10]), {key: np.array([[2], [1]])})], packing,
    ...                    at=10, rows=2, epoch=0, rank=0, bucket=5)
    >>> got[key].ravel().tolist()
    [1, 2]
    """
    if into is not None and all(len(a) >= rows for a in into.values()):
        chunk = {key: a[:rows] for key, a in into.items()}
    else:
        chunk = {key: anonymous(a.dtype, (rows, *a.shape[1:]))
                 for key, a in packing.allocate(0).items()}  # fmt: skip
    filled = 0
    for positions, values in records:
        where = positions - at
        if where.size and (int(where.min()) < 0 or int(where.max()) >= rows):
            raise IntegrityError(
                f"Staging epoch {epoch}: bucket {bucket} of rank {rank} holds positions outside "
                "it. Fix: delete the stage_dir folder and restart."
            )
        for key, part in values.items():
            chunk[key][where] = part
        filled += where.size
    if filled != rows:
        raise IntegrityError(
            f"Staging epoch {epoch}: bucket {bucket} of rank {rank} got {filled} of its {rows} "
            "rows. Fix: check that every node runs the same loader options (seed, world_size, "
            "ranks_per_node) on the same dataset."
        )
    return chunk


def anonymous(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An array in memory of its own (an anonymous map), given back to the system as soon as
    the array is dropped: ``malloc`` would keep a freed bucket in the arena of the thread
    that read it (a thread per bucket: hundreds of MB held, measured in a memory cgroup).

    Examples
    --------
    >>> anonymous(np.dtype("<f4"), (2, 3)).shape
    (2, 3)
    """
    count = int(np.prod(shape, dtype=np.int64))
    memory = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(memory, dtype, count).reshape(shape)


class Buckets:
    """A rank's staged epoch: its row indices ``ids`` in read order, served by :meth:`rows`
    from buckets of ``bucket_rows`` positions that ``load(b, spare)`` reads and orders
    (buckets ``b + 1`` to ``b + AHEAD`` ahead, in threads, while bucket ``b`` is served;
    ``spare``: the arrays of a bucket served and dropped, to fill again, or ``None``: no
    fresh memory, and no page faults, per bucket); ``release`` is called once by
    :meth:`close`, and ``skipped()`` once a bucket is passed over without being loaded (a
    resume mid-epoch)."""

    def __init__(
        self,
        ids: np.ndarray,
        bucket_rows: int,
        load: Callable[[int, dict[str, np.ndarray] | None], dict[str, np.ndarray]],
        release: Callable[[], None] | None = None,
        skipped: Callable[[], None] | None = None,
    ) -> None:
        self.ids = ids
        self.bucket_rows = int(bucket_rows)
        self.count = -(-len(ids) // self.bucket_rows)
        self._load, self._release, self._skipped = load, release, skipped
        self._spare: list[dict[str, np.ndarray]] = []  # served buckets' arrays, to refill
        self._asked: set[int] = set()  # buckets ever asked for
        self._held: dict[int, Future[dict[str, np.ndarray]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def ahead(self, bucket: int) -> None:
        """Start reading and ordering ``bucket`` (once), in a thread of its own that ends
        with it (no thread outlives the loads asked for)."""
        with self._lock:
            if self._closed or not 0 <= bucket < self.count or bucket in self._held:
                return
            future: Future[dict[str, np.ndarray]] = Future()
            self._held[bucket] = future
            self._asked.add(bucket)

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            with self._lock:
                spare = self._spare.pop() if self._spare else None
            try:
                future.set_result(self._load(bucket, spare))
            except BaseException as exc:  # noqa: BLE001 (handed to the reader of the bucket)
                future.set_exception(exc)

        threading.Thread(target=run, name="feedline-stage-bucket", daemon=True).start()

    def rows(self, at: int, n: int) -> tuple[dict[str, np.ndarray], float]:
        """Positions ``[at, at + n)`` (``n >= 1``; views of one bucket, or a copy across two)
        and the seconds waited for their buckets; the buckets before them are dropped."""
        size = self.bucket_rows
        first, last = at // size, (at + n - 1) // size
        with self._lock:
            missed = any(b not in self._asked for b in range(first))
            for old in [b for b in self._held if b < first]:
                done = self._held.pop(old)
                missed |= done.cancel()  # never loaded
                if done.done() and not done.cancelled() and done.exception() is None:
                    # served (the rows handed out were copied by the gather): refill it
                    self._spare = [done.result(), *self._spare][:AHEAD]
        if missed and self._skipped is not None:
            skipped, self._skipped = self._skipped, None
            skipped()
        for b in range(first, last + 1 + AHEAD):  # and the next ones ahead
            self.ahead(b)
        parts, waited = [], 0.0
        for b in range(first, last + 1):
            future = self._held.get(b)
            if future is None:
                raise IntegrityError(
                    "A staged epoch was read after its loader closed it. Fix: iterate the "
                    "loader again."
                )
            if not future.done():
                start = time.perf_counter()
                bucket = future.result()
                waited += time.perf_counter() - start
            else:
                bucket = future.result()
            lo, hi = max(at, b * size) - b * size, min(at + n, (b + 1) * size) - b * size
            parts.append({k: v[lo:hi] for k, v in bucket.items()})
        if len(parts) == 1:
            return parts[0], waited
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, waited

    def close(self) -> None:
        """Drop the buckets held and stop reading ahead; let the inbox go."""
        with self._lock:
            self._closed = True
            held, self._held = self._held, {}
            release, self._release = self._release, None
        for future in held.values():
            future.cancel()
        if release is not None:
            release()
