"""Errors raised in Ray workers, surfaced on the driver as feedline's own errors.

Ray wraps an exception raised in a worker in ``RayTaskError`` (a class deriving from both
``RayTaskError`` and the original type) and Ray Data in ``UserCodeException``; its message
is the whole remote traceback. feedline's stages attach the formatted traceback to the
``FeedlineError`` they raise (:data:`~feedline.engines.ray.stages.REMOTE_TRACEBACK`), and
:func:`surface_errors` re-raises that error itself on the driver, with the worker's
traceback chained as a :class:`RemoteTraceback` (the pattern of
``concurrent.futures.process``).
"""

from __future__ import annotations

import contextlib
import gc
import traceback
from collections.abc import Iterator

from feedline.engines.ray.stages import REMOTE_MESSAGE, REMOTE_TRACEBACK
from feedline.errors import FeedlineError

__all__ = ["RemoteTraceback", "surface_errors"]


class RemoteTraceback(Exception):
    """The traceback of an error raised in a Ray worker, chained as the cause of the error
    re-raised on the driver (its text is the worker's formatted traceback)."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


def _is_ray_error(exc: BaseException) -> bool:
    from ray.exceptions import RayError

    return isinstance(exc, RayError)


def _feedline_error_in(exc: BaseException) -> FeedlineError | None:
    """The original ``FeedlineError`` inside Ray's wrappers (``RayTaskError``, ...), if any."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    dual: FeedlineError | None = None
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, FeedlineError):
            if not _is_ray_error(current):
                return current
            dual = dual or current  # RayTaskError(UserFunctionError): a subclass of both
        pending += [getattr(current, "cause", None), current.__cause__, current.__context__]
    return dual


_FAILED = {"pending": False}


def note_failed_execution() -> None:
    """Remember that a Ray execution failed (see :func:`release_failed_executions`)."""
    _FAILED["pending"] = True


def release_failed_executions() -> None:
    """Collect the garbage a failed execution left, if any, so its actor pool ends.

    A failed Ray Data execution sits in reference cycles (exception, traceback, frames, the
    streaming executor) that keep its actors, and the CPUs they reserve, alive until Python's
    cycle collector runs. A later job that needs those CPUs (another execution, a Ray Train
    worker group) would wait for them, possibly forever on a small machine; the engine calls
    this before each new execution.
    """
    if _FAILED["pending"]:
        _FAILED["pending"] = False
        gc.collect()


@contextlib.contextmanager
def surface_errors() -> Iterator[None]:
    """Re-raise a ``FeedlineError`` raised in a Ray worker as itself on the driver.

    The worker's traceback is chained as a :class:`RemoteTraceback`; Ray's own wrapping
    (``RayTaskError``, ``UserCodeException``) is dropped. Other errors pass unchanged.
    """
    try:
        yield
    except Exception as exc:
        if _is_ray_error(exc):
            note_failed_execution()
            # The failed execution's frames (Ray's block iterator holding the streaming
            # executor) stay referenced by this traceback, and so would keep an actor pool
            # and its CPUs alive until a garbage collection: release their locals now.
            traceback.clear_frames(exc.__traceback__)
        found = _feedline_error_in(exc) if _is_ray_error(exc) else None
        if found is None:
            raise
        text = getattr(found, REMOTE_TRACEBACK, None)
        if _is_ray_error(found):  # only Ray's dual class survived: keep its last line
            last = str(found).strip().splitlines()[-1]
            found = FeedlineError(
                last if "Fix:" in last else f"{last} (Fix: see the worker traceback chained above.)"
            )
        message = getattr(found, REMOTE_MESSAGE, None)
        if message is not None:
            found.args = (message,)
        raise found.with_traceback(None) from (RemoteTraceback(text) if text else None)
