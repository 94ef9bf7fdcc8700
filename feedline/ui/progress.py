"""Progress bars for long calls: shown on a terminal or in a notebook, silent otherwise.

Call sites wrap their loop in :func:`bar` and call the ``advance(n)`` it yields::

    with progress.bar("write", total=None, progress=progress) as advance:
        for batch in batches:
            ...
            advance(batch.num_rows)

Whether a bar shows is decided once per call by :func:`enabled`: the call's own
``progress=`` argument, else that of the feedline call it runs in (``write(progress=False)``
also silences the fit it triggers), else ``fl.config.progress``, else *auto* (standard
error is a terminal, or the code runs in a Jupyter notebook). When off, ``advance`` is a no-op
function and nothing is imported or printed. When on, the bar appears only once the call has
run for :data:`DELAY_SECONDS` (short calls never flash a bar), and ``advance`` forwards to
rich at most every :data:`REFRESH_SECONDS` (rich redraws from its own thread), so a hot
loop pays a clock read and an uncontended lock per call. Bars started while another is
showing (a fit inside a write, downloads during a cache fill, other threads) join the same
display. Output goes to ``fl.config.console`` (default: a rich console on standard error);
code that draws its own rich live display around feedline calls passes ``progress=False``
(or, with rich 14.1 or later, sets ``fl.config.console`` to its console: rich nests them).

Examples
--------
>>> from feedline.ui import progress
>>> with progress.bar("count", total=3, progress=False) as advance:
...     for _ in range(3):
...         advance(1)
>>> progress.enabled(False), progress.enabled(True)
(False, True)
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from feedline.settings import config, console

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = [
    "DELAY_SECONDS",
    "REFRESH_SECONDS",
    "also",
    "bar",
    "counting",
    "enabled",
    "interactive",
    "noop",
    "scope",
]

#: a bar shows once its call has run this long (shorter calls print nothing)
DELAY_SECONDS = 0.5
#: ``advance`` forwards the count to rich at most this often (rich redraws on its own thread)
REFRESH_SECONDS = 0.1

T = TypeVar("T")

_lock = threading.Lock()
_display: Progress | None = None  # the live display shared by all bars showing now
_users = 0
#: the ``progress=`` of the enclosing call, inherited by the bars of the calls it makes
_inherited: ContextVar[bool | None] = ContextVar("feedline_progress", default=None)


def noop(n: int) -> None:
    """``advance`` when progress is off (does nothing)."""


def _in_notebook() -> bool:
    """True inside a Jupyter (or Colab) kernel that can draw a live bar (rich needs
    ``ipywidgets`` there, else it warns on every draw); never imports IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = getattr(ipython, "get_ipython", lambda: None)()
    kernel = type(shell).__name__ == "ZMQInteractiveShell" or "google.colab" in sys.modules
    return kernel and importlib.util.find_spec("ipywidgets") is not None


def interactive() -> bool:
    """True when a person is watching: ``fl.config.console`` is a terminal or a notebook, or
    (no console set) standard error is a terminal or this is a Jupyter kernel.

    Examples
    --------
    >>> interactive() in (True, False)  # True in a terminal or notebook
    True
    """

    if config.console is not None:
        return bool(config.console.is_terminal or (config.console.is_jupyter and _in_notebook()))
    try:
        tty = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        tty = False
    return tty or _in_notebook()


def enabled(progress: bool | None = None) -> bool:
    """Whether a call with ``progress=progress`` shows a bar (see the module docstring).

    Examples
    --------
    >>> import feedline as fl
    >>> enabled(None) == (fl.config.progress if fl.config.progress is not None else interactive())
    True
    """
    if progress is None:
        progress = _inherited.get()
    if progress is not None:
        return bool(progress)

    if config.progress is not None:
        return config.progress
    return interactive()


class _Bar:
    """One call's counter; shown on the shared display once :data:`DELAY_SECONDS` passed."""

    def __init__(self, description: str, total: int | None, unit: str, transient: bool) -> None:
        self.description, self.total, self.unit, self.transient = (
            description, total, unit, transient,
        )  # fmt: skip
        self.done = 0
        self.started = self.sent = time.monotonic()
        self.task: TaskID | None = None
        self.display: Progress | None = None
        self.lock = threading.Lock()

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.task is None:
                if now - self.started < DELAY_SECONDS:
                    return
                self._show()
            elif now - self.sent < REFRESH_SECONDS:
                return
            self.sent = now
            assert self.display is not None and self.task is not None
            self.display.update(self.task, completed=self.done)

    def _show(self) -> None:
        global _display, _users
        with _lock:
            if _display is None:
                _display = _new_display()
                _display.start()
            _users += 1
            self.display = _display
            self.task = _display.add_task(
                self.description, total=self.total, completed=self.done, unit=self.unit
            )
            _display.refresh()  # drawn at once, not at the next tick

    def close(self, finished: bool) -> None:
        global _display, _users
        with self.lock:
            if self.task is None or self.display is None:
                return
            if finished:
                total = self.total if self.total is not None else self.done
                self.display.update(self.task, completed=self.done, total=total)
            with _lock:
                _users -= 1
                if self.transient:
                    self.display.remove_task(self.task)
                if not _users:
                    self.display.stop()
                    _display = None


