"""How staged rows travel from the node that read them to the node whose ranks read them.

Staging an epoch (:mod:`feedline.loader.data.staging.stager`) reads each row once across the
cluster: node ``n`` reads its share of the row groups and *sends* every row to the bucket of
each destination ``(rank, positions)`` it has in the epoch's order; each rank then
*receives* its buckets from every node and puts each bucket in order in memory as it is
served (:mod:`feedline.loader.data.staging.buckets`).

:class:`StorageExchange` does it through a folder every node can read and write
(``stage_dir=``: a shared file system for several nodes; a local folder for one node,
``<cache_dir>/staged/exchange`` by default): per sender and destination node, one file per
bucket (cut as the receiver published: its ``bucket_rows``, from its own memory budget), then
a completion marker listing each file's size and CRC-32, written last by an
atomic rename. A receiver reads a sender's files only once its marker is there, each file
whole in one sequential read, checked against the marker before any row of it is used.
Each receiver owns its inbox: an epoch's files and markers stay while a rank of the node
reads them (a shared lock) and until the node stages a later epoch (they are the finished
stage that a restart within the epoch reuses), then it deletes them. A sender sends to
every node whose inbox lacks its marker, also when its own node's inbox is complete (a
receiver restarted from an older checkpoint gets the rows again); a sender killed mid-way
leaves no marker and its next run rewrites its files. One read of the data per epoch across
the cluster, one write and one sequential read of it through the exchange.

Why storage first: it needs no process group, no extra port and no Ray, works between
separately started jobs and restarts, and its traffic is large sequential files, which
shared file systems and object stores serve well. A ``torch.distributed`` (gloo/NCCL
all-to-all) or Ray object-store exchange fits the same interface (:class:`Exchange`:
``publish`` / ``layout`` / ``send`` / ``delivered`` / ``wait`` / ``complete`` / ``records`` /
``held`` / ``release``); neither is written yet.

Examples
--------
>>> import tempfile
>>> ex = StorageExchange(tempfile.mkdtemp(), "k", node=0, nodes=1)
>>> keys = [("x", np.dtype("<f8"), ())]
>>> out = ex.send("order", 0, to_node=0)
>>> out.write(0, 0, np.array([1, 0]), {"x": np.array([2.5, 1.5])})
>>> out.commit()
>>> ex.wait("order", 0, timeout=1)
>>> [(p.tolist(), a["x"].tolist()) for p, a in ex.records("order", 0, 0, 0, keys)]
[([1, 0], [2.5, 1.5])]
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from feedline.errors import IntegrityError, StorageError
from feedline.io.storage.local_files import open_regular
from feedline.store.commit import fsync_dir

try:  # ISA-L's CRC-32 (the ``isal`` package): the same value, about 10x zlib's speed
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the same function, slower
    from zlib import crc32

__all__ = ["WAIT_TIMEOUT", "Exchange", "Outbox", "StorageExchange"]

#: seconds a receiver waits for the other nodes' markers before it gives up
WAIT_TIMEOUT = 3600.0
#: a record's header: the number of rows that follow
_RECORD = struct.Struct("<q")
#: bytes buffered per open bucket file while sending (one file per bucket of every rank is
#: open: their buffers add up, 256 KiB each got a 300 MiB cgroup OOM-killed; a record longer
#: than this goes straight to the file)
_BUFFER = 64 << 10

#: a stored array's key, dtype and one row's shape
ArrayLayout = tuple[str, np.dtype, tuple[int, ...]]


class Outbox(Protocol):
    """One sender's rows for one destination node and epoch."""

    def write(
        self, rank: int, bucket: int, positions: np.ndarray, rows: Mapping[str, np.ndarray]
    ) -> None:
        """Send ``rows`` (arrays keyed as the storage, row-major) for ``positions``."""

    def commit(self) -> None:
        """Everything is sent: the receiver may read it."""

    def abort(self) -> None:
        """Drop what was written (an error stopped the sender)."""


