"""Sizes written for people: ``512_000_000``, ``"512MB"``, ``"2GiB"``."""

from __future__ import annotations

import re

from feedline.errors import ConfigurationError

__all__ = ["parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def parse_bytes(value: int | str) -> int:
    """Parse a size such as ``512_000_000``, ``"512MB"`` or ``"2GiB"``.

    Examples
    --------
    >>> parse_bytes("1.5GB")
    1500000000
    >>> parse_bytes(1024)
    1024
    """
    if isinstance(value, int):
        size = value
    else:
        match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigurationError(
                f"Cannot read the size {value!r}. Fix: use bytes (an int) or e.g. '512MB', '2GiB'."
            )
        size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < 1:
        raise ConfigurationError(f"The size {value!r} must be positive. Fix: pass e.g. '512MB'.")
    return size
