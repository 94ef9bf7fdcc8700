"""The loader's ``dtype=`` option: column specs converted to the dtypes asked for.

One dtype applies to every column of its family (floats to floats, integers to integers);
a mapping names columns or stacks. The values are converted once, as the cache fills (see
:mod:`feedline.loader.data.columns` for the Arrow → NumPy mapping itself, which re-exports
:func:`with_dtypes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.errors import ConfigurationError

if TYPE_CHECKING:
    from feedline.loader.data.columns import ColumnSpec

__all__ = ["with_dtypes"]


def _target(key: str, value: Any, torch: bool) -> np.dtype:
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = np.dtype(object)
    if dtype.kind not in "biuf" or (torch and dtype in (np.uint16, np.uint32, np.uint64)):
        raise ConfigurationError(
            f"Loader: dtype {value!r} for {key!r} is not a dtype the loader delivers"
            f"{' as torch tensors' if torch else ''}. Fix: pass a bool, integer or float dtype "
            "such as np.float32 or 'int64'."
        )
    return dtype


def _same_family(a: np.dtype, b: np.dtype) -> bool:
    family = {"b": "b", "i": "i", "u": "i", "f": "f"}
    return family.get(a.kind) == family.get(b.kind)


def with_dtypes(
    specs: Sequence[ColumnSpec],
    dtype: Any,
    stacks: Mapping[str, Sequence[str]] | None = None,
    *,
    torch: bool = False,
) -> tuple[list[ColumnSpec], dict[str, np.dtype]]:
    """``specs`` converted as ``dtype=`` asks, and the dtypes it sets for stacks.

    ``dtype`` is one dtype, applied to every column of its family (a float dtype to the
    floating-point columns, an integer dtype to the integer columns: ``np.float32`` turns
    float64 features into float32 and keeps an int64 label), or a mapping from column or
    stack names to dtypes. A stack takes a single float dtype when its members'
    common dtype is floating. Values are converted once, as the cache fills.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> specs = column_specs(pa.schema({"x": pa.float64(), "y": pa.int64()}))
    >>> [str(s.dtype) for s in with_dtypes(specs, "float32")[0]]
    ['float32', 'int64']
    >>> [str(s.dtype) for s in with_dtypes(specs, {"y": "int32"})[0]]
    ['float64', 'int32']
    """
    if dtype is None:
        return list(specs), {}
    stacks = dict(stacks or {})
    numeric = {s.name for s in specs if s.kind in ("numeric", "tensor")}
    if isinstance(dtype, Mapping):
        unknown = sorted(set(dtype) - numeric - set(stacks))
        if unknown:
            raise ConfigurationError(
                f"Loader: dtype= names {unknown}, which are not numeric loader columns or "
                f"stacks (columns: {sorted(numeric)}, stacks: {sorted(stacks)}). Fix: check "
                "the names."
            )
        wanted = {k: _target(k, v, torch) for k, v in dtype.items()}
        out = [replace(s, dtype=wanted[s.name]) if s.name in wanted else s for s in specs]
        return out, {k: v for k, v in wanted.items() if k in stacks}
    one = _target("every column", dtype, torch)
    out = [
        replace(s, dtype=one) if s.name in numeric and _same_family(s.dtype, one) else s
        for s in specs
    ]
    by_name = {s.name: s for s in out}
    stack_dtypes = {}
    for key, members in stacks.items():
        common = np.result_type(*[by_name[m].dtype for m in members if m in by_name] or [one])
        if common.kind == "f" and one.kind == "f":
            stack_dtypes[key] = one
    return out, stack_dtypes