class Exchange(Protocol):
    """The rows' way between nodes (see the module docs)."""

    def send(self, plan: str, epoch: int, to_node: int) -> Outbox: ...

    def publish(self, plan: str, epoch: int, layout: Mapping[str, Any]) -> None: ...

    def layout(
        self, plan: str, epoch: int, node: int, timeout: float | None = WAIT_TIMEOUT
    ) -> dict[str, Any] | None: ...

    def delivered(self, plan: str, epoch: int, to_node: int) -> bool: ...

    def wait(self, plan: str, epoch: int, timeout: float = WAIT_TIMEOUT) -> None: ...

    def complete(self, plan: str, epoch: int) -> bool: ...

    def records(
        self, plan: str, epoch: int, rank: int, bucket: int, arrays: Sequence[ArrayLayout]
    ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]: ...

    def held(self) -> list[tuple[str, int]]: ...

    def release(self, plan: str, epoch: int) -> None: ...


def _bytes(values: np.ndarray) -> memoryview:
    """The bytes of ``values`` (row-major), without a copy when they are contiguous."""
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8).data


class _FileOutbox:
    def __init__(self, folder: Path, marker: Path) -> None:
        self.folder, self.marker = folder, marker
        self._files: dict[str, BinaryIO] = {}
        self._crc: dict[str, int] = {}
        self._size: dict[str, int] = {}
        shutil.rmtree(folder, ignore_errors=True)  # a killed sender's leftovers
        folder.mkdir(parents=True, exist_ok=True)

    def write(
        self, rank: int, bucket: int, positions: np.ndarray, rows: Mapping[str, np.ndarray]
    ) -> None:
        name = f"r{rank}.b{bucket}"
        handle = self._files.get(name)
        if handle is None:
            handle = self._files[name] = open(self.folder / name, "wb", buffering=_BUFFER)  # noqa: SIM115
            self._crc[name], self._size[name] = 0, 0
        pieces = [memoryview(_RECORD.pack(len(positions))), _bytes(positions.astype("<i8"))]
        pieces += [_bytes(a) for a in rows.values()]
        crc, size = self._crc[name], self._size[name]
        for view in pieces:
            handle.write(view)
            crc, size = crc32(view, crc), size + len(view)
        self._crc[name], self._size[name] = crc, size

    def commit(self) -> None:
        # no fsync: a file that lost bytes in a crash of the machine fails its marker's size
        # or CRC-32 check before any row of it is used (and is sent again), and forcing 2x the
        # node's share to the disk here would stall pass 1 on the writeback
        for handle in self._files.values():
            handle.close()
        files = {n: [self._size[n], self._crc[n]] for n in self._files}
        self._files = {}
        tmp = self.marker.with_name(self.marker.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"files": files}))
        os.replace(tmp, self.marker)
        fsync_dir(self.marker.parent)

    def abort(self) -> None:
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._files = {}
        shutil.rmtree(self.folder, ignore_errors=True)


