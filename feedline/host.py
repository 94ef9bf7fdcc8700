"""What this host offers a process: memory, within the limits of its cgroup.

One answer, read where it is needed: the loader's node cache (is a cache file larger than
the page cache can hold?) and the Spark engine's driver (how large a result it may fetch at
once). Linux reads the memory cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) of
this process; elsewhere, or when there is none, the machine's physical memory is the answer.

Examples
--------
>>> memory_room() > 0
True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["memory_room"]


def memory_room() -> int:
    """Bytes of memory this process's page cache can use: the machine's physical memory,
    or its memory cgroup's limit when that is lower (cgroup v2 or v1).

    Examples
    --------
    >>> 0 < memory_room() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    True
    """
    room = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit in _cgroup_limits():
        room = min(room, limit)
    return room


def _cgroup_limits() -> Iterator[int]:
    """The memory limits of this process's cgroup (its own line of ``/proc/self/cgroup``)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # cgroup v2
            files = [Path("/sys/fs/cgroup", group.lstrip("/"), "memory.max")]
        elif "memory" in controllers.split(","):  # cgroup v1
            files = [Path("/sys/fs/cgroup/memory", group.lstrip("/"), "memory.limit_in_bytes")]
        else:
            continue
        for file in files:
            with contextlib.suppress(OSError, ValueError):
                text = file.read_text().strip()
                if text != "max":
                    yield int(text)
