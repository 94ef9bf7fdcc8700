"""feedline.host: memory cgroups found through mountinfo (v1, v2, a container's own view),
each ancestor's limit, the working set without the droppable page cache."""

from __future__ import annotations

import os
from pathlib import Path

from feedline.host import (
    CgroupMemory,
    cgroup_memory,
    cpu_quotas,
    cpus_available,
    memory_available,
    memory_room,
)


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_in_a_container_reads_the_group_and_its_ancestors(tmp_path: Path) -> None:
    cg = tmp_path / "cg"  # mounted at the pod's cgroup (a cgroup namespace's view)
    _files(tmp_path / "proc", {
        "cgroup": "0::/kubepods/pod1/c1\n",
        "mountinfo": f"30 20 0:26 /kubepods/pod1 {cg} rw,relatime - cgroup2 cgroup2 rw\n",
    })  # fmt: skip
    _files(cg, {
        "cgroup.controllers": "cpu io memory pids\n",
        "memory.max": "1000000\n", "memory.current": "500000\n",
        "memory.stat": "anon 300000\ninactive_file 100000\n",
        "c1/memory.max": "max\n", "c1/memory.current": "120\n", "c1/memory.stat": "",
    })  # fmt: skip
    assert cgroup_memory(tmp_path / "proc") == [
        CgroupMemory(cg / "c1", None, 120),
        CgroupMemory(cg, 1_000_000, 400_000),  # usage less the inactive page cache
    ]


def test_cgroup_v1_with_the_container_root_mounted(tmp_path: Path) -> None:
    mem = tmp_path / "memory"
    _files(tmp_path / "proc", {
        "cgroup": "5:cpu:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "mountinfo": (
            f"35 31 0:32 /docker/abc {mem} rw,relatime - cgroup cgroup rw,memory\n"
            f"36 31 0:33 /docker/abc {tmp_path}/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        ),
    })  # fmt: skip
    _files(mem, {
        "memory.limit_in_bytes": "629145600\n", "memory.usage_in_bytes": "300000000\n",
        "memory.stat": "total_rss 100000000\ntotal_inactive_file 50000000\n",
    })  # fmt: skip
    assert cgroup_memory(tmp_path / "proc") == [CgroupMemory(mem, 629_145_600, 250_000_000)]
    _files(mem, {"memory.limit_in_bytes": "9223372036854771712\n"})  # v1's unlimited
    assert cgroup_memory(tmp_path / "proc")[0].limit is None


def test_no_cgroup_files_mean_no_limits(tmp_path: Path) -> None:
    assert cgroup_memory(tmp_path / "nothing") == []
    assert 0 <= memory_available() <= memory_room()


def test_cpu_quotas_v2_the_group_and_its_ancestors(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    _files(tmp_path / "proc", {
        "cgroup": "0::/kubepods/pod1/c1\n",
        "mountinfo": f"30 20 0:26 /kubepods/pod1 {cg} rw,relatime - cgroup2 cgroup2 rw\n",
    })  # fmt: skip
    _files(cg, {
        "cgroup.controllers": "cpu io memory pids\n",
        "cpu.max": "150000 100000\n",  # the pod: 1.5 CPUs
        "c1/cpu.max": "max 100000\n",  # the container: no quota of its own
    })  # fmt: skip
    assert cpu_quotas(tmp_path / "proc") == [1.5]
    assert cpus_available(tmp_path / "proc") == min(2, len(os.sched_getaffinity(0)))


def test_cpu_quota_v1_cfs(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu"
    _files(tmp_path / "proc", {
        "cgroup": "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "mountinfo": f"36 31 0:33 /docker/abc {cpu} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n",
    })  # fmt: skip
    _files(cpu, {"cpu.cfs_quota_us": "100000\n", "cpu.cfs_period_us": "100000\n"})
    assert cpu_quotas(tmp_path / "proc") == [1.0]
    assert cpus_available(tmp_path / "proc") == 1
    _files(cpu, {"cpu.cfs_quota_us": "-1\n"})  # no quota
    assert cpu_quotas(tmp_path / "proc") == []
    assert cpus_available(tmp_path / "proc") == len(os.sched_getaffinity(0))
