"""What a gathered batch becomes for ``format="numpy"`` / ``"torch"`` / ``"tf"``.

The frameworks are imported only when their format is used. Dtypes follow
:mod:`feedline.loader.data.columns` (bool → ``torch.bool``, uint16/uint32 widened for torch, ...).
"""

from __future__ import annotations

import warnings
from typing import Any

from feedline.loader.adapters.tf import to_tf
from feedline.loader.adapters.torch import pin_supported, to_torch

__all__ = ["FORMATS", "can_pin", "to_format"]

FORMATS = ("torch", "numpy", "tf")


def to_format(batch: dict[str, Any], fmt: str) -> dict[str, Any]:
    """``batch`` (arrays and lists) as ``fmt`` values: tensors share the arrays' memory.

    Examples
    --------
    >>> import numpy as np
    >>> to_format({"a": np.zeros(2)}, "numpy")["a"].tolist()
    [0.0, 0.0]
    """
    if fmt == "torch":
        return to_torch(batch)
    if fmt == "tf":
        return to_tf(batch)
    return batch


def can_pin(fmt: str, stacklevel: int = 4) -> bool:
    """True when batches can be pinned; otherwise warn that ``pin_memory`` is ignored.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     can_pin("numpy")
    False
    """

    if fmt == "torch" and pin_supported():
        return True
    msg = "pin_memory=True needs format='torch' and a CUDA device; batches are not pinned."
    warnings.warn(msg, UserWarning, stacklevel=stacklevel)
    return False
