"""Brace patterns of shard names (``train-{000000..000099}.tar``), counted before expanded.

WebDataset expands shard patterns with the ``braceexpand`` package, which builds every name
of a range before yielding the first (``itertools.product`` materialises its inputs): a
pattern like ``shard-{000000000..999999999}.tar`` would take all memory. feedline first
*counts* the names a pattern expands to, without building them, by walking the pattern with
``braceexpand``'s own grammar (version 0.1.7: ``{a,b}`` alternatives, ``{1..9}`` and
``{a..z}`` ranges with an optional ``..step``, nesting, backslash escapes), and refuses a
pattern over :data:`MAX_SHARD_NAMES` names before any is built.

Examples
--------
>>> count_names("train-{000000..000099}.tar")
100
>>> count_names("{a,b}-{1..3}.tar")
6
>>> expand_urls("data/train-{0..2}.tar")
['data/train-0.tar', 'data/train-1.tar', 'data/train-2.tar']
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Sequence

from feedline.errors import ConfigurationError, MissingDependencyError

__all__ = ["MAX_SHARD_NAMES", "count_names", "expand_urls"]

#: the most shard names the patterns of one reader may expand to
MAX_SHARD_NAMES = 1_000_000

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase


def count_names(pattern: str) -> int:
    """How many names ``braceexpand.braceexpand(pattern)`` yields, computed without them.

    Raises :class:`~feedline.errors.ConfigurationError` for unbalanced braces.

    Examples
    --------
    >>> count_names("shard-{000000000..999999999}.tar")
    1000000000
    >>> count_names("python{2.{5..7},3.{2,3}}")
    5
    """
    try:
        total, depth = _pattern(pattern)
    except (ValueError, RecursionError) as exc:  # int() of a range over 4300 digits, nesting
        raise _bad(pattern, f"it cannot be read ({type(exc).__name__})") from None
    if depth != 0:
        raise _bad(pattern, "its braces are unbalanced")
    return total


def _bad(pattern: str, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"The shard pattern {pattern[:200]!r} is not valid: {why}. Fix: write ranges as "
        "'{000000..000099}' and alternatives as '{a,b}', or escape a literal brace as '\\{'."
    )


def _pattern(pattern: str) -> tuple[int, int]:
    """(names, final brace depth) of ``braceexpand.parse_pattern``, counted."""
    start = pos = depth = 0
    total = 1
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0 and pos > start:
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                expr = pattern[start + 1 : pos]
                count = _expression(expr)
                if count is None:  # braces around no range or list: kept, contents expanded
                    count, inner = _pattern(expr)
                    if inner != 0:
                        return total * count, inner
                total *= count
                start = pos + 1
        pos += 1
    return total, depth


def _expression(expr: str) -> int | None:
    """Names of ``braceexpand.parse_expression`` (``None``: not a range nor a list)."""
    match = _INT_RANGE.match(expr)
    if match:
        first, last, step_text = match.groups()
        step = (int(step_text) or 1) if step_text else 1
        low, high = sorted((int(first), int(last)))
        return (high - low) // step + 1
    match = _CHAR_RANGE.match(expr)
    if match:
        first, last, step_text = match.groups()
        step = (int(step_text) or 1) if step_text else 1
        a, b = _ALPHABET.index(first), _ALPHABET.index(last)
        if a < b:
            return len(_ALPHABET[a : b + 1 : step])
        end = b or -len(_ALPHABET)
        return len(_ALPHABET[a : end - 1 : -step])
    return _sequence(expr)


def _sequence(seq: str) -> int | None:
    """Names of ``braceexpand.parse_sequence``: the sum over its comma-separated parts."""
    start = pos = depth = 0
    parts: list[str] = []
    while pos < len(seq):
        char = seq[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(seq[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not parts:
        return None
    parts.append(seq[start:])
    total = 0
    for part in parts:
        count, inner = _pattern(part)
        if inner != 0:
            raise ValueError("unbalanced braces")
        total += count
    return total


def expand_urls(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    limit: int = MAX_SHARD_NAMES,
) -> list[str]:
    """Brace-expand each URL as WebDataset does (``shard-{000..009}.tar`` → 10 URLs).

    The names are counted first: more than ``limit`` in all raises
    :class:`~feedline.errors.ConfigurationError` before any is built.

    Examples
    --------
    >>> expand_urls(["a.tar", "b-{1,2}.tar"])
    ['a.tar', 'b-1.tar', 'b-2.tar']
    >>> expand_urls("s-{0..9999999}.tar")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: The shard patterns expand to 10,000,000 names...
    """
    items = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    texts = [os.fspath(item) for item in items]
    total = sum(count_names(text) if "{" in text else 1 for text in texts)
    if total > limit:
        shown = ", ".join(repr(t[:120]) for t in texts[:3]) + (", ..." if len(texts) > 3 else "")
        raise ConfigurationError(
            f"The shard patterns expand to {total:,} names ({shown}), more than the "
            f"{limit:,} feedline lists. Fix: narrow the brace ranges to the shards that exist, "
            "or pass the folder or a glob ('train-*.tar') instead."
        )
    out: list[str] = []
    for text in texts:
        if "{" not in text:
            out.append(text)
            continue
        try:
            import braceexpand
        except ImportError as exc:
            raise MissingDependencyError(
                "braceexpand", "webdataset", f"Expanding the shard pattern {text!r}"
            ) from exc
        out.extend(braceexpand.braceexpand(text))
    return out
