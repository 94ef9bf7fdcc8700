"""Ray's own output during feedline's runs: quiet unless ``fl.config.verbosity`` asks for it.

Ray Data reports every execution on the driver: "Starting execution of Dataset ...", its
execution plan, a progress report every few seconds when standard output is not a terminal
(a progress bar when it is) and "execution finished in ... seconds"; a small write of a
few plans printed 188 such lines. feedline runs many small Ray executions per call (the
schema sample, the write, a split's counts), so while feedline runs Ray (the context
manager :func:`quiet_ray`):

- the datasets feedline builds get ``enable_progress_bars=False`` and
  ``print_on_execution_start=False`` on their own copy of Ray's ``DataContext``
  (:func:`configure_context`; the process-wide context is left alone);
- a filter on the handlers of the ``ray.data`` logger drops Ray Data's records below
  ``WARNING`` (and its notice that progress bars are off) while a feedline run is active;
- a Ray that feedline starts itself logs at ``WARNING`` (``ray.init(logging_level=...)``),
  its workers' output stays in their log files (``log_to_driver=False``).

``fl.config.verbosity = "info"`` (or ``"debug"``) turns all of this off: Ray then prints
what it always prints. Warnings and errors are never hidden.

Examples
--------
>>> import feedline as fl
>>> fl.config.verbosity = None
>>> verbose()
False
>>> with quiet_ray():
...     logging.getLogger("ray.data.x").info("hidden while feedline runs Ray")
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from feedline.settings import config

__all__ = ["configure_context", "quiet_ray", "ray_log_level", "verbose"]

#: Ray Data's one-time notices that progress bars are off (we turned them off)
_NOTICES = ("Progress bars disabled", "Progress bars for operators disabled")
_LOCK = threading.Lock()
_ACTIVE = 0


def verbose() -> bool:
    """Whether ``fl.config.verbosity`` asks for Ray's own progress output (info, debug)."""
    return config.verbosity in ("info", "debug")


def ray_log_level() -> int:
    """The ``logging_level`` of a Ray that feedline starts itself."""
    return logging.INFO if verbose() else logging.WARNING


class _DuringFeedlineRuns(logging.Filter):
    """Drops Ray Data's INFO records (and its progress-bar notices) while feedline runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _ACTIVE or not record.name.startswith("ray.data"):
            return True
        if record.levelno >= logging.WARNING:
            return not str(record.msg).startswith(_NOTICES)
        return False


_FILTER = _DuringFeedlineRuns()


def _install() -> None:
    """Put the filter on every handler of the ``ray.data`` logger (Ray configures them when
    ``ray.data`` is imported; a user may replace them, so this runs on every use)."""
    import ray.data  # noqa: F401 - configures the ray.data logger and its handlers

    for handler in logging.getLogger("ray.data").handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)


@contextmanager
def quiet_ray() -> Iterator[None]:
    """Ray Data's own INFO output hidden while the block runs (unless :func:`verbose`)."""
    global _ACTIVE
    if verbose():
        yield
        return
    _install()
    with _LOCK:
        _ACTIVE += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE -= 1


def configure_context(context: Any) -> None:
    """Turn off progress output on a dataset's own ``DataContext`` (unless :func:`verbose`)."""
    if verbose():
        return
    context.enable_progress_bars = False
    context.enable_operator_progress_bars = False
    context.print_on_execution_start = False
    context.enable_auto_log_stats = False