def _new_display() -> Progress:
    """A rich display with a ``done/total unit`` column (sizes for ``unit="bytes"``)."""
    from rich.filesize import decimal
    from rich.progress import (
        BarColumn,
        Progress,
        ProgressColumn,
        SpinnerColumn,
        Task,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class CountColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            unit = task.fields.get("unit", "")
            show = decimal if unit == "bytes" else "{:,}".format
            done = show(int(task.completed))
            total = "" if task.total is None else "/" + show(int(task.total))
            return Text(done + total + ("" if unit == "bytes" else f" {unit}"))

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        CountColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console(),
        refresh_per_second=5,
        redirect_stdout=False,  # bars also run on background threads: leave sys.std* alone
        redirect_stderr=False,
    )


def also(
    advance: Callable[[int], None], callback: Callable[[int], None] | None
) -> Callable[[int], None]:
    """``advance``, also calling the caller's own ``callback(n)`` (e.g. ``on_rows``) when given.

    Examples
    --------
    >>> seen = []
    >>> also(noop, seen.append)(5), seen
    (None, [5])
    """
    if callback is None:
        return advance

    def both(n: int) -> None:
        callback(n)
        advance(n)

    return both


@contextmanager
def bar(
    description: str,
    *,
    total: int | None = None,
    unit: str = "rows",
    progress: bool | None = None,
    transient: bool = False,
) -> Iterator[Callable[[int], None]]:
    """A progress bar around a long call; yields ``advance(n)`` (see the module docstring).

    Parameters
    ----------
    description:
        What the call does (``"write /data/out"``).
    total:
        The count when it is done, if known (else the bar counts up without an end).
    unit:
        What is counted: ``"rows"``, ``"shards"``, ``"bytes"`` (shown as sizes) ...
    progress:
        The call's own setting: ``True``/``False``, or ``None`` for ``fl.config.progress``.
    transient:
        Remove the bar when done (for many short sub-steps, such as shard downloads).

    Examples
    --------
    >>> import io, feedline as fl
    >>> from rich.console import Console
    >>> fl.config.console = Console(file=io.StringIO(), force_terminal=True, width=100)
    >>> with bar("demo", total=3, progress=True) as advance:
    ...     advance(3)  # under DELAY_SECONDS: nothing is drawn
    >>> fl.config.console.file.getvalue()
    ''
    >>> fl.config.console = None
    """
    with scope(progress):
        if not enabled(progress):
            yield noop
            return
        state = _Bar(description, total, unit, transient)
        finished = False
        try:
            yield state.advance
            finished = True
        finally:
            state.close(finished)


@contextmanager
def scope(progress: bool | None) -> Iterator[None]:
    """Make ``progress`` (unless ``None``) the setting of the bars opened inside, in this
    thread and context, without a bar of its own (e.g. a chain's steps fitted one by one).

    Examples
    --------
    >>> with scope(False):
    ...     enabled()
    False
    """
    token = _inherited.set(progress) if progress is not None else None
    try:
        yield
    finally:
        if token is not None:
            _inherited.reset(token)


def counting(
    fn: Callable[[Any], T], advance: Callable[[int], None], engine: object
) -> Callable[[Any], T]:
    """``fn(batch)`` that first advances by ``batch.num_rows``, when ``engine`` runs ``fn`` in
    this process (``None``, ``"local"`` or a local engine); else ``fn`` itself (a bar cannot
    travel to Spark or Ray workers).

    Examples
    --------
    >>> import pyarrow as pa
    >>> seen = []
    >>> counting(len, seen.append, "local")(pa.record_batch({"x": [1, 2]})), seen
    (2, [2])
    >>> counting(len, seen.append, "ray") is len
    True
    """
    local = engine is None or engine == "local" or getattr(engine, "name", None) == "local"
    if advance is noop or not local:
        return fn

    def counted(batch: Any) -> T:
        advance(batch.num_rows)
        return fn(batch)

    return counted
