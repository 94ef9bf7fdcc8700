"""Process-wide settings: ``fl.config.progress``, ``fl.config.verbosity``, ``fl.config.console``.

feedline logs through the standard :mod:`logging` module under the ``feedline`` logger
hierarchy (each module logs to ``logging.getLogger(__name__)``). As the Python logging
HOWTO asks of libraries, the ``feedline`` logger has only a :class:`logging.NullHandler`:
nothing is printed unless the application configures logging, or sets
``fl.config.verbosity``, which attaches one rich handler to the ``feedline`` logger (never
to the root logger) and sets its level. There are no environment-variable switches.

Examples
--------
>>> import feedline as fl
>>> fl.config.progress = False      # never show progress bars (None: auto)
>>> fl.config.verbosity = "info"    # feedline's INFO lines on standard error
>>> fl.config.verbosity = None      # back to silent
>>> fl.config.progress = None
>>> fl.config
Config(progress=None, verbosity=None, console=None)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from feedline.errors import ConfigurationError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["LEVELS", "Config", "config"]

#: the verbosity names and their logging levels
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

_HANDLER_NAME = "feedline-verbosity"
_ROOT = logging.getLogger("feedline")


class Config:
    """feedline's process-wide settings (the one instance is ``fl.config``).

    Attributes
    ----------
    progress:
        ``None`` (default): progress bars on long calls (``Dataset.write``, ``to_arrow``,
        fitting, the loader's cache fill, shard downloads) show when standard error is a
        terminal or in a Jupyter notebook; ``True``/``False``: always / never. A call's own
        ``progress=`` argument wins over this.
    verbosity:
        ``None`` (default): feedline adds no log handler (configure :mod:`logging` as usual;
        records go to the ``feedline`` logger). ``"debug"``, ``"info"``, ``"warning"`` or
        ``"error"``: one rich handler on the ``feedline`` logger at that level.
    console:
        The ``rich.console.Console`` that bars and that handler write to; ``None``: standard
        error. Auto progress follows this console (terminal or notebook) when one is set.

    Examples
    --------
    >>> import feedline as fl
    >>> fl.config.verbosity = "INFO"
    >>> fl.config.verbosity, logging.getLogger("feedline").level == logging.INFO
    ('info', True)
    >>> fl.config.verbosity = None
    >>> fl.config.progress = "yes"  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: fl.config.progress must be True, False or None, ...
    """

    def __init__(self) -> None:
        self._progress: bool | None = None
        self._verbosity: str | None = None
        self._console: Console | None = None

    def __repr__(self) -> str:
        return (
            f"Config(progress={self.progress!r}, verbosity={self.verbosity!r}, "
            f"console={self.console!r})"
        )

    @property
    def progress(self) -> bool | None:
        """Show progress bars: ``True``, ``False`` or ``None`` (auto)."""
        return self._progress

    @progress.setter
    def progress(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, bool):
            raise ConfigurationError(
                f"fl.config.progress must be True, False or None, got {value!r}. "
                "Fix: e.g. fl.config.progress = False."
            )
        self._progress = value

    @property
    def verbosity(self) -> str | None:
        """The level of feedline's own log handler (``None``: no handler)."""
        return self._verbosity

    @verbosity.setter
    def verbosity(self, value: str | None) -> None:
        name = value.lower() if isinstance(value, str) else value
        if name is not None and name not in LEVELS:
            raise ConfigurationError(
                f"fl.config.verbosity must be one of {list(LEVELS)} or None, got {value!r}. "
                'Fix: e.g. fl.config.verbosity = "info".'
            )
        self._verbosity = name
        _attach_handler(name)

    @property
    def console(self) -> Console | None:
        """Where bars and log lines go (``None``: a console on standard error)."""
        return self._console

    @console.setter
    def console(self, value: Console | None) -> None:
        self._console = value
        if self._verbosity is not None:
            _attach_handler(self._verbosity)  # the handler follows the console


def _attach_handler(name: str | None) -> None:
    """Replace feedline's own handler on the ``feedline`` logger (none for ``None``)."""
    for handler in list(_ROOT.handlers):
        if handler.get_name() == _HANDLER_NAME:
            _ROOT.removeHandler(handler)
    if name is None:
        _ROOT.setLevel(logging.NOTSET)
        return
    from rich.logging import RichHandler

    handler = RichHandler(console=console(), show_path=False, rich_tracebacks=False)
    handler.set_name(_HANDLER_NAME)
    _ROOT.addHandler(handler)
    _ROOT.setLevel(LEVELS[name])


#: the process-wide settings
config = Config()
_default_console: Console | None = None


def console() -> Console:
    """Where bars and feedline's log lines go: ``fl.config.console``, else standard error.

    Examples
    --------
    >>> console().stderr
    True
    """
    global _default_console
    if config.console is not None:
        return config.console
    if _default_console is None:
        from rich.console import Console as RichConsole

        _default_console = RichConsole(stderr=True)
    return _default_console
