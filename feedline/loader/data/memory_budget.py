"""The loader's default ``memory_budget``: from the memory this process may really use.

``memory_budget="auto"`` (the default) is ``min(2 GB, a quarter of what is available)``,
where *available* is :func:`feedline.host.memory_available`: the machine's available memory
and, inside a container or any memory cgroup, the cgroup's limit less what its processes
already hold (cgroup v1 or v2, the tightest ancestor). On a machine with room it is the
2 GB it always was; in a 1.5 GiB container it is a few hundred MB, so the two-level stream's
pools fit instead of being OOM-killed.

Examples
--------
>>> 0 < resolve_budget("auto") <= DEFAULT_BUDGET
True
>>> resolve_budget(10**6)
1000000
"""

from __future__ import annotations

import logging

from feedline.arrow.sizes import parse_bytes
from feedline.host import memory_available

__all__ = ["AVAILABLE_SHARE", "DEFAULT_BUDGET", "MIN_BUDGET", "resolve_budget"]

logger = logging.getLogger(__name__)

#: the default budget where memory is plentiful (the loader's default of earlier releases)
DEFAULT_BUDGET = 2 * 10**9

#: the default budget is at most this share of the memory available to the process
AVAILABLE_SHARE = 4

#: the default budget is never below this (a batch must fit it)
MIN_BUDGET = 16 * 2**20


def resolve_budget(value: int | str) -> int:
    """``memory_budget`` in bytes: ``"auto"`` -> ``min(DEFAULT_BUDGET, available / 4)`` (at
    least :data:`MIN_BUDGET`, logged at INFO when the cgroup or machine lowers it), a size
    (``"512MB"``, an int) as given.

    Examples
    --------
    >>> resolve_budget("1GB")
    1000000000
    """
    if value != "auto":
        return parse_bytes(value)
    available = memory_available()
    budget = max(MIN_BUDGET, min(DEFAULT_BUDGET, available // AVAILABLE_SHARE))
    if budget < DEFAULT_BUDGET:
        logger.info(
            "Loader: memory_budget='auto' is %d bytes: a quarter of the %d bytes this process "
            "may still use (its memory cgroup's limit less its usage, or the machine's "
            "available memory). Pass memory_budget= to choose.", budget, available,
        )  # fmt: skip
    return budget
