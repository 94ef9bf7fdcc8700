"""Retrying transient storage faults: a policy and the retry loop.

Object stores fail now and then in ways that go away when asked again: timeouts, connection
resets, HTTP 5xx, throttling (``SlowDown``). :class:`RetryPolicy` bounds how often such a
request is sent, then :class:`~feedline.errors.StorageError` names the object, the attempts
and the last error. Permanent errors (not found, permission denied, disk full) are never
retried; :mod:`feedline.io.storage.faults` tells them apart (its functions are re-exported
here).

:func:`feedline.io.storage.paths.resolve` applies the policy to every remote filesystem through
:class:`~feedline.io.storage.retrying_fs.RetryingFileSystem`; choose it with the reserved
``storage_options`` key ``"retry"`` (a :class:`RetryPolicy`, a dict of its fields, or an
int: the attempts). Where the backend can retry by itself under that bound (S3: botocore,
see :mod:`feedline.io.storage.s3`) it does, and feedline's own loop (:meth:`RetryPolicy.run`) runs
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

from feedline.errors import ConfigurationError, FeedlineError
from feedline.io.storage.faults import (
    is_transient,
    storage_error,
)

__all__ = [
    "RetryPolicy",
    "call_with_timeout",
]  # the classifiers are re-exported from feedline.io.storage.faults

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
