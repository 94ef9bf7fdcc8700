"""Argument types of the ``feedline`` command, each refusing a bad value with a fix.

A bad argument ends the command with exit status 2 and one line on standard error,
``error: ConfigurationError: <what> Fix: <how>``, the form every feedline error takes.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from feedline.cli.text import print_error
from feedline.errors import ConfigurationError
from feedline.io.csv.options import check_delimiter

__all__ = [
    "HelpFormatter",
    "Parser",
    "column_list",
    "delimiter",
    "image_size",
    "non_negative_float",
    "positive_int",
]


class HelpFormatter(argparse.HelpFormatter):
    """An option's default appended when it has one; a description of several lines (the
    examples) kept as written, one line wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.option_strings
            and "default" not in text
            and not any(action.default is v for v in (None, False, argparse.SUPPRESS))
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors read like a :class:`~feedline.errors.FeedlineError`."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``error: ConfigurationError: ... Fix: ...``; exit with 2."""
        if "Fix:" not in message:
            message = f"{message.rstrip('.')}. Fix: see `{self.prog} --help` for what it takes."
        self.print_usage(sys.stderr)
        print_error("ConfigurationError", message)
        self.exit(2)


def positive_int(text: str) -> int:
    """A whole number of at least 1.

    Examples
    --------
    >>> positive_int("256")
    256
    >>> positive_int("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0' is not a whole number of at least 1. Fix: e.g. 256.
    """
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of at least 1. Fix: e.g. 256."
        )
    return value


def non_negative_float(text: str) -> float:
    """A number of at least 0 (a duration, say).

    Examples
    --------
    >>> non_negative_float("2.5")
    2.5
    >>> non_negative_float("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '-1' is not a number of at least 0. Fix: e.g. 0 or 12.5.
    """
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of at least 0. Fix: e.g. 0 or 12.5."
        )
    return value


def column_list(text: str) -> list[str]:
    """Comma-separated column names.

    Examples
    --------
    >>> column_list("image, label")
    ['image', 'label']
    >>> column_list(" , ")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: ' , ' names no column. Fix: e.g. --columns image,label.
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} names no column. Fix: e.g. --columns image,label."
        )
    return names


#: names for delimiters a shell makes awkward to type
_DELIMITERS = {"\\t": "\t", "tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}


def delimiter(text: str) -> str:
    """One CSV field separator: a character, or ``tab``/``\\t``, ``comma``, ``semicolon``,
    ``pipe``, ``space``.

    Examples
    --------
    >>> delimiter(";"), delimiter("tab"), delimiter("\\\\t")
    (';', '\\t', '\\t')
    >>> delimiter("::")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: delimiter='::' cannot be used to read CSV: ...
    """

    value = _DELIMITERS.get(text.lower(), text)
    try:
        check_delimiter(value)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def image_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (or one number for a square) as ``(height, width)``, the order
    :class:`~feedline.preprocess.DecodeImages` takes.

    Examples
    --------
    >>> image_size("320x240"), image_size("224")
    ((240, 320), (224, 224))
    >>> image_size("320 by 240")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '320 by 240' is not WIDTHxHEIGHT. Fix: e.g. --resize 224x224.
    """
    width, _, height = text.lower().partition("x")
    try:
        w, h = int(width), int(height or width)
    except ValueError:
        w = h = 0
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not WIDTHxHEIGHT. Fix: e.g. --resize 224x224."
        )
    return h, w
