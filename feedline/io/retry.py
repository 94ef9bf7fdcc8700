"""Retrying transient storage faults: a policy, an error classifier and the retry loop.

Object stores fail now and then in ways that go away when asked again: timeouts, connection
resets, HTTP 5xx, throttling (``SlowDown``). :class:`RetryPolicy` bounds how often such a
request is sent, then :class:`~feedline.errors.StorageError` names the object, the attempts
and the last error. Permanent errors (not found, permission denied, disk full) are never
retried.

:func:`feedline.io.storage.resolve` applies the policy to every remote filesystem through
:class:`~feedline.io.retrying.RetryingFileSystem`; choose it with the reserved
``storage_options`` key ``"retry"`` (a :class:`RetryPolicy`, a dict of its fields, or an
int: the attempts). Where the backend can retry by itself under that bound (S3: botocore,
see :mod:`feedline.io.s3`) it does, and feedline's own loop (:meth:`RetryPolicy.run`) runs
only where nothing below retries; never both around one request.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, TypeVar

from feedline.errors import ConfigurationError, FeedlineError, StorageError

__all__ = [
    "RetryPolicy",
    "backend_attempts",
    "call_with_timeout",
    "is_transient",
    "precondition_failed",
    "storage_error",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: errno values of faults that may go away on a second try
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ETIMEDOUT",
        "ECONNRESET",
        "ECONNABORTED",
        "ECONNREFUSED",
        "EAGAIN",
        "EWOULDBLOCK",
        "EPIPE",
        "EBUSY",  # s3fs: 503 SlowDown / ServiceUnavailable
        "EREMOTEIO",  # s3fs: 500 InternalError
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "EINTR",
    )
    if hasattr(errno, name)
)
#: errno values of faults that never go away by themselves
PERMANENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOENT", "EACCES", "EPERM", "ENOSPC", "EDQUOT", "EROFS", "EISDIR", "ENOTDIR")
    if hasattr(errno, name)
)
#: error codes (S3 and friends) that mean "try again later"
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "ServerBusy",
        "OperationTimedOut",
        "ConditionalRequestConflict",  # S3 409: a concurrent conditional write; ask again
    }
)
#: exception class names (any module) of transport-level faults
TRANSIENT_NAMES = frozenset(
    {
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "ClientConnectionError",
        "ClientOSError",
        "FSTimeoutError",
        "IncompleteRead",
        "RemoteDisconnected",
    }
)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage faults are retried: one bound on the tries of each request.

    ``attempts`` is the most times one storage request is sent, whichever layer resends it.
    On S3 botocore retries most requests itself, configured with this bound (s3fs's own
    retry loop is turned off), and its backoff applies (standard mode: a random wait of up
    to ``min(20, 2**(k-1))`` s after attempt ``k``). feedline's own loop (:meth:`run`) retries, with
    the backend trying once per attempt, only what nothing below retries: a read that breaks
    off mid-object (re-opened at its position), a whole-object read, a conditional write
    whose response may have been lost, and every call on backends feedline cannot configure.
    There, attempt ``k`` (from 1) that fails transiently waits ``min(max_delay, base_delay *
    2**(k-1))``, shortened by up to ``jitter`` (a fraction) at random, before attempt ``k+1``.
    When the attempts run out the call raises :class:`~feedline.errors.StorageError`.

    Parameters
    ----------
    attempts:
        Tries of one request in all (1 = no retry).
    base_delay, max_delay:
        Seconds of backoff after the first failure, and its cap (feedline's own retries).
    jitter:
        Fraction (0..1) of each delay taken off at random, so many workers do not retry in step.
    timeout:
        Seconds one storage call may take before it counts as a transient failure (``None``:
        wait as long as the backend does; set its own timeouts too, e.g. s3fs
        ``config_kwargs={"read_timeout": 30, "connect_timeout": 10}``). A timed-out call
        is abandoned on a helper thread, so use it as a safety net, not a hot-path tool.

    Examples
    --------
    >>> policy = RetryPolicy(attempts=4, base_delay=0.5, max_delay=2.0, jitter=0.0)
    >>> [policy.delay(k) for k in (1, 2, 3)]
    [0.5, 1.0, 2.0]
    >>> RetryPolicy.from_option({"attempts": 2}).attempts
    2
    """

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0
    jitter: float = 0.5
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy(attempts={self.attempts}) must try at least once. "
                "Fix: pass attempts >= 1 (1 means no retries)."
            )
        if self.base_delay < 0 or self.max_delay < 0 or not 0 <= self.jitter <= 1:
            raise ConfigurationError(
                f"RetryPolicy delays must be >= 0 and jitter within 0..1, got {self!r}. "
                "Fix: pass non-negative base_delay/max_delay and 0 <= jitter <= 1."
            )
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(
                f"RetryPolicy(timeout={self.timeout}) must be positive. "
                "Fix: pass a number of seconds > 0, or None for no per-call timeout."
            )

    @classmethod
    def from_option(cls, value: Any) -> RetryPolicy:
        """A policy from the ``"retry"`` storage option: a policy, a dict, an int or ``None``."""
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, bool):
            return cls() if value else cls(attempts=1)
        if isinstance(value, int):
            return cls(attempts=value)
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigurationError(
                    f"Unknown retry option(s) {unknown}. Fix: use only {sorted(known)}."
                )
            return cls(**value)
        raise ConfigurationError(
            f"storage_options['retry'] must be a RetryPolicy, a dict or an int, got "
            f"{type(value).__name__}. Fix: pass for example fl.RetryPolicy(attempts=5)."
        )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based), jitter not applied."""
        return min(self.max_delay, self.base_delay * 2 ** (attempt - 1))

    def run(
        self,
        call: Callable[[int], T],
        *,
        what: str,
        url: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """Run ``call(attempt)`` until it succeeds, retrying transient errors.

        ``call`` gets the attempt number (1-based) so it can tell a retry (re-open, check
        whether an earlier attempt already took effect). Permanent errors and
        :class:`~feedline.errors.FeedlineError` propagate at once, unchanged.

        Examples
        --------
        >>> tries = []
        >>> def flaky(attempt):
        ...     tries.append(attempt)
        ...     if attempt < 3:
        ...         raise TimeoutError("read timed out")
        ...     return "ok"
        >>> RetryPolicy(base_delay=0).run(flaky, what="read", url="s3://b/k")
        'ok'
        >>> RetryPolicy(attempts=2, base_delay=0).run(flaky, what="read", url="s3://b/k")
        Traceback (most recent call last):
        ...
        feedline.errors.StorageError: Storage call read failed on 's3://b/k' after 2 attempts...
        """
        for attempt in range(1, self.attempts + 1):
            try:
                if self.timeout is None:
                    return call(attempt)
                return call_with_timeout(partial(call, attempt), self.timeout, what, url)
            except Exception as exc:
                if isinstance(exc, FeedlineError) or not is_transient(exc):
                    raise
                if attempt == self.attempts:
                    raise storage_error(what, url, exc, attempts=attempt) from exc
                wait = self.delay(attempt) * (1 - self.jitter * random.random())
                logger.warning(
                    "Storage call %s on %r failed (attempt %d of %d: %s: %s); retrying in "
                    "%.1f s", what, url, attempt, self.attempts, type(exc).__name__, exc, wait,
                )  # fmt: skip
                sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


def call_with_timeout(call: Callable[[], T], timeout: float, what: str, url: str) -> T:
    """``call()`` on a helper thread; a :class:`TimeoutError` when it takes over ``timeout`` s.

    The helper thread is a daemon: a call that never returns does not keep the process
    alive, and its late result is dropped.

    Examples
    --------
    >>> call_with_timeout(lambda: 42, 1.0, "info", "s3://b/k")
    42
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"feedline-storage-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(errno.ETIMEDOUT, f"{what} took longer than {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is a storage fault worth retrying.

    Timeouts, connection errors, HTTP 5xx/429, throttling codes and ``OSError`` with a
    transient errno are; not found, permission, disk full and every other error are not.
    The chain of causes is searched (s3fs wraps botocore errors in ``OSError``).

    Examples
    --------
    >>> import errno
    >>> is_transient(TimeoutError()), is_transient(ConnectionResetError())
    (True, True)
    >>> is_transient(OSError(errno.EBUSY, "SlowDown")), is_transient(OSError(errno.ENOSPC, "full"))
    (True, False)
    >>> is_transient(FileNotFoundError("s3://b/k")), is_transient(PermissionError("403"))
    (False, False)
    """
    for current in _chain(exc):
        verdict = _verdict(current)
        if verdict is not None:
            return verdict
    return False


def _verdict(exc: BaseException) -> bool | None:
    """True/False when ``exc`` alone decides, ``None`` to look at its cause."""
    if isinstance(exc, FeedlineError):
        return False
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return False
    if isinstance(exc, NotADirectoryError | FileExistsError):
        return False
    if _error_code(exc) in TRANSIENT_CODES:
        return True
    status = _http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if type(exc).__name__ in TRANSIENT_NAMES:
        return True
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in TRANSIENT_ERRNOS:
            return True
        if exc.errno in PERMANENT_ERRNOS:
            return False
    return None


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    for name in ("status", "status_code"):
        status = getattr(exc, name, None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
    return None


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (``__cause__``, else ``__context__``), without cycles."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def backend_attempts(exc: BaseException) -> int | None:
    """How many times the storage client sent the request that failed with ``exc``.

    botocore reports its retries in the error's response metadata; ``None`` when no client
    in the chain of causes says.

    Examples
    --------
    >>> class ClientError(Exception):
    ...     response = {"ResponseMetadata": {"HTTPStatusCode": 503, "RetryAttempts": 2}}
    >>> backend_attempts(OSError("wrapped")), backend_attempts(ClientError())
    (None, 3)
    """
    for current in _chain(exc):
        response = getattr(current, "response", None)
        if isinstance(response, Mapping):
            retries = response.get("ResponseMetadata", {}).get("RetryAttempts")
            if isinstance(retries, int) and not isinstance(retries, bool):
                return retries + 1
    return None


def precondition_failed(exc: BaseException) -> bool:
    """True when ``exc`` says a conditional request's condition did not hold (HTTP 412).

    Examples
    --------
    >>> class ClientError(Exception):
    ...     response = {"Error": {"Code": "PreconditionFailed"}, "ResponseMetadata": {}}
    >>> precondition_failed(ClientError()), precondition_failed(OSError("other"))
    (True, False)
    """
    return any(
        _http_status(current) == 412 or _error_code(current) == "PreconditionFailed"
        for current in _chain(exc)
    )


def storage_error(what: str, url: str, exc: BaseException, attempts: int = 1) -> StorageError:
    """A :class:`~feedline.errors.StorageError` for a failed storage call, with a fix.

    Examples
    --------
    >>> import errno
    >>> print(storage_error("write", "s3://b/k", OSError(errno.ENOSPC, "No space left")))
    Storage call write failed on 's3://b/k': [Errno 28] No space left. Fix: free space ...
    """
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    last = f"{type(exc).__name__}: {exc}" if attempts > 1 else str(exc)
    if attempts > 1:
        fix = (
            "the storage kept failing transiently; check the service's health and your "
            "network, or allow more time with storage_options={'retry': "
            "fl.RetryPolicy(attempts=..., max_delay=...)}."
        )
        message = f"Storage call {what} failed on {url!r}{tries}; the last error was {last}."
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        fix = "free space (or raise the quota) where it is written, then run again."
        message = f"Storage call {what} failed on {url!r}: {last}."
    elif isinstance(exc, PermissionError):
        fix = "check the credentials and the permissions on this bucket or folder."
        message = f"Storage call {what} was refused on {url!r}: {last}."
    else:
        fix = "check the path, the credentials and the storage service."
        message = f"Storage call {what} failed on {url!r}: {last}."
    error = StorageError(f"{message} Fix: {fix}")
    error.url, error.attempts, error.last_error = url, attempts, exc
    return error
