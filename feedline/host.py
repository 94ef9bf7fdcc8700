"""What this host offers a process: memory and CPUs, within the limits of its cgroup.

One answer, read where it is needed: the loader's node cache (is a cache file larger than
the page cache can hold?), the loader's default ``memory_budget`` (how much may it hold?) and
the Spark engine's driver (how large a result it may fetch at once). Linux reads the memory
cgroup of this process and of each of its ancestors (v2 ``memory.max`` / ``memory.current``
or v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``, found through
``/proc/self/mountinfo``, so a container's own view and hybrid v1/v2 hosts both work);
elsewhere, or when there is none, the machine's physical (or available) memory is the answer.

:func:`cpus_available` is the CPUs this process may keep busy: those it may run on
(``os.sched_getaffinity``) or its CPU cgroup's quota when that is lower (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the tightest of the group and its ancestors,
rounded up): what the loader's autotuning (:mod:`feedline.loader.profiling.autotune`) and its
diagnosis never go beyond.

Examples
--------
>>> memory_room() > 0
True
>>> 0 <= memory_available() <= memory_room()
True
>>> cpus_available() >= 1
True
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupMemory",
    "cgroup_memory",
    "cpu_quotas",
    "cpus_available",
    "memory_available",
    "memory_room",
]

#: per controller, the file that marks a group with it: (cgroup v2, cgroup v1)
_MARKERS = {
    "memory": ("memory.max", "memory.limit_in_bytes"),
    "cpu": ("cpu.max", "cpu.cfs_quota_us"),
}


@dataclass(frozen=True)
class CgroupMemory:
    """One memory cgroup this process is in (its own or an ancestor).

    ``limit``: its limit in bytes (``None``: unlimited); ``used``: its working set, the
    memory charged to it less the page cache it may drop (inactive file pages).
    """

    path: Path
    limit: int | None
    used: int


def memory_room() -> int:
    """Bytes of memory this process's page cache can use: the machine's physical memory,
    or its memory cgroup's limit when that is lower (cgroup v2 or v1, the tightest of the
    process's cgroup and its ancestors).

    Examples
    --------
    >>> 0 < memory_room() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    True
    """
    room = _physical()
    for group in cgroup_memory():
        if group.limit is not None:
            room = min(room, group.limit)
    return room


def memory_available() -> int:
    """Bytes this process may still allocate: the least of what the machine has available
    (``MemAvailable``) and, for its memory cgroup and each ancestor with a limit, that limit
    less the cgroup's working set (what the other processes of the group, and this one,
    already hold).

    Examples
    --------
    >>> 0 <= memory_available() <= memory_room()
    True
    """
    # each limit less its usage is below the limit itself: one reading of the cgroups serves
    room = min(_meminfo_available(), _physical())
    for group in cgroup_memory():
        if group.limit is not None:
            room = min(room, group.limit - group.used)
    return max(0, room)


def cgroup_memory(proc: str | os.PathLike[str] = "/proc/self") -> list[CgroupMemory]:
    """This process's memory cgroups, its own first then its ancestors (empty off Linux).

    ``proc`` is the ``/proc/<pid>`` folder whose ``cgroup`` and ``mountinfo`` are read.

    Examples
    --------
    >>> all(g.used >= 0 for g in cgroup_memory())
    True
    """
    out = []
    for folder, version in _cgroup_folders(Path(proc)):
        with contextlib.suppress(OSError, ValueError):
            out.append(_read_group(folder, version))
    return out


def cpus_available(proc: str | os.PathLike[str] = "/proc/self") -> int:
    """CPUs this process may keep busy: those it may run on, or fewer when a CPU cgroup
    quota (its own or an ancestor's) allows less (a quota of 1.5 CPUs counts as 2).

    Examples
    --------
    >>> 1 <= cpus_available() <= (os.cpu_count() or 1)
    True
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    for quota in cpu_quotas(proc):
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cpu_quotas(proc: str | os.PathLike[str] = "/proc/self") -> list[float]:
    """The CPU quotas (in CPUs: quota / period) of this process's CPU cgroup and each ancestor
    that has one, its own first (empty off Linux or without a quota).

    Examples
    --------
    >>> all(q > 0 for q in cpu_quotas())
    True
    """
    out = []
    for folder, version in _cgroup_folders(Path(proc), "cpu"):
        with contextlib.suppress(OSError, ValueError, IndexError, ZeroDivisionError):
            if version == 2:
                quota, period = (folder / "cpu.max").read_text().split()[:2]
                if quota != "max":
                    out.append(int(quota) / int(period))
            else:
                quota = (folder / "cpu.cfs_quota_us").read_text().strip()
                if int(quota) > 0:  # -1: no quota
                    period = (folder / "cpu.cfs_period_us").read_text().strip()
                    out.append(int(quota) / int(period))
    return [q for q in out if q > 0]


def _physical() -> int:
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _meminfo_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (physical memory where there is none)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return _physical()


def _read_group(folder: Path, version: int) -> CgroupMemory:
    names = ("memory.max", "memory.current") if version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes"
    )  # fmt: skip
    text = (folder / names[0]).read_text().strip()
    limit = None if text == "max" else int(text)
    if limit is not None and limit >= 1 << 62:  # v1's "unlimited" (PAGE_COUNTER_MAX)
        limit = None
    used = int((folder / names[1]).read_text())
    stats = {}
    with contextlib.suppress(OSError, ValueError):
        for line in (folder / "memory.stat").read_text().splitlines():
            key, value = line.split()
            stats[key] = int(value)
    inactive = stats.get("inactive_file" if version == 2 else "total_inactive_file", 0)
    return CgroupMemory(folder, limit, max(0, used - inactive))


def _cgroup_folders(proc: Path, controller: str = "memory") -> Iterator[tuple[Path, int]]:
    """Folders of this process's cgroup of ``controller`` (``"memory"`` or ``"cpu"``) and its
    ancestors, with the cgroup version."""
    try:
        groups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return
    own = {}
    for line in groups:
        _, controllers, group = line.split(":", 2)
        if controllers == "":
            own[2] = group
        elif controller in controllers.split(","):
            own[1] = group
    for line in mounts:
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        root, point, fstype, options = parts[3], Path(parts[4]), extra[0], extra[2].split(",")
        version = 2 if fstype == "cgroup2" else 1 if controller in options else 0
        if fstype not in ("cgroup", "cgroup2") or version not in own:
            continue
        group = own[version]
        if version == 2 and not (point / "cgroup.controllers").exists():
            continue
        relative = os.path.relpath(group, root) if group.startswith(root) else group
        folder = point / relative.lstrip("/") if relative != "." else point
        if version == 2 and controller not in _controllers(point):
            continue
        marker = _MARKERS[controller][0 if version == 2 else 1]
        while True:  # the group, then each ancestor up to the mount point
            if (folder / marker).exists():
                yield folder, version
            if folder == point or point not in folder.parents:
                break
            folder = folder.parent


def _controllers(point: Path) -> list[str]:
    try:
        return (point / "cgroup.controllers").read_text().split()
    except OSError:
        return []