class StorageExchange:
    """Buckets as files in ``folder`` (see the module docs); ``key`` names the dataset, the
    columns and the order, so runs with other data or another order never mix."""

    def __init__(self, folder: str | os.PathLike[str], key: str, *, node: int, nodes: int) -> None:
        self.root = Path(folder) / key
        self.node, self.nodes = int(node), int(nodes)
        self._markers: dict[tuple[str, int, int], dict[str, list[int]]] = {}

    def _epoch(self, plan: str, epoch: int) -> Path:
        return self.root / plan / f"e{epoch}"

    def _marker(self, plan: str, epoch: int, to_node: int, from_node: int) -> Path:
        return self._epoch(plan, epoch) / f"to{to_node}" / f"from{from_node}.done"

    def send(self, plan: str, epoch: int, to_node: int) -> Outbox:
        """This node's outbox for ``to_node`` in epoch ``epoch`` of the order ``plan``
        (earlier partial files dropped)."""
        inbox = self._epoch(plan, epoch) / f"to{to_node}"
        marker = self._marker(plan, epoch, to_node, self.node)
        try:
            return _FileOutbox(inbox / f"from{self.node}", marker)
        except OSError as exc:
            raise StorageError(
                f"Cannot write the staging exchange folder {str(inbox)!r}: {exc}. Fix: pass a "
                "writable stage_dir= (a folder every node can reach) to the loader."
            ) from exc

    def publish(self, plan: str, epoch: int, layout: Mapping[str, Any]) -> None:
        """Say how this node takes its rows in ``epoch`` (its ``bucket_rows``): senders cut
        buckets as the receiver does, whatever each node's own memory budget."""
        path = self._epoch(plan, epoch) / f"to{self.node}" / "layout.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"layout.json.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dict(layout)))
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageError(
                f"Cannot write the staging exchange folder {str(path.parent)!r}: {exc}. Fix: "
                "pass a writable stage_dir= (a folder every node can reach) to the loader."
            ) from exc

    def layout(
        self, plan: str, epoch: int, node: int, timeout: float | None = WAIT_TIMEOUT
    ) -> dict[str, Any] | None:
        """What ``node`` published for ``epoch`` (waiting up to ``timeout`` seconds for it;
        ``timeout=None``: ``None`` at once when it is not there)."""
        path = self._epoch(plan, epoch) / f"to{node}" / "layout.json"
        deadline, pause = time.monotonic() + (timeout or 0), 0.005
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return dict(json.loads(path.read_text()))
            if timeout is None:
                return None
            if time.monotonic() > deadline:
                raise StorageError(
                    f"Staging epoch {epoch}: node {node} did not start staging it within "
                    f"{timeout:.0f} s (no {str(path)!r}). Fix: check that every node's loader "
                    "runs with the same stage_dir= (a shared folder), world_size and "
                    "ranks_per_node, and that none failed."
                )
            time.sleep(pause)
            pause = min(0.5, pause * 2)

    def delivered(self, plan: str, epoch: int, to_node: int) -> bool:
        """Whether this node's rows for ``to_node`` in ``epoch`` were all sent."""
        return self._marker(plan, epoch, to_node, self.node).is_file()

    def wait(self, plan: str, epoch: int, timeout: float = WAIT_TIMEOUT) -> None:
        """Block until every node's rows for this node in ``epoch`` are sent."""
        deadline, pause = time.monotonic() + timeout, 0.005
        while True:
            missing = [n for n in range(self.nodes) if (plan, epoch, n) not in self._markers]
            for n in missing:
                path = self._marker(plan, epoch, self.node, n)
                with contextlib.suppress(FileNotFoundError, ValueError):
                    self._markers[plan, epoch, n] = json.loads(path.read_text())["files"]
            missing = [n for n in range(self.nodes) if (plan, epoch, n) not in self._markers]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise StorageError(
                    f"Staging epoch {epoch}: nodes {missing} sent no rows to node {self.node} "
                    f"within {timeout:.0f} s (no marker under {str(self._epoch(plan, epoch))!r}). "
                    "Fix: check that every node's loader runs with the same stage_dir= (a "
                    "shared folder), world_size and ranks_per_node, and that none failed."
                )
            time.sleep(pause)
            pause = min(0.5, pause * 2)

    def complete(self, plan: str, epoch: int) -> bool:
        """Whether every node's rows for this node in ``epoch`` are here (an earlier run's
        inbox, or another rank's of the node): then :meth:`records` may be read. A sender's
        rows whose files are not the size its marker says are dropped, marker and all, so
        that sender sends them again."""
        whole = True
        for n in range(self.nodes):
            path = self._marker(plan, epoch, self.node, n)
            try:
                files = json.loads(path.read_text())["files"]
            except (OSError, ValueError, KeyError, TypeError):
                whole = False
                continue
            folder = path.parent / f"from{n}"
            for name, (size, _crc) in files.items():
                try:
                    intact = (folder / name).stat().st_size == size
                except OSError:
                    intact = False
                if not intact:
                    path.unlink(missing_ok=True)
                    shutil.rmtree(folder, ignore_errors=True)
                    self._markers.pop((plan, epoch, n), None)
                    whole = False
                    break
            else:
                self._markers[plan, epoch, n] = files
        return whole

    def records(
        self, plan: str, epoch: int, rank: int, bucket: int, arrays: Sequence[ArrayLayout]
    ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Every record sent for ``rank``'s ``bucket`` (after :meth:`wait`), checked against
        its sender's marker as it is read."""
        name = f"r{rank}.b{bucket}"
        for n in range(self.nodes):
            expected = self._markers[plan, epoch, n].get(name)
            if expected is None:
                continue
            path = self._epoch(plan, epoch) / f"to{self.node}" / f"from{n}" / name
            yield from _read_records(path, arrays, int(expected[0]), int(expected[1]))

    def held(self) -> list[tuple[str, int]]:
        """The ``(plan, epoch)`` pairs this node's inbox holds rows or markers of."""
        found = []
        for old in self.root.glob(f"*/e*/to{self.node}"):
            with contextlib.suppress(ValueError):
                found.append((old.parent.parent.name, int(old.parent.name[1:])))
        return found

    def release(self, plan: str, epoch: int) -> None:
        """Drop the rows and markers addressed to this node in ``epoch`` of ``plan`` (the
        caller holds that epoch's lock: no process of the node is staging it)."""
        folder = self._epoch(plan, epoch)
        shutil.rmtree(folder / f"to{self.node}", ignore_errors=True)
        for empty in (folder, folder.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()
        self._markers = {k: v for k, v in self._markers.items() if k[:2] != (plan, epoch)}


def _read_records(
    path: Path, arrays: Sequence[ArrayLayout], size: int, crc: int
) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """The records of one bucket file: the file read whole in one sequential read (its
    pages dropped from the page cache after it), its size and CRC-32 compared with the
    sender's marker before any record is handed out (records are views of that read)."""
    where = f"the staging exchange file {str(path)!r}"
    try:
        handle = open_regular(path, what="a staging exchange file", error=IntegrityError)
    except (OSError, IntegrityError) as exc:
        raise IntegrityError(
            f"Cannot read {where}: {exc}. Fix: check that stage_dir= is shared by every node "
            "and that nothing deletes files in it while the loaders run."
        ) from exc
    data = np.frombuffer(mmap.mmap(-1, max(1, size), flags=mmap.MAP_PRIVATE), np.uint8, size)
    with handle:
        fd = handle.fileno()
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        view, done = memoryview(data.data), 0
        while done < size:
            n = os.readv(fd, [view[done:]])
            if not n:
                break
            done += n
        longer = os.fstat(fd).st_size != size
        with contextlib.suppress(OSError, AttributeError):  # read once: leave the room
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    if done != size or longer:
        raise IntegrityError(
            f"{where} is shorter or longer than its sender's marker says ({size} "
            "bytes). Fix: delete the stage_dir folder of this epoch and restart."
        )
    if crc32(view) != crc:
        raise IntegrityError(
            f"{where} does not match its sender's marker (CRC-32 or size). Fix: delete the "
            "stage_dir folder of this epoch and restart."
        )
    row_bytes = [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, dtype, shape in arrays]
    at = 0
    while at < size:
        if at + _RECORD.size > size:
            raise IntegrityError(f"{where} holds a damaged record. Fix: restart the job.")
        (count,) = _RECORD.unpack_from(view, at)
        at += _RECORD.size
        need = count * (8 + sum(row_bytes))
        if count < 0 or at + need > size:
            raise IntegrityError(f"{where} holds a damaged record. Fix: restart the job.")
        positions = np.frombuffer(view, "<i8", count, at)
        at += count * 8
        rows: dict[str, Any] = {}
        for (key, dtype, shape), nbytes in zip(arrays, row_bytes, strict=True):
            rows[key] = np.frombuffer(view, dtype, count * nbytes // dtype.itemsize, at).reshape(
                count, *shape
            )
            at += count * nbytes
        yield positions, rows
