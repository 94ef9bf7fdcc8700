"""Arrow casts that never change a value silently.

Arrow's safe casts refuse an integer out of range, a truncated float or a lost timestamp
digit, but turn a finite float too large for a narrower float type into an infinity
(``1e40`` as ``float32``, ``70000.0`` as ``float16``, the string ``"1e40"`` as ``float32``).
:func:`overflowed` finds such a value after a cast, so callers refuse it with an error naming
the column.

Examples
--------
>>> import pyarrow as pa
>>> before = pa.array([0.5, 1e40])
>>> overflowed(before, before.cast(pa.float32()))
1e+40
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["overflowed"]

#: a string that spells an infinity (as Arrow parses it into a float)
_INFINITY_TEXT = r"^[+-]?inf(inity)?$"


def overflowed(before: pa.Array, after: pa.Array) -> object | None:
    """A value of ``before`` that its cast ``after`` turned into an infinity (``None`` if none).

    Values that were infinite already (a float ``inf``, the string ``"-inf"``) and NaN stay
    as they are; a finite value too large for the new float type is the one returned. Lists,
    fixed-size lists, structs and extension types are looked into.

    Examples
    --------
    >>> big = pa.array([1.0, float("inf"), 1e40])
    >>> overflowed(big, big.cast(pa.float32()))
    1e+40
    >>> overflowed(big[:2], big[:2].cast(pa.float32())) is None
    True
    """
    if isinstance(before, pa.ExtensionArray):
        before = before.storage
    if isinstance(after, pa.ExtensionArray):
        after = after.storage
    kind, source = after.type, before.type
    if pa.types.is_floating(kind):
        became = pc.fill_null(pc.is_inf(after), False)
        if pa.types.is_floating(source):
            became = pc.and_not(became, pc.fill_null(pc.is_inf(before), False))
        elif pa.types.is_string(source) or pa.types.is_large_string(source):
            text = pc.utf8_lower(pc.utf8_trim_whitespace(before))
            spelled = pc.fill_null(pc.match_substring_regex(text, _INFINITY_TEXT), False)
            became = pc.and_not(became, spelled)
        if not pc.any(became).as_py():
            return None
        return before.filter(became)[0].as_py()
    if _is_list(kind) and _is_list(source):
        return overflowed(before.flatten(), after.flatten())
    if pa.types.is_struct(kind) and pa.types.is_struct(source):
        names = [source.field(i).name for i in range(source.num_fields)]
        parts = dict(zip(names, before.flatten(), strict=True))
        for i, part in enumerate(after.flatten()):
            name = kind.field(i).name
            found = overflowed(parts[name], part) if name in parts else None
            if found is not None:
                return found
    return None


def _is_list(kind: pa.DataType) -> bool:
    return (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )
