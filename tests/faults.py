"""Fault injection for storage tests: a wrapping fsspec filesystem that fails on a schedule.

How to use it (tests import it as ``from faults import ...``: ``tests/`` is on ``sys.path``
because ``tests/conftest.py`` lives there)::

    from faults import Fault, FaultPlan

    plan = FaultPlan([Fault("read", nth=2, error="unavailable", times=3, path="part-00001")])
    url, options = plan.wrap("s3://bucket/ds", s3_bucket.storage_options, retry=FAST_RETRY)
    fl.open(url, storage_options=options).to_arrow()     # feedline sees faulty://bucket/ds
    assert plan.fired                                    # (op, path, error) of each fault fired

``plan.wrap(url, storage_options, retry=None)`` turns any URL or local path into a
``faulty://`` URL over the same objects plus the storage options that reach them;
``retry`` (a :class:`feedline.RetryPolicy`) is put under feedline's ``"retry"`` option.
The filesystem itself is :class:`FaultyFileSystem` (``FaultyFileSystem(target_fs, plan)``
also works to wrap a filesystem you already hold).

A :class:`Fault` fires on the ``nth`` (1-based) call of kind ``op`` whose path contains
``path``, and on the ``times - 1`` matching calls after it (``times=None``: every one from
then on: a permanent fault). Kinds of call (``op``):

========  ================================================================
info      ``info``, ``exists``, ``isdir``, ``isfile``, ``size``
list      ``ls``, ``find``, ``glob``
open      opening a file (read or write)
read      one ``read`` on a file opened for reading
cat       ``cat_file`` (whole-object read)
write     one ``write`` on a file opened for writing
close     closing a file opened for writing (the upload completes)
pipe      ``pipe_file`` (whole-object write), ``put_file``
rm, mv    removing, moving
mkdir     ``makedirs``, ``mkdir``
get       ``get_file`` (download to a local file)
========  ================================================================

What a fault does (``error``): ``"unavailable"`` (503 SlowDown, transient), ``"server_error"``
(500, transient), ``"timeout"``, ``"reset"`` (connection reset, transient), ``"not_found"``
(404), ``"denied"`` (403), ``"disk_full"`` (ENOSPC), ``"truncate"`` (a ``read`` returns half
the bytes asked for and the connection then ends: later reads on that handle return ``b""``),
``"stall"`` (sleeps ``stall_s`` seconds, then the call goes on normally).

``after=True`` raises the error *after* the call took effect (the request succeeded, its
response was lost): for every op but ``open``, ``read`` and ``write``. Retrying such a call
must cope with its first attempt having happened (a moved source is gone, a removed object
is missing).
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

__all__ = ["ERRORS", "OPS", "Fault", "FaultPlan", "FaultyFileSystem"]

OPS = ("info", "list", "open", "read", "cat", "write", "close", "pipe", "rm", "mv", "mkdir", "get")

#: error name -> factory(path) of the exception raised
ERRORS: dict[str, Callable[[str], BaseException]] = {
    "unavailable": lambda p: OSError(errno.EBUSY, f"503 SlowDown (injected) on {p}"),
    "server_error": lambda p: OSError(
        getattr(errno, "EREMOTEIO", errno.EIO), f"500 InternalError (injected) on {p}"
    ),
    "timeout": lambda p: TimeoutError(errno.ETIMEDOUT, f"read timed out (injected) on {p}"),
    "reset": lambda p: ConnectionResetError(errno.ECONNRESET, f"connection reset (injected) {p}"),
    "not_found": lambda p: FileNotFoundError(errno.ENOENT, "404 NoSuchKey (injected)", p),
    "denied": lambda p: PermissionError(errno.EACCES, "403 AccessDenied (injected)", p),
    "disk_full": lambda p: OSError(errno.ENOSPC, "No space left on device (injected)", p),
}
_ACTIONS = ("truncate", "stall")


@dataclass
class Fault:
    """One scheduled fault (see the module docstring)."""

    op: str
    nth: int = 1
    error: str = "unavailable"
    times: int | None = 1
    path: str = ""
    stall_s: float = 5.0
    after: bool = False

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; use one of {OPS}")
        if self.error not in ERRORS and self.error not in _ACTIONS:
            raise ValueError(f"unknown error {self.error!r}; use one of {[*ERRORS, *_ACTIONS]}")
        if self.nth < 1:
            raise ValueError("nth counts from 1")


class FaultPlan:
    """A schedule of faults, shared by every filesystem built from it (thread-safe).

    ``calls[op]`` counts every call of each kind; ``fired`` lists ``(op, path, error)`` for
    each fault that fired, in order.
    """

    def __init__(self, faults: Sequence[Fault] = ()) -> None:
        self.faults = list(faults)
        self._seen = [0] * len(self.faults)
        self.calls: dict[str, int] = dict.fromkeys(OPS, 0)
        self.fired: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def check(self, op: str, path: str, after: bool = False) -> str | None:
        """Count one call; raise its fault, stall, or return ``"truncate"`` (else ``None``).

        Called before each call, and with ``after=True`` once it took effect.
        """
        action = None
        with self._lock:
            if not after:
                self.calls[op] += 1
            for i, fault in enumerate(self.faults):
                if fault.op != op or fault.path not in path or fault.after != after:
                    continue
                self._seen[i] += 1
                last = None if fault.times is None else fault.nth + fault.times - 1
                if self._seen[i] >= fault.nth and (last is None or self._seen[i] <= last):
                    self.fired.append((op, path, fault.error))
                    action = fault
                    break
        if action is None:
            return None
        if action.error == "stall":
            time.sleep(action.stall_s)
            return None
        if action.error == "truncate":
            return "truncate"
        raise ERRORS[action.error](path)

    def wrap(
        self, url: str, storage_options: dict[str, Any] | None = None, retry: Any = None
    ) -> tuple[str, dict[str, Any]]:
        """A ``faulty://`` URL over ``url`` and the storage options feedline needs for it."""
        fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
        text = str(url)
        protocol, _, rest = text.partition("://")
        if not rest:  # a local path
            protocol, rest = "file", text
        options: dict[str, Any] = {
            "target_protocol": protocol,
            "target_options": dict(storage_options or {}),
            "plan": self,
        }
        if retry is not None:
            options["retry"] = retry
        return f"faulty://{rest}", options


