"""What a cache held in files of fixed-size rows (``cache="node"``, ``cache="staged"``) needs.

Both keep every sample at a fixed offset of a file shared by a node's ranks, guarded by POSIX
file locks: the platform must have them, and every column must be numbers or tensors of a
fixed size (strings and binary values have none).
"""

from __future__ import annotations

import os

from feedline.errors import ConfigurationError
from feedline.loader.data.packed_columns import Packing

__all__ = ["check_file_cache"]


def check_file_cache(packing: Packing, cache: str, needs: str, instead: str) -> None:
    """Refuse ``cache`` where it cannot work: not POSIX (it ``needs`` them), or a column of
    strings or binary values; each message names ``instead``.

    Examples
    --------
    >>> import numpy as np
    >>> from feedline.loader.data.columns import ColumnSpec
    >>> from feedline.loader.data.packed_columns import plan_packing
    >>> spec = ColumnSpec("name", "string", np.dtype(object))
    >>> try:
    ...     check_file_cache(plan_packing([spec]), "node", "POSIX file locks", "cache='memory'")
    ... except ConfigurationError as exc:
    ...     print(str(exc).split(";")[1].split(".")[0])
     columns ['name'] are strings or binary
    """
    if os.name != "posix":
        raise ConfigurationError(
            f"cache={cache!r} needs {needs} (Linux, macOS). Fix: use {instead}."
        )
    unsupported = [c.name for c in packing.singles if c.dtype.hasobject]
    if unsupported:
        raise ConfigurationError(
            f"cache={cache!r} holds fixed-size numbers and tensors; columns {unsupported} are "
            f"strings or binary. Fix: leave them out (columns=[...]) or use {instead}."
        )
