"""Telling storage faults apart: worth another try or not, and the error that names them.

:func:`is_transient` decides whether a failed storage call may succeed when asked again
(timeouts, connection resets, HTTP 5xx/429, throttling codes such as ``SlowDown``) or never
will (not found, permission denied, disk full); :func:`backend_attempts` reads how often the
client already sent it, :func:`precondition_failed` spots a failed conditional write, and
:func:`storage_error` words the :class:`~feedline.errors.StorageError` a caller raises.
:class:`feedline.io.storage.retry.RetryPolicy` retries by these verdicts.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

from feedline.errors import FeedlineError, StorageError

__all__ = [
    "PERMANENT_ERRNOS",
    "TRANSIENT_CODES",
    "TRANSIENT_ERRNOS",
    "TRANSIENT_NAMES",
    "backend_attempts",
    "is_transient",
    "precondition_failed",
    "storage_error",
]

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


def _response_field(exc: BaseException, section: str, key: str) -> Any:
    """``exc.response[section][key]`` of a botocore-style error; ``None`` where absent."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        return response.get(section, {}).get(key)
    return None


def _http_status(exc: BaseException) -> int | None:
    status = _response_field(exc, "ResponseMetadata", "HTTPStatusCode")
    if isinstance(status, int):
        return status
    for name in ("status", "status_code"):
        status = getattr(exc, name, None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
    return None


def _error_code(exc: BaseException) -> str | None:
    code = _response_field(exc, "Error", "Code")
    return str(code) if code is not None else None


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
        retries = _response_field(current, "ResponseMetadata", "RetryAttempts")
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
