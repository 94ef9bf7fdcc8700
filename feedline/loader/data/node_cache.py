"""One loader cache per node: the requested columns in one memory-mapped file all local ranks share.

``cache="node"`` (and ``cache="auto"`` when several ranks train) keeps the packed row-major
arrays of :mod:`feedline.loader.data.memory_cache` in a file under ``<cache_dir>/node``
instead of in each process's memory. The first loader process of a node fills it; every
loader process (torchrun ranks, ``torch.multiprocessing`` spawns, Ray Train workers, a
restarted job) maps it read-only, so the node holds one copy in the page cache however many
ranks read it, and a batch of the exact global shuffle is still one ``np.take`` per block.
Data larger than RAM works: the kernel pages the file in and out.

The file: a 4 KiB-aligned header (magic, version, CRC of the JSON that follows) describing
the arrays (key, dtype, shape, offset, bytes, CRC-32C of each), the dataset it came from and
what was checked while filling it, then the arrays, each 4 KiB-aligned. Safety:

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
- **checked on open**: a file whose size, magic, header CRC, key or array layout is wrong
  (truncated, overwritten) is deleted and rebuilt. The file is not fsynced (that would cost
  a disk write of the whole cache before the first batch); instead the header records the
  boot it was written in, and a file from an earlier boot has every array's CRC-32C
  checked before use (rebuilt if one differs; restamped with this boot if none does).

Old files are not evicted: delete ``<cache_dir>/node`` to reclaim the space.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import socket
import struct
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from feedline.errors import ConfigurationError, IntegrityError, StorageError
from feedline.host import memory_room
from feedline.loader.data.memory_cache import ColumnCache, FileLayout, load_cache
from feedline.loader.data.packed_columns import Packing
from feedline.loader.data.shard_cache import default_cache_dir
from feedline.store.commit import fsync_dir

__all__ = ["NodeCache", "cache_key", "node_cache_dir", "open_node_cache"]

MAGIC = b"FLNODE\x00\x01"
VERSION = 1
ALIGN = 4096
#: magic, version, header bytes, header CRC-32
_PREAMBLE = struct.Struct("<8sIII")
SUFFIX = ".flcache"


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


def _checksum_fn() -> tuple[str, Any]:
    try:
        import crc32c  # hardware CRC-32C: ~20 GB/s against zlib's ~4 GB/s here
    except ImportError:
        return "crc32", zlib.crc32
    return "crc32c", crc32c.crc32c


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


class NodeCache(ColumnCache):
    """A :class:`ColumnCache` whose arrays are read-only views of a node cache file.

    ``path`` is the file, ``header`` its parsed header, ``built`` whether this process
    filled it (else it mapped a file another process or an earlier run made) and
    ``open_seconds`` the time to open (and fill) it.
    """

    def __init__(self, packing: Packing, storage: dict[str, np.ndarray], path: Path,
                 header: dict[str, Any], built: bool, seconds: float) -> None:  # fmt: skip
        super().__init__(packing=packing, storage=storage)
        self.path, self.header, self.built, self.open_seconds = path, header, built, seconds

    def describe(self) -> dict[str, Any]:
        """What ``Loader.stats()`` shows: the mode, the file, whether this process built it."""
        return {"cache": "node", "node_cache_file": str(self.path),
                "node_cache_built": self.built, "node_cache_open_s": self.open_seconds}  # fmt: skip


def _layout_of(packing: Packing, rows: int) -> tuple[list[dict[str, Any]], int]:
    arrays, at = [], 0
    for spec in _array_specs(packing):
        row = int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
        arrays.append({**spec, "offset": at, "nbytes": rows * row, "check": "0" * 8})
        at = _round(at + rows * row)
    return arrays, at


def _views(memory: Any, header: dict[str, Any], base: int) -> dict[str, np.ndarray]:
    rows, out = header["rows"], {}
    for a in header["arrays"]:
        dtype = np.dtype(a["dtype"])
        count = a["nbytes"] // dtype.itemsize
        flat = np.frombuffer(memory, dtype, count, base + a["offset"])
        out[a["key"]] = flat.reshape(rows, *a["shape"])
    return out


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
    header = json.loads(text)
    return header if header.get("file_bytes") == size else None


def _data_ok(memory: Any, header: dict[str, Any]) -> bool:
    name, fn = _checksum_fn()
    if header["checksum"] != name:
        return False
    view = memoryview(memory)
    base = header["data_offset"]
    return all(f"{fn(view[base + a['offset'] : base + a['offset'] + a['nbytes']]):08x}"
               == a["check"] for a in header["arrays"])  # fmt: skip


_FIELDS = ("key", "dtype", "shape", "offset", "nbytes")


def _matches(
    header: dict[str, Any] | None, key: str, packing: Packing, rows: int
) -> TypeGuard[dict[str, Any]]:
    """Whether ``header`` describes the arrays ``key`` names, laid out as this version does
    (a ``None`` header never does)."""
    if not isinstance(header, dict) or header.get("key") != key or header.get("rows") != rows:
        return False
    try:
        found = [{k: a[k] for k in _FIELDS} for a in header["arrays"]]
        base = int(header["data_offset"])
    except (KeyError, TypeError, ValueError):
        return False
    expected, data_bytes = _layout_of(packing, rows)
    want = [{k: a[k] for k in _FIELDS} for a in expected]
    return found == want and base % ALIGN == 0 and base + data_bytes == header["file_bytes"]


def _try_open(
    path: Path, key: str, packing: Packing, rows: int, locked: bool = False
) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """Map the cache file ``path`` read-only if it is complete and what ``key`` names
    (``locked``: this process holds the key's lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        try:
            header = _read_header(fd, size)
        except (ValueError, struct.error):  # not JSON, not UTF-8: damaged
            header = None
        if not _matches(header, key, packing, rows):
            return None
        memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    if size > memory_room() // 2 and hasattr(memory, "madvise"):
        # larger than the page cache can hold: a shuffled gather touches rows at random, and
        # the kernel's readahead around each fault would evict the pages the next batches
        # need (measured ~70x slower with the page cache capped at half the file)
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_RANDOM)
    if header.get("boot") != _boot_id():  # written before a reboot and never fsynced
        if not _data_ok(memory, header):
            return None  # not all of it reached the disk
        _restamp(path, header, locked)
    return header, _views(memory, header, header["data_offset"])


