"""One loader cache per node: the requested columns in one memory-mapped file all local ranks share.

``cache="node"`` (and ``cache="auto"`` when several ranks train) keeps the packed row-major
arrays of :mod:`feedline.loader.data.memory_cache` in a file under ``<cache_dir>/node``
instead of in each process's memory. The first loader process of a node fills it; every
loader process (torchrun ranks, ``torch.multiprocessing`` spawns, Ray Train workers, a
restarted job) maps it read-only, so the node holds one copy in the page cache however many
ranks read it, and a batch of the exact global shuffle is still one ``np.take`` per block.
Data larger than RAM works: the kernel pages the file in and out.

The file: a 4 KiB-aligned header (magic, version, CRC of the JSON that follows) describing
the arrays (key, dtype, shape, offset, bytes), the dataset it came from and what was checked
while filling it; then a table of CRC-32s, one per block of rows and array (see
:mod:`feedline.loader.data.block_checks`); then the arrays, each 4 KiB-aligned. Safety:

- **keyed by content**: the file name is a hash of the dataset's fingerprint (the manifest's
  shard checksums; for plain Parquet, each file's URL, size and modification tag), the
  columns with their dtypes and shapes, the packing and the list options, so a changed
  dataset or another column set never reuses a stale file;
- **verified when filled**: rows come through the shard reader, which checks every footer
  digest and page checksum; the header records the fingerprint and that check;
- **atomic**: one process fills ``.tmp/<key>.<pid>.<random>.tmp`` (space reserved first,
  so a full disk is an error, not a ``SIGBUS``) and renames it into place; an exclusive
  ``flock`` on ``.locks/<key>.lock`` makes the others wait, then they map the finished file.
  The lock dies with its process, so a crashed filler never blocks the others, and the next
  filler deletes its leftover temporary file;
- **checked on open**: a file whose size, magic, header CRC, key, array layout or CRC table
  is wrong (truncated, overwritten), or anything but a regular file at its path (a FIFO, a
  device, a symbolic link loop, an empty directory), is removed and rebuilt;
- **verified before use, in every process**: before a gather serves rows, the CRCs of the
  blocks holding them are checked (once per block and process), and the file's size is
  checked on the descriptor kept open with the map. A damaged block (a flipped byte, a
  stray write, an unflushed file after a crash) or a file truncated while mapped is never
  served: the file is removed and rebuilt under the lock, or mapped again if another
  process rebuilt it (logged as a warning; ``Loader.stats()["node_cache_rebuilds"]``). When
  that is not possible the gather raises :class:`~feedline.errors.IntegrityError`; a
  truncation is caught before the gather touches the missing pages, so it never kills the
  process with ``SIGBUS`` (a truncation *during* a gather still can).

Old files are not evicted: delete ``<cache_dir>/node`` to reclaim the space.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import socket
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from feedline.errors import ConfigurationError, FeedlineError, IntegrityError, StorageError
from feedline.host import memory_room
from feedline.io.storage.local_files import open_regular
from feedline.loader.data.block_checks import (
    CHECKSUM,
    BlockChecks,
    Region,
    block_count,
    block_rows,
    checksum_table,
)
from feedline.loader.data.cache_files import open_lock, remove_entry
from feedline.loader.data.file_cache_checks import check_file_cache
from feedline.loader.data.memory_cache import ColumnCache, FileLayout, load_cache
from feedline.loader.data.packed_columns import Packing, column_views, gather_packed
from feedline.loader.data.shard_cache import default_cache_dir
from feedline.store.commit import fsync_dir

__all__ = ["NodeCache", "cache_key", "node_cache_dir", "open_node_cache"]

logger = logging.getLogger(__name__)

MAGIC = b"FLNODE\x00\x01"
VERSION = 2
ALIGN = 4096
#: magic, version, header bytes, header CRC-32
_PREAMBLE = struct.Struct("<8sIII")
SUFFIX = ".flcache"
#: times one process rebuilds (or maps again) a file found damaged before giving up
MAX_REBUILDS = 3
#: whether blocks' CRCs are checked before use; ``False`` only to measure their cost
#: (bench/node_cache_verify.py): the file's size is checked either way
VERIFY = True


def node_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Node cache files' folder: ``~/.cache/feedline/node`` by default, else ``<cache_dir>/node``.

    Examples
    --------
    >>> node_cache_dir(None).parts[-3:]
    ('.cache', 'feedline', 'node')
    >>> node_cache_dir("/scratch/fl").as_posix()
    '/scratch/fl/node'
    """
    if cache_dir is None or Path(cache_dir).expanduser() == default_cache_dir():
        return default_cache_dir().parent / "node"
    return Path(cache_dir).expanduser() / "node"


