"""A local disk cache of remote shards, shared by the processes of one node.

The loader reads a remote dataset (any non-local fsspec URL, e.g. ``s3://``) through a
:class:`ShardCache`: each shard is downloaded once into a cache folder, checked against the
manifest (size and sha256; size only for plain Parquet files), and then read from local disk.
A background thread downloads the shards a few ahead of the reader, in the order the epoch
will read them, so the first batch waits for one shard, not for the dataset.

The folder (``~/.cache/feedline/shards`` by default) is safe for several processes at once:

- files are named by content (``sha256-<hex>.parquet``), so dataset versions never mix;
- a download goes to ``.tmp/<name>.<pid>.<random>.part``, is fsynced and renamed into
  place atomically: a file under its final name is always complete;
- a per-shard lock (``.locks/<name>.lock``, ``flock``) makes one process download a shard
  while the others wait and then use it; eviction runs under a folder-wide lock;
- a reader holds a shared ``flock`` on a cached file while it reads it, and eviction skips
  files it cannot lock exclusively, so a shard in use is never deleted under a reader;
- ``flock`` locks die with their process, so a killed process leaves no stale lock; its
  ``.part`` leftovers are removed by the next download of that shard or the next eviction;
- a cached entry is checked before use: a regular file (opened with ``O_NOFOLLOW`` and
  ``O_NONBLOCK``, so a symbolic link, a FIFO, a device or a directory planted in its place
  never hangs or feeds the reader), of the manifest's size and sha256. A bad entry (truncated,
  swapped, replaced) is removed, logged, counted (``shard_corrupt``) and downloaded again; an
  empty directory is removed too, one with files in it is refused with a clear error.

The size limit is kept by evicting the least recently used files (modification time is
touched on every use). Shards being read at once may exceed it briefly. Needs POSIX
``flock`` (Linux, macOS).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import stat
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feedline.errors import ConfigurationError, FeedlineError, IntegrityError, StorageError
from feedline.io.storage.local_files import file_kind, open_regular
from feedline.loader.data.cache_files import open_lock, remove_entry
from feedline.store.commit import fsync_dir
from feedline.ui.progress import bar as progress_bar

if TYPE_CHECKING:
    from feedline.io.storage.paths import Location
    from feedline.store.manifest import ShardInfo

__all__ = ["CacheStats", "ShardCache", "ShardKey", "default_cache_dir", "write_chunk"]

logger = logging.getLogger(__name__)

#: bytes read from the remote object and written to the cache file at a time
CHUNK = 8 << 20
#: shards the background thread downloads ahead of the one being read
AHEAD = 2
_SHA256 = re.compile(r"sha256:([0-9a-f]{64})")
_FULL = (errno.ENOSPC, errno.EDQUOT)


def default_cache_dir() -> Path:
    """The per-user shard cache folder, ``~/.cache/feedline/shards``.

    Examples
    --------
    >>> default_cache_dir().parts[-3:]
    ('.cache', 'feedline', 'shards')
    """
    return Path.home() / ".cache" / "feedline" / "shards"


def write_chunk(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to the file descriptor ``fd`` (every cache write goes here).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     write_chunk(f.fileno(), b"abc")
    ...     _ = f.seek(0)
    ...     f.read()
    b'abc'
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass(frozen=True)
class ShardKey:
    """What a cached shard must be: its file name in the cache, size and checksum.

    Examples
    --------
    >>> ShardKey.of("s3://b/ds/part-0.parquet", 10, "sha256:" + "ab" * 32).name[:12]
    'sha256-ababa'
    """

    name: str
    size: int
    checksum: str | None

    @classmethod
    def of(cls, url: str, size: int, checksum: str | None, tag: str = "") -> ShardKey:
        """Content-addressed by a sha256 checksum; else by (url, size, ``tag``), size-checked."""
        match = _SHA256.fullmatch(checksum or "")
        if match:
            return cls(f"sha256-{match.group(1)}.parquet", int(size), checksum)
        ident = hashlib.sha256(f"{url}\0{size}\0{tag}".encode()).hexdigest()[:40]
        return cls(f"plain-{ident}.parquet", int(size), None)


@dataclass
class CacheStats:
    """Counters of one :class:`ShardCache` (``Loader.stats()`` shows them as ``shard_<name>``).

    ``hits`` counts shard reads that found the file in the folder (downloaded earlier, by the
    prefetch thread or by another process); ``downloads`` and ``download_bytes`` the shards
    this cache fetched; ``corrupt`` the cached entries found bad (wrong size or checksum, or
    not a regular file: removed, then fetched again); ``evictions`` the files it deleted to
    keep the limit; ``prefetch_errors`` the failed background downloads (the reader then
    downloads the shard itself, and raises).
    """

    hits: int = 0
    downloads: int = 0
    download_bytes: int = 0
    evictions: int = 0
    corrupt: int = 0
    prefetch_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f"shard_{k}": v for k, v in self.__dict__.items()}


def _flock(fd: int, shared: bool = False, block: bool = True) -> bool:
    import fcntl

    flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if block else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        return False
    return True


#: what :meth:`ShardCache._open_cached` says of a shard that is not in the folder
_ABSENT = "absent"


def _storage_error(message: str, url: str, exc: BaseException) -> StorageError:
    error = StorageError(message)
    error.url, error.last_error = url, exc
    return error


class ShardCache:
    """Local copies of the remote shards ``files``, checked against ``keys``.

    Parameters
    ----------
    files:
        The shards' remote locations.
    keys:
        For each shard, its cache name, size and checksum (see :meth:`for_files`).
    folder:
        The cache folder (created if missing; shared with other processes and datasets).
    limit:
        Bytes the folder may hold; least recently used shards are evicted beyond it.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> src = resolve("memory://doc/ds")
    >>> _ = fl.range(10).write(src.url, rows_per_shard=5)
    >>> ds = fl.open(src.url)
    >>> cache = ShardCache.for_files(ds.plan.source.files, ds.manifest.shards,
    ...                              tempfile.mkdtemp(), limit=10**6)
    >>> with cache.using(0) as path:
    ...     path.endswith(".parquet")
    True
    >>> cache.stats.downloads, cache.stats.hits
    (1, 0)
    """

    def __init__(
        self, files: Sequence[Location], keys: Sequence[ShardKey], folder: str | os.PathLike[str],
        limit: int, ahead: int = AHEAD,
    ) -> None:  # fmt: skip
        if os.name != "posix":
            raise ConfigurationError(
                "The shard cache needs POSIX file locks (Linux, macOS). Fix: pass "
                "cache_dir=False to read remote shards directly."
            )
        self.files, self.keys, self.limit, self.ahead = list(files), list(keys), limit, ahead
        self.folder = Path(folder).expanduser()
        try:
            for sub in ("", ".locks", ".tmp"):
                (self.folder / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"Cannot create the shard cache folder {str(self.folder)!r}: {exc}. Fix: pass a "
                "writable cache_dir= to the loader (or cache_dir=False to read directly)."
            ) from exc
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._verified: set[tuple[str, int, int]] = set()
        self._cond = threading.Condition()
        self._order: list[int] = []
        self._pos, self._generation = 0, 0
        self._thread: threading.Thread | None = None

    @classmethod
    def for_files(
        cls, files: Sequence[Location], shards: Sequence[ShardInfo] | None,
        folder: str | os.PathLike[str], limit: int,
    ) -> ShardCache:  # fmt: skip
        """A cache for ``files``: keys from the manifest's ``shards``, else from ``fs.info``."""
        if shards is not None:
            keys = [
                ShardKey.of(f.url, s.bytes, s.checksum) for f, s in zip(files, shards, strict=True)
            ]
        else:
            keys = []
            for f in files:
                info = f.fs.info(f.path)
                tag = info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""
                keys.append(ShardKey.of(f.url, int(info["size"]), None, str(tag)))
        return cls(files, keys, folder, limit)

    # ------------------------------------------------------------------ reading

    @contextlib.contextmanager
    def using(self, i: int) -> Iterator[str]:
        """The local path of shard ``i``, downloaded if needed, kept from eviction meanwhile."""
        self._advance(i)
        downloaded, found = False, []
        for _ in range(3):
            fd, why = self._open_cached(i)
            if fd is not None:
                break
            found.append(why)
            downloaded = self._download(i) or downloaded
        else:
            if any(why != _ABSENT for why in found):
                raise IntegrityError(
                    f"Shard {self.files[i].url!r} was bad in the cache folder "
                    f"{str(self.folder)!r} each time it was read, though each bad copy was "
                    f"removed and downloaded again (last: {found[-1]}). Fix: check the disk "
                    "under cache_dir and that no other program writes there, or pass "
                    "cache_dir=False to read the shards directly."
                )
            raise IntegrityError(
                f"Shard {self.files[i].url!r} keeps disappearing from the cache folder "
                f"{str(self.folder)!r} (evicted right after download). Fix: raise cache_limit "
                f"(now {self.limit} bytes) or stop other processes evicting it."
            )
        if not downloaded:
            with self._lock:
                self.stats.hits += 1
        try:
            path = str(self.folder / self.keys[i].name)
            with contextlib.suppress(OSError):
                os.utime(path)  # least recently used = oldest modification time
            yield path
        finally:
            os.close(fd)  # releases the shared lock

    def _open_cached(self, i: int) -> tuple[int | None, str]:
        """A descriptor of the cached shard holding a shared lock, or ``None`` and why not
        (:data:`_ABSENT`, or what was wrong with the entry, which is then removed)."""
        key = self.keys[i]
        path = self.folder / key.name
        try:  # O_NOFOLLOW: a symbolic link is never a shard this cache wrote
            flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
            with open_regular(path, what="a cached shard", error=IntegrityError, flags=flags) as f:
                fd = os.dup(f.fileno())
        except FileNotFoundError:
            return None, _ABSENT
        except IntegrityError:  # a symbolic link, FIFO, device, socket or directory
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None, _ABSENT
            return None, self._drop_bad(i, None, f"it is {file_kind(mode)}, not a regular file")
        _flock(fd, shared=True)
        st = os.fstat(fd)
        ident = (key.name, st.st_ino, st.st_size)
        why = ""
        if st.st_nlink == 0:  # evicted by another process after we opened it
            why = _ABSENT
        elif st.st_size != key.size:
            why = f"it holds {st.st_size} bytes; the dataset says {key.size}"
        elif key.checksum is not None and ident not in self._verified:
            found = self._checksum(fd)
            if found == key.checksum:
                with self._lock:
                    self._verified.add(ident)
            else:
                why = f"its checksum is {found}; the dataset says {key.checksum}"
        if not why:
            return fd, ""
        os.close(fd)
        return None, why if why == _ABSENT else self._drop_bad(i, st.st_ino, why)

    @staticmethod
    def _checksum(fd: int) -> str:
        digest = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as handle:
            handle.seek(0)
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
        return "sha256:" + digest.hexdigest()

    def _drop_bad(self, i: int, inode: int | None, why: str) -> str:
        """Remove the bad cached entry of shard ``i`` (if it is still that file, by ``inode``;
        if it is still not a regular file, without one), count and log it; returns ``why``."""
        key = self.keys[i]
        path = self.folder / key.name
        with self._shard_lock(key):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return why
            same = st.st_ino == inode if inode is not None else not stat.S_ISREG(st.st_mode)
            if not same:  # replaced meanwhile (downloaded again): checked on the next try
                return why
            with self._lock:
                self.stats.corrupt += 1
            logger.warning(
                "shard cache: the cached copy of %s (%s) was bad: %s; downloading it again",
                self.files[i].url, path, why,
            )  # fmt: skip
            remove_entry(path, what="cached shard")
        return why

    # ------------------------------------------------------------------ downloading

    @contextlib.contextmanager
    def _shard_lock(self, key: ShardKey) -> Iterator[None]:
        fd = open_lock(self.folder / ".locks" / f"{key.name}.lock", what="the shard cache lock")
        try:
            _flock(fd)
            yield
        finally:
            os.close(fd)

    def _download(self, i: int) -> bool:
        """Download shard ``i`` unless present; returns whether this call downloaded it."""
        key, src = self.keys[i], self.files[i]
        path = self.folder / key.name
        with self._shard_lock(key):
            if os.path.lexists(path):  # another thread or process finished it meanwhile
                return False  # (a bad entry is removed when it is opened)
            for stale in (self.folder / ".tmp").glob(f"{key.name}.*.part"):
                stale.unlink(missing_ok=True)  # a killed download of this shard
            self._make_room(key)
            for attempt in (1, 2):  # a transfer cut short gets one more try
                tmp = self.folder / ".tmp" / f"{key.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
                try:
                    size, checksum = self._fetch(src, tmp, key)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                if size == key.size and key.checksum in (None, checksum):
                    break
                tmp.unlink(missing_ok=True)
                if attempt == 2:
                    raise IntegrityError(
                        f"Shard {src.url!r} downloaded twice as {size} bytes with checksum "
                        f"{checksum}; the dataset says {key.size} bytes, "
                        f"{key.checksum or 'no checksum'}. The remote object was replaced or "
                        "truncated after the dataset was opened. Fix: re-open the dataset "
                        "(fl.open) or restore the shard; fl.verify(path) checks all."
                    )
            with self._lock:  # counted before a reader can see the file
                self.stats.downloads += 1
                self.stats.download_bytes += size
            os.replace(tmp, path)
            fsync_dir(self.folder)
        return True

    def _fetch(self, src: Location, tmp: Path, key: ShardKey) -> tuple[int, str]:
        """Copy ``src`` into the new file ``tmp`` (fsynced); returns its size and checksum."""
        digest, size = hashlib.sha256(), 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise ConfigurationError(
                f"Cannot create {str(tmp)!r} in the shard cache folder: {exc.strerror or exc}. "
                "Fix: check that cache_dir is a writable local folder (or pass cache_dir=False)."
            ) from exc
        try:
            try:
                handle = src.fs.open(src.path, "rb", block_size=CHUNK)
            except FeedlineError:
                raise
            except Exception as exc:  # any fsspec backend: report the object, keep the cause
                raise self._remote_error(src, exc) from exc
            bar = progress_bar(f"download {src.url}", total=key.size, unit="bytes", transient=True)
            with handle, bar as advance:
                while True:
                    try:
                        chunk = handle.read(CHUNK)
                    except FeedlineError:
                        raise
                    except Exception as exc:
                        raise self._remote_error(src, exc) from exc
                    if not chunk:
                        break
                    digest.update(chunk)
                    write_chunk(fd, chunk)
                    size += len(chunk)
                    advance(len(chunk))
            os.fsync(fd)
        except OSError as exc:
            if exc.errno in _FULL:
                raise _storage_error(
                    f"Disk full while caching shard {src.url!r} ({key.size} bytes) in the cache "
                    f"folder {str(self.folder)!r} (cache_limit {self.limit} bytes): {exc}. The "
                    "partial file was removed. Fix: free disk space there, or lower cache_limit, "
                    "or choose another cache_dir (cache_dir=False reads without a cache).",
                    src.url, exc,
                ) from exc  # fmt: skip
            raise ConfigurationError(
                f"Cannot write shard {src.url!r} into the cache folder {str(self.folder)!r}: "
                f"{exc}. Fix: check that cache_dir is a writable local folder."
            ) from exc
        finally:
            os.close(fd)
        return size, "sha256:" + digest.hexdigest()

    @staticmethod
    def _remote_error(src: Location, exc: BaseException) -> StorageError:
        return _storage_error(
            f"Cannot download shard {src.url!r}: {type(exc).__name__}: {exc}. Fix: check that "
            "the object exists and the storage is reachable (storage_options: endpoint, "
            "credentials), then retry.",
            src.url, exc,
        )  # fmt: skip

    def _make_room(self, key: ShardKey) -> None:
        """Evict least recently used, unused shards until ``key`` fits the limit."""
        if key.size > self.limit:
            raise ConfigurationError(
                f"The shard cache limit ({self.limit} bytes) is smaller than shard {key.name} "
                f"({key.size} bytes). Fix: raise cache_limit= (or write smaller shards)."
            )
        fd = open_lock(self.folder / ".lock", what="the shard cache folder lock")
        try:
            _flock(fd)
            self._sweep_temps()
            files = []
            for entry in os.scandir(self.folder):
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat(follow_symlinks=False)
                    files.append((stat.st_mtime_ns, stat.st_size, entry.path))
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files):
                if total + key.size <= self.limit:
                    break
                if self._evict(path):
                    total -= size
        finally:
            os.close(fd)

    def _evict(self, path: str) -> bool:
        try:  # a regular file when listed; anything swapped in since is left alone
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return False
        try:
            if not _flock(fd, block=False):  # a reader holds it: keep it
                return False
            os.unlink(path)
        finally:
            os.close(fd)
        with self._lock:
            self.stats.evictions += 1
        return True

    def _sweep_temps(self) -> None:
        """Remove ``.part`` files whose shard lock nobody holds (left by killed downloads)."""
        for tmp in (self.folder / ".tmp").glob("*.part"):
            lock = self.folder / ".locks" / f"{tmp.name.split('.parquet.', 1)[0]}.parquet.lock"
            fd = open_lock(lock, what="the shard cache lock")
            try:
                if _flock(fd, block=False):
                    with contextlib.suppress(IsADirectoryError, PermissionError):
                        tmp.unlink(missing_ok=True)  # (a directory there: not ours, left)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ prefetching

    def schedule(self, order: Sequence[int]) -> None:
        """Download the shards ``order`` (in reading order) ahead of their use, ``ahead`` at once.

        Replaces the previous schedule. The reader's position advances as it uses shards.
        """
        with self._cond:
            self._order, self._pos = [int(i) for i in order], 0
            self._generation += 1
            self._cond.notify_all()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=_prefetch_loop, args=(weakref.ref(self), self._cond),
                    name="feedline-shard-prefetch", daemon=True,
                )  # fmt: skip
                self._thread.start()

    def _advance(self, i: int) -> None:
        with self._cond, contextlib.suppress(ValueError):  # not scheduled: position stays
            self._pos = self._order.index(i, self._pos)
            self._cond.notify_all()

    def _next_job(self, state: dict[str, int]) -> int | None:
        """The next shard for the prefetch thread, ``-1`` to wait, ``None`` when done."""
        if state.get("generation") != self._generation:
            state.update(generation=self._generation, next=self._pos)
        j = max(state["next"], self._pos)
        if j >= len(self._order):
            return None
        if j > self._pos + self.ahead:
            return -1
        state["next"] = j + 1
        return self._order[j]

    def prefetch_one(self, i: int) -> None:
        """Make sure shard ``i`` is in the cache (no checksum pass; that happens on use)."""
        path = self.folder / self.keys[i].name
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        self._download(i)

    def describe(self) -> dict[str, Any]:
        """The folder, the limit and the counters."""
        return {"shard_cache_dir": str(self.folder), "shard_cache_limit": self.limit} | (
            self.stats.as_dict()
        )


def _prefetch_loop(ref: weakref.ref[ShardCache], cond: threading.Condition) -> None:
    """Body of the prefetch thread: holds the cache only weakly between downloads."""
    state: dict[str, int] = {}
    while True:
        with cond:
            cache = ref()
            if cache is None:
                return
            job = cache._next_job(state)
            if job is None:
                cache._thread = None
                return
            if job < 0:
                del cache
                cond.wait(0.5)
                continue
        try:
            cache.prefetch_one(job)
        except Exception:  # noqa: BLE001 - the reader downloads it again and raises the error
            with cache._lock:
                cache.stats.prefetch_errors += 1
        del cache