def _restamp(path: Path, header: dict[str, Any], locked: bool) -> None:
    """Mark a file checked after a reboot as of this boot (so it is not checked again).

    The header is rewritten in place, under the key's lock: a process reading it meanwhile
    sees a bad header CRC, waits for the lock and reads it again.
    """
    header = {**header, "boot": _boot_id()}
    text = json.dumps(header, default=str).encode()
    if _PREAMBLE.size + len(text) > header["data_offset"]:
        return  # no room: checked again next time
    with contextlib.nullcontext() if locked else _locked(path.parent, header["key"]):
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, _PREAMBLE.pack(MAGIC, VERSION, len(text), zlib.crc32(text)) + text, 0)
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _locked(folder: Path, key: str) -> Iterator[None]:
    import fcntl

    fd = os.open(folder / ".locks" / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
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
        stale.unlink(missing_ok=True)
    rows = layout.num_rows
    arrays, data_bytes = _layout_of(packing, rows)
    name, fn = _checksum_fn()
    header: dict[str, Any] = {
        "format": "feedline node cache", "version": VERSION, "key": key, "rows": rows,
        "arrays": arrays, "order": list(packing.order), "options": dict(options),
        "checksum": name, "boot": _boot_id(), "host": socket.gethostname(), "pid": os.getpid(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": layout.source.description, "fingerprint": layout.source.fingerprint,
        "shards": len(layout.files),
        "verified": "every footer digest (against the manifest) and page checksum of every row "
        "group read" if layout.source.has_checksums else "page checksums of every row group read",
    }  # fmt: skip
    text_len = len(json.dumps({**header, "data_offset": 0, "file_bytes": 0}, default=str))
    base = _round(_PREAMBLE.size + text_len + 64)  # room for the two numbers' digits
    header |= {"data_offset": base, "file_bytes": base + data_bytes}
    tmp = folder / ".tmp" / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
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
        view = memoryview(memory)
        for a in arrays:
            a["check"] = f"{fn(view[base + a['offset'] : base + a['offset'] + a['nbytes']]):08x}"
        text = json.dumps(header, default=str).encode()
        if _PREAMBLE.size + len(text) > base:
            raise IntegrityError(
                f"Node cache header of {str(tmp)!r} outgrew its {base} bytes. Fix: report this "
                "bug; meanwhile use cache='memory'."
            )
        os.pwrite(fd, _PREAMBLE.pack(MAGIC, VERSION, len(text), zlib.crc32(text)) + text, 0)
        del storage, view
        with contextlib.suppress(BufferError):
            memory.close()
        if header["boot"] is None:  # no boot id to tell a crash from a reboot: write it out
            os.fsync(fd)
        os.replace(tmp, path)
        fsync_dir(folder)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def open_node_cache(
    layout: FileLayout,
    packing: Packing,
    cache_dir: str | os.PathLike[str] | None,
    options: Mapping[str, Any] | None = None,
    threads: int | None = None,
) -> NodeCache:
    """Map the node cache file of ``layout``'s ``packing`` columns, filling it if needed.

    ``options`` (anything else that changes the arrays' values, e.g. list padding) join the
    key. Exactly one process fills a missing or damaged file; the others wait for it.

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
    if os.name != "posix":
        raise ConfigurationError(
            "cache='node' needs POSIX file locks and memory maps (Linux, macOS). Fix: use "
            "cache='memory'."
        )
    unsupported = [c.name for c in packing.singles if c.dtype.hasobject]
    if unsupported:
        raise ConfigurationError(
            f"cache='node' holds fixed-size numbers and tensors; columns {unsupported} are "
            "strings or binary. Fix: leave them out (columns=[...]) or use cache='memory'."
        )
    folder = node_cache_dir(cache_dir)
    try:
        for sub in ("", ".locks", ".tmp"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot create the node cache folder {str(folder)!r}: {exc}. Fix: pass a writable "
            "local cache_dir= to the loader, or use cache='memory'."
        ) from exc
    key = cache_key(layout, packing, options)
    path, rows = folder / f"{key}{SUFFIX}", layout.num_rows
    got, built = _try_open(path, key, packing, rows), False
    if got is None:
        with _locked(folder, key):
            got = _try_open(path, key, packing, rows, locked=True)  # filled meanwhile
            if got is None:
                path.unlink(missing_ok=True)  # damaged or stale: rebuilt
                _fill(path, key, layout, packing, options, threads)
                got, built = _try_open(path, key, packing, rows, locked=True), True
    if got is None:
        raise IntegrityError(
            f"The node cache file {str(path)!r} was damaged right after it was written. Fix: "
            "check the disk under cache_dir (or pass another cache_dir=), or use cache='memory'."
        )
    header, storage = got
    return NodeCache(packing, storage, path, header, built, time.perf_counter() - start)