def _array_specs(packing: Packing) -> list[dict[str, Any]]:
    out = [{"key": b.key, "dtype": b.dtype.str, "shape": [b.width]} for b in packing.blocks]
    return out + [{"key": c.name, "dtype": c.dtype.str, "shape": list(c.shape)}
                  for c in packing.singles]  # fmt: skip


def _identity(layout: FileLayout) -> dict[str, Any]:
    """What the dataset is: its fingerprint, or for plain Parquet each file's identity."""
    source = layout.source
    if source.has_checksums and source.fingerprint:
        return {"fingerprint": source.fingerprint, "rows": layout.row_group_sizes}
    files = []
    for f in layout.files:
        info = f.fs.info(f.path)
        tag = info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""
        files.append([f.url, int(info.get("size") or 0), str(tag)])
    return {"files": files, "rows": layout.row_group_sizes}


def cache_key(layout: FileLayout, packing: Packing, options: Mapping[str, Any]) -> str:
    """The node cache file's key: a hash of the dataset identity, the arrays and ``options``.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.loader.data.memory_cache import file_layout
    >>> from feedline.loader.data.columns import column_specs
    >>> from feedline.loader.data.packed_columns import plan_packing
    >>> from feedline.store.shard_source import open_shard_source
    >>> ds = fl.range(10).write(tempfile.mkdtemp() + "/ds")
    >>> layout = file_layout(open_shard_source(ds.path))
    >>> packing = plan_packing(column_specs(layout.source.schema()))
    >>> len(cache_key(layout, packing, {})), cache_key(layout, packing, {"a": 1}) == cache_key(
    ...     layout, packing, {})
    (40, False)
    """
    doc = {"version": VERSION, "dataset": _identity(layout), "arrays": _array_specs(packing),
           "order": list(packing.order), "options": dict(options)}  # fmt: skip
    text = json.dumps(doc, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _boot_id() -> str | None:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return None


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _row_bytes(spec: Mapping[str, Any]) -> int:
    return int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize


def _layout_of(packing: Packing, rows: int) -> tuple[list[dict[str, Any]], int]:
    """The arrays (offsets from the data's start) and the data's bytes."""
    arrays, at = [], 0
    for spec in _array_specs(packing):
        nbytes = rows * _row_bytes(spec)
        arrays.append({**spec, "offset": at, "nbytes": nbytes})
        at = _round(at + nbytes)
    return arrays, at


def _blocks_of(packing: Packing, rows: int) -> tuple[int, int]:
    """Rows per checksummed block, and the CRC table's bytes."""
    specs = _array_specs(packing)
    per_block = block_rows(sum(_row_bytes(s) for s in specs))
    return per_block, block_count(rows, per_block) * len(specs) * 4


def _regions(header: Mapping[str, Any]) -> list[Region]:
    base = header["data_offset"]
    return [Region(a["key"], base + a["offset"], _row_bytes(a)) for a in header["arrays"]]


def _views(memory: Any, header: dict[str, Any], base: int) -> dict[str, np.ndarray]:
    rows, out = header["rows"], {}
    for a in header["arrays"]:
        dtype = np.dtype(a["dtype"])
        count = a["nbytes"] // dtype.itemsize
        flat = np.frombuffer(memory, dtype, count, base + a["offset"])
        out[a["key"]] = flat.reshape(rows, *a["shape"])
    return out


@dataclass
class _Mapped:
    """One mapping of a cache file: its header, its arrays, their guard, the file's inode."""

    header: dict[str, Any]
    views: dict[str, np.ndarray]
    checks: BlockChecks
    inode: int


class NodeCache(ColumnCache):
    """A :class:`ColumnCache` whose arrays are read-only views of a node cache file.

    ``path`` is the file, ``header`` its parsed header, ``built`` whether this process
    filled it (else it mapped a file another process or an earlier run made) and
    ``open_seconds`` the time to open (and fill) it. Every gather is checked first (see
    :mod:`feedline.loader.data.block_checks`); a damaged file is rebuilt (``rebuilds``
    counts them) or, when that fails, the gather raises
    :class:`~feedline.errors.IntegrityError`.
    """

    def __init__(
        self, packing: Packing, mapped: _Mapped, path: Path, built: bool, seconds: float,
        rebuild: Callable[[_Mapped, str], tuple[_Mapped, bool]],
    ) -> None:  # fmt: skip
        super().__init__(packing=packing, storage=mapped.views)
        self.path, self.built, self.open_seconds = path, built, seconds
        self.rebuilds = 0
        self._mapped, self._rebuild, self._packing = mapped, rebuild, packing
        self._lock = threading.Lock()

    @property
    def header(self) -> dict[str, Any]:
        return self._mapped.header

    def gather(
        self,
        indices: np.ndarray,
        out: Mapping[str, np.ndarray] | None = None,
        scratch: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Rows ``indices`` of every batch key, from blocks checked in this process."""
        mapped = self._mapped
        problem = mapped.checks.check(indices)
        while problem is not None:
            mapped = self._recover(mapped, problem)
            problem = mapped.checks.check(indices)
        return gather_packed(self._packing, mapped.views, indices, out, scratch)

    def _recover(self, mapped: _Mapped, problem: str) -> _Mapped:
        """A good mapping instead of the damaged ``mapped``: rebuilt, or another process's."""
        with self._lock:
            if self._mapped is not mapped:  # another thread did it
                return self._mapped
            fix = (
                "check the disk under cache_dir (or pass another cache_dir=), make sure "
                "no other program writes to the node cache files, or use cache='memory'."
            )
            if self.rebuilds >= MAX_REBUILDS:
                raise IntegrityError(
                    f"The node cache file {str(self.path)!r} is damaged again after "
                    f"{self.rebuilds} rebuilds in this process: {problem}. Fix: {fix}"
                )
            logger.warning("node cache: %s; rebuilding %s", problem, self.path)
            try:
                fresh, built = self._rebuild(mapped, problem)
            except (FeedlineError, OSError) as exc:
                raise IntegrityError(
                    f"The node cache file {str(self.path)!r} is damaged ({problem}) and "
                    f"rebuilding it failed: {exc}. Fix: {fix}"
                ) from exc
            self.rebuilds += 1
            self.built = self.built or built
            self._mapped = fresh
            self.storage = dict(fresh.views)
            self.arrays = column_views(self._packing, self.storage)
            return fresh

    def describe(self) -> dict[str, Any]:
        """What ``Loader.stats()`` shows: the mode, the file, whether this process built it,
        how many times it found it damaged and rebuilt it, and the blocks it checked."""
        checks = self._mapped.checks
        return {"cache": "node", "node_cache_file": str(self.path),
                "node_cache_built": self.built, "node_cache_open_s": self.open_seconds,
                "node_cache_rebuilds": self.rebuilds, "node_cache_blocks": checks.blocks,
                "node_cache_blocks_verified": checks.verified_blocks}  # fmt: skip


def _read_header(fd: int, size: int) -> dict[str, Any] | None:
    """The header of an open cache file, or ``None`` when it is not a complete one."""
    if size < ALIGN:
        return None
    head = os.pread(fd, _PREAMBLE.size, 0)
    magic, version, length, crc = _PREAMBLE.unpack(head)
    if magic != MAGIC or version != VERSION or length > size:
        return None
    text = os.pread(fd, length, _PREAMBLE.size)
    if len(text) != length or zlib.crc32(text) != crc:
        return None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, not UTF-8: damaged
        return None
    if not isinstance(header, dict):
        return None
    return header if header.get("file_bytes") == size else None


_FIELDS = ("key", "dtype", "shape", "offset", "nbytes")


def _matches(header: dict[str, Any] | None, key: str, packing: Packing, rows: int) -> str | None:
    """What keeps ``header`` from describing the arrays ``key`` names, laid out as this
    version does (``None``: nothing)."""
    if header is None:
        return "no complete header (truncated, overwritten or an older format)"
    if header.get("key") != key or header.get("rows") != rows:
        return "the header names another dataset or column set"
    try:
        found = [{k: a[k] for k in _FIELDS} for a in header["arrays"]]
        base, table_at = int(header["data_offset"]), int(header["table_offset"])
        table_bytes, per_block = int(header["table_bytes"]), int(header["block_rows"])
        table_ok = header["checksum"] == CHECKSUM and isinstance(header["table_check"], str)
    except (KeyError, TypeError, ValueError):
        return "the header lacks the array layout"
    expected, data_bytes = _layout_of(packing, rows)
    want = [{k: a[k] for k in _FIELDS} for a in expected]
    ok = (
        found == want and table_ok and (per_block, table_bytes) == _blocks_of(packing, rows)
        and table_at % ALIGN == 0 and table_at >= ALIGN and base == _round(table_at + table_bytes)
        and base + data_bytes == header["file_bytes"]
    )  # fmt: skip
    return None if ok else "the header's array layout is not this version's"


def _read_table(fd: int, header: dict[str, Any]) -> np.ndarray | None:
    """The file's CRC table (``uint32[blocks, arrays]``), or ``None`` when it is damaged."""
    data = os.pread(fd, header["table_bytes"], header["table_offset"])
    if len(data) != header["table_bytes"] or f"{zlib.crc32(data):08x}" != header["table_check"]:
        return None
    return np.frombuffer(data, "<u4").reshape(-1, len(header["arrays"]))


def _open_file(path: Path) -> tuple[BinaryIO | None, str]:
    """The cache file open, or ``None`` and why not (missing, or not a regular file)."""
    try:
        return open_regular(path, what="the node cache file", error=IntegrityError), ""
    except FileNotFoundError:
        return None, "missing"
    except IntegrityError as exc:  # a FIFO, device, socket, directory, symbolic link loop
        return None, str(exc).split(";", 1)[0]


def _try_open(path: Path, key: str, packing: Packing, rows: int) -> tuple[_Mapped | None, str]:
    """Map the cache file ``path`` read-only if it is complete and what ``key`` names; else
    ``None`` and why not."""
    handle, why = _open_file(path)
    if handle is None:
        return None, why
    try:
        fd = handle.fileno()
        stat = os.fstat(fd)
        try:
            header = _read_header(fd, stat.st_size)
        except (ValueError, struct.error):
            header = None
        why = _matches(header, key, packing, rows) or ""
        table = _read_table(fd, header) if header is not None and not why else None
        if header is None or table is None:
            handle.close()
            return None, why or "its CRC table is damaged"
        memory = mmap.mmap(fd, stat.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        handle.close()
        raise
    if stat.st_size > memory_room() // 2 and hasattr(memory, "madvise"):
        # larger than the page cache can hold: a shuffled gather touches rows at random, and
        # the kernel's readahead around each fault would evict the pages the next batches
        # need (measured ~70x slower with the page cache capped at half the file)
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_RANDOM)
    checks = BlockChecks(
        memory, handle, header["file_bytes"], _regions(header), rows, header["block_rows"],
        table, f"the node cache file {str(path)!r}", verify=VERIFY,
    )  # fmt: skip
    views = _views(memory, header, header["data_offset"])
    return _Mapped(header, views, checks, stat.st_ino), ""


@contextlib.contextmanager
def _locked(folder: Path, key: str) -> Iterator[None]:
    import fcntl

    fd = open_lock(folder / ".locks" / f"{key}.lock", what="the node cache lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when this process dies, too
        yield
    finally:
        os.close(fd)


def _fill(path: Path, key: str, layout: FileLayout, packing: Packing,
          options: Mapping[str, Any], threads: int | None) -> None:  # fmt: skip
    """Build the cache file ``path`` (under the key's lock): temp file, fill, header, rename."""
    folder = path.parent
    for stale in (folder / ".tmp").glob(f"{key}.*.tmp"):  # a crashed filler's leftovers
        remove_entry(stale, what="node cache temporary file")
    rows = layout.num_rows
    arrays, data_bytes = _layout_of(packing, rows)
    per_block, table_bytes = _blocks_of(packing, rows)
    header: dict[str, Any] = {
        "format": "feedline node cache", "version": VERSION, "key": key, "rows": rows,
        "arrays": arrays, "order": list(packing.order), "options": dict(options),
        "checksum": CHECKSUM, "block_rows": per_block, "table_bytes": table_bytes,
        "boot": _boot_id(), "host": socket.gethostname(), "pid": os.getpid(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": layout.source.description, "fingerprint": layout.source.fingerprint,
        "shards": len(layout.files),
        "verified": "every footer digest (against the manifest) and page checksum of every row "
        "group read" if layout.source.has_checksums else "page checksums of every row group read",
    }  # fmt: skip
    numbers = {"table_offset": 0, "table_check": "0" * 8, "data_offset": 0, "file_bytes": 0}
    text_len = len(json.dumps({**header, **numbers}, default=str))
    table_at = _round(_PREAMBLE.size + text_len + 64)  # room for the numbers' digits
    base = _round(table_at + table_bytes)
    header |= {"table_offset": table_at, "data_offset": base, "file_bytes": base + data_bytes}
    tmp = folder / ".tmp" / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise _folder_error(tmp, exc) from exc
    try:
        try:
            reserve = getattr(os, "posix_fallocate", None)  # disk full: an error, not SIGBUS
            if reserve is not None:
                reserve(fd, 0, header["file_bytes"])
            else:  # macOS: a sparse file; a full disk shows when pages are written back
                os.ftruncate(fd, header["file_bytes"])
        except OSError as exc:
            raise StorageError(
                f"Cannot reserve {header['file_bytes']} bytes for the node cache file {str(tmp)!r}"
                f": {exc}. Fix: free disk space there, pass another cache_dir= (a local disk "
                "with room for the loader columns), or use cache='memory' / cache='none'."
            ) from exc
        memory = mmap.mmap(fd, header["file_bytes"], mmap.MAP_SHARED)
        storage = _views(memory, header, base)
        load_cache(layout.source, packing, layout=layout, threads=threads, storage=storage)
        table = checksum_table(memory, _regions(header), rows, per_block).tobytes()
        header["table_check"] = f"{zlib.crc32(table):08x}"
        text = json.dumps(header, default=str).encode()
        if _PREAMBLE.size + len(text) > table_at:
            raise IntegrityError(
                f"Node cache header of {str(tmp)!r} outgrew its {table_at} bytes. Fix: report "
                "this bug; meanwhile use cache='memory'."
            )
        del storage
        with contextlib.suppress(BufferError):
            memory.close()
        try:
            os.pwrite(fd, table, table_at)
            os.pwrite(fd, _PREAMBLE.pack(MAGIC, VERSION, len(text), zlib.crc32(text)) + text, 0)
            os.replace(tmp, path)
        except OSError as exc:
            raise _folder_error(path, exc) from exc
        fsync_dir(folder)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def _folder_error(path: Path, exc: OSError) -> ConfigurationError:
    return ConfigurationError(
        f"Cannot write the node cache file {str(path)!r}: {exc.strerror or exc}. Fix: pass a "
        "writable local cache_dir= to the loader, or use cache='memory'."
    )


def _make_folders(folder: Path) -> None:
    try:
        for sub in ("", ".locks", ".tmp"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot create the node cache folder {str(folder)!r}: {exc}. Fix: pass a writable "
            "local cache_dir= to the loader, or use cache='memory'."
        ) from exc


def open_node_cache(
    layout: FileLayout,
    packing: Packing,
    cache_dir: str | os.PathLike[str] | None,
    options: Mapping[str, Any] | None = None,
    threads: int | None = None,
) -> NodeCache:
    """Map the node cache file of ``layout``'s ``packing`` columns, filling it if needed.

    ``options`` (anything else that changes the arrays' values, e.g. list padding) join the
    key. Exactly one process fills a missing or damaged file; the others wait for it. A path
    that is unusable (a directory with files at the cache file's path, a lock path that is
    not a regular file, a read-only folder without the file) is a
    :class:`~feedline.errors.ConfigurationError` naming it.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.loader.data.memory_cache import file_layout
    >>> from feedline.loader.data.columns import column_specs
    >>> from feedline.loader.data.packed_columns import plan_packing
    >>> from feedline.store.shard_source import open_shard_source
    >>> ds = fl.range(5).write(tempfile.mkdtemp() + "/ds")
    >>> layout = file_layout(open_shard_source(ds.path))
    >>> packing = plan_packing(column_specs(layout.source.schema()))
    >>> folder = tempfile.mkdtemp()
    >>> first = open_node_cache(layout, packing, folder)
    >>> again = open_node_cache(layout, packing, folder)
    >>> first.built, again.built, again.gather(np.array([4, 0]))["id"].tolist()
    (True, False, [4, 0])
    """
    start = time.perf_counter()
    options = dict(options or {})
    check_file_cache(packing, "node", "POSIX file locks and memory maps", "cache='memory'")
    folder = node_cache_dir(cache_dir)
    _make_folders(folder)
    key = cache_key(layout, packing, options)
    path, rows = folder / f"{key}{SUFFIX}", layout.num_rows

    def fill_locked(why: str, log: bool = True) -> _Mapped:
        """Under the key's lock: remove what is at ``path`` (``why``: what is wrong with it;
        logged with ``log``), fill it and map it."""
        removed = remove_entry(path, what="node cache file")
        if removed is not None and log:
            logger.warning("node cache: removed %s (%s: %s); rebuilding it", path, removed, why)
        _fill(path, key, layout, packing, options, threads)
        got, why = _try_open(path, key, packing, rows)
        if got is None:
            raise IntegrityError(
                f"The node cache file {str(path)!r} was damaged right after it was written "
                f"({why}). Fix: check the disk under cache_dir (or pass another cache_dir=), "
                "or use cache='memory'."
            )
        return got

    def rebuild(old: _Mapped, problem: str) -> tuple[_Mapped, bool]:
        """A good mapping instead of ``old``: another process's rebuild, or a new file."""
        with _locked(folder, key):
            got, _ = _try_open(path, key, packing, rows)
            if got is not None and got.inode != old.inode:
                return got, False  # another process rebuilt it meanwhile
            del got
            return fill_locked(problem, log=False), True

    got, why = _try_open(path, key, packing, rows)
    built = False
    if got is None:
        with _locked(folder, key):
            got, why = _try_open(path, key, packing, rows)  # filled meanwhile
            if got is None:
                got, built = fill_locked(why), True
    return NodeCache(packing, got, path, built, time.perf_counter() - start, rebuild)