class FaultyFileSystem(fsspec.AbstractFileSystem):
    """A filesystem passing every call to ``target`` after asking ``plan`` for a fault."""

    protocol = "faulty"
    cachable = False

    def __init__(
        self,
        target: fsspec.AbstractFileSystem | None = None,
        plan: FaultPlan | None = None,
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if target is None:
            target = fsspec.filesystem(target_protocol or "file", **(target_options or {}))
        self.target = target
        self.plan = plan if plan is not None else FaultPlan()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        if text.startswith("faulty://"):
            text = text[len("faulty://") :]
        return text.rstrip("/") or "/"

    def unstrip_protocol(self, name: str) -> str:
        return name if name.startswith("faulty://") else f"faulty://{name}"

    def _call(self, op: str, name: str, path: Any, *args: Any, **kwargs: Any) -> Any:
        self.plan.check(op, str(path))
        result = getattr(self.target, name)(path, *args, **kwargs)
        self.plan.check(op, str(path), after=True)
        return result

    # metadata
    def info(self, path, **kw):
        return self._call("info", "info", path, **kw)

    def exists(self, path, **kw):
        return self._call("info", "exists", path, **kw)

    def isdir(self, path):
        return self._call("info", "isdir", path)

    def isfile(self, path):
        return self._call("info", "isfile", path)

    def size(self, path):
        return self._call("info", "size", path)

    def ls(self, path, detail=True, **kw):
        return self._call("list", "ls", path, detail=detail, **kw)

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kw):
        return self._call(
            "list", "find", path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kw
        )

    def glob(self, path, maxdepth=None, **kw):
        return self._call("list", "glob", path, maxdepth=maxdepth, **kw)

    # whole objects
    def cat_file(self, path, start=None, end=None, **kw):
        return self._call("cat", "cat_file", path, start=start, end=end, **kw)

    def pipe_file(self, path, value, mode="overwrite", **kw):
        return self._call("pipe", "pipe_file", path, value, mode=mode, **kw)

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kw):
        self.plan.check("pipe", str(rpath))
        self.target.put_file(lpath, rpath, **kw)
        self.plan.check("pipe", str(rpath), after=True)

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kw):
        return self._call("get", "get_file", rpath, lpath, **kw)

    def rm(self, path, recursive=False, maxdepth=None):
        return self._call("rm", "rm", path, recursive=recursive, maxdepth=maxdepth)

    def rm_file(self, path):
        return self._call("rm", "rm_file", path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kw):
        return self._call("mv", "mv", path1, path2, recursive=recursive, maxdepth=maxdepth, **kw)

    def makedirs(self, path, exist_ok=False):
        return self._call("mkdir", "makedirs", path, exist_ok=exist_ok)

    def mkdir(self, path, create_parents=True, **kw):
        return self._call("mkdir", "mkdir", path, create_parents=create_parents, **kw)

    def invalidate_cache(self, path=None):
        self.target.invalidate_cache(path)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kw):
        self.plan.check("open", str(path))
        return FaultyFile(self.target.open(path, mode, **kw), self.plan, str(path), mode)


class FaultyFile:
    """A file of the target filesystem whose reads, writes and close ask the plan first."""

    def __init__(self, raw: Any, plan: FaultPlan, path: str, mode: str) -> None:
        self._raw, self._plan, self.path, self.mode = raw, plan, path, mode
        self._dead = False  # a truncated read ended the "connection"

    def read(self, size: int = -1) -> bytes:
        if self._plan.check("read", self.path) == "truncate":
            data = self._raw.read(size)
            self._dead = True
            return data[: len(data) // 2]
        if self._dead:
            return b""
        return self._raw.read(size)

    def write(self, data: Any) -> int:
        self._plan.check("write", self.path)
        return self._raw.write(data)

    def close(self) -> None:
        writing = "r" not in self.mode and not self._raw.closed
        if writing:
            self._plan.check("close", self.path)
        self._raw.close()
        if writing:
            self._plan.check("close", self.path, after=True)

    def discard(self) -> None:
        """Abandon a file being written (as the retry layer does after a failed upload)."""
        discard = getattr(self._raw, "discard", None)
        if discard is not None:
            discard()
        try:
            self._raw.closed = True
        except AttributeError:  # a local file: close it (the partial file is overwritten)
            self._raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __enter__(self) -> FaultyFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
