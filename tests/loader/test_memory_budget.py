"""The loader's memory budget (issue 25.3): the default follows the memory the process may
really use (a memory cgroup's limit, not only physical RAM), and the two-level stream's
``shuffle_window`` is held to it, so a stream over data larger than a container's limit is
not OOM-killed.

The cgroup tests create a child memory cgroup (v1, or v2 where its memory controller is
delegated) under this process's own and run a child process inside it; they skip where that
is not possible (not root, no memory controller).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.host import cgroup_memory, memory_available
from feedline.loader.data.memory_budget import DEFAULT_BUDGET, MIN_BUDGET, resolve_budget

REPO = Path(__file__).resolve().parents[2]
MB = 10**6


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A fresh memory cgroup of ``limit`` bytes under this process's own; removed after."""
    own = cgroup_memory()
    if not own:
        pytest.skip("no memory cgroup is readable here")
    parent = own[0].path
    version = 2 if (parent / "memory.max").exists() else 1
    group = parent / f"feedline-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
        (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot create a memory cgroup under {parent}: {exc}")
    try:
        yield group
    finally:
        for _ in range(50):  # the child has exited; its charges move to the parent
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def run_in(group: Path, body: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run python ``body`` in a child process that joins ``group`` before Python starts."""
    command = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    return subprocess.run(
        ["sh", "-c", command, str(group), sys.executable, "-c", textwrap.dedent(body), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
        check=False,
    )


def _oom_kills(group: Path) -> int:
    """OOM kills the kernel counted in ``group`` (v1 memory.oom_control, v2 memory.events)."""
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError):
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def _write(path: Path, rows: int, width: int, group_rows: int, files: int = 1) -> None:
    """``rows`` rows of ``x`` = float32[width] and ``id``, written a row group at a time."""
    path.mkdir(parents=True, exist_ok=True)
    per_file = rows // files
    for f in range(files):
        with pq.ParquetWriter(path / f"part-{f:03d}.parquet", _schema(width)) as writer:
            for start in range(f * per_file, (f + 1) * per_file, group_rows):
                ids = np.arange(start, start + group_rows, dtype=np.int64)
                x = np.repeat(ids.astype(np.float32)[:, None], width, axis=1)
                table = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(x), "id": ids})
                writer.write_table(table, row_group_size=group_rows)


def _schema(width: int) -> pa.Schema:
    tensor = pa.fixed_shape_tensor(pa.float32(), (width,))
    return pa.schema([("x", tensor), ("id", pa.int64())])


# --- the default budget ----------------------------------------------------------------------


def test_default_budget_is_two_gb_or_a_quarter_of_the_available_memory(tmp_path: Path) -> None:
    _write(tmp_path / "d", 100, 4, 50)
    loader = fl.read_parquet(tmp_path / "d").loader(batch_size=10, format="numpy")
    expected = max(MIN_BUDGET, min(DEFAULT_BUDGET, memory_available() // 4))
    assert abs(loader.memory_budget - expected) <= 64 * 2**20  # usage moves a little
    assert fl.read_parquet(tmp_path / "d").loader(memory_budget="1MB").memory_budget == MB
    assert resolve_budget("auto") <= DEFAULT_BUDGET


def test_default_budget_follows_the_memory_cgroup_limit(tmp_path: Path) -> None:
    _write(tmp_path / "d", 100, 4, 50)
    limit = 600 * 2**20
    with memory_cgroup(limit) as group:
        done = run_in(group, """
            import json, sys
            import feedline as fl
            from feedline.host import memory_available, memory_room
            loader = fl.read_parquet(sys.argv[1]).loader(batch_size=10, format="numpy")
            print(json.dumps({"budget": loader.memory_budget, "room": memory_room(),
                              "available": memory_available()}))
        """, str(tmp_path / "d"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["room"] == limit, seen  # the cgroup's limit, not the machine's memory
    assert 0 < seen["available"] < limit, seen  # less what the child already holds
    # a quarter of what the child could still use (read again after: its usage moved a bit)
    assert MIN_BUDGET <= seen["budget"] < limit // 4, seen
    assert abs(seen["budget"] - seen["available"] // 4) < 16 * 2**20, seen


# --- the stream's window ---------------------------------------------------------------------


def test_shuffle_window_over_the_budget_is_lowered_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path / "d", 4000, 1024, 250)  # 16 row groups of 1 MB as loader arrays
    ds = fl.read_parquet(tmp_path / "d")
    kw = {"batch_size": 50, "format": "numpy", "cache": "none", "seed": 3, "prefetch": 0}
    with caplog.at_level(logging.INFO, logger="feedline"):
        loader = ds.loader(**kw, shuffle_window=28, memory_budget="6.5MB")
        stats = loader.stats()
    assert stats["shuffle_window"] == 2  # 6.5 MB / (3 pools x 1.03 MB a group)
    assert "shuffle_window=28" in caplog.text and "the window is 2" in caplog.text
    iterator = iter(loader)
    first = [next(iterator)["id"] for _ in range(3)]
    iterator.close()
    assert loader.stats()["max_pool_rows"] <= 2 * 250
    resumed = ds.loader(**kw, shuffle_window=28, memory_budget="6.5MB")
    resumed.load_state_dict(loader.state_dict())  # the same options restore the checkpoint
    again = ds.loader(**kw, shuffle_window=28, memory_budget="6.5MB")
    want = [b["id"] for b in again][3:]
    got = [b["id"] for b in resumed]
    assert len(got) == len(want) and all((a == b).all() for a, b in zip(got, want, strict=True))
    assert len(first) == 3
    roomy = ds.loader(**kw, shuffle_window=8, memory_budget="1GB")
    assert roomy.stats()["shuffle_window"] == 8  # a window that fits is kept


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stream_over_data_twice_the_cgroup_is_not_oom_killed(tmp_path: Path) -> None:
    # 1.2 GB of 12 KiB rows (100 row groups of 12 MB) read through a 600 MiB cgroup with the
    # default budget and the shuffle_window=28: 28 groups x 3 pools would be 1 GB.
    rows, width, group_rows = 100_000, 3072, 1000
    _write(tmp_path / "d", rows, width, group_rows, files=4)
    with memory_cgroup(600 * 2**20) as group:
        done = run_in(group, """
            import json, sys
            import feedline as fl
            loader = fl.read_parquet(sys.argv[1]).loader(
                batch_size=256, format="numpy", cache="none", shuffle_window=28, seed=1)
            seen = 0
            total = 0
            for batch in loader:
                seen += len(batch["id"])
                total += int(batch["id"].sum())
            stats = loader.stats()
            print(json.dumps({"budget": loader.memory_budget, "seen": seen,
                              "window": stats["shuffle_window"],
                              "max_pool_rows": stats["max_pool_rows"]}))
        """, str(tmp_path / "d"))  # fmt: skip
        kills = _oom_kills(group)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert kills == 0
    seen = json.loads(done.stdout)
    assert seen["seen"] == rows // 256 * 256  # the whole epoch (drop_last)
    assert seen["window"] < 28
    assert seen["max_pool_rows"] * width * 4 * 3 <= seen["budget"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_staged_epochs_over_data_larger_than_the_cgroup_are_not_oom_killed(tmp_path: Path) -> None:
    """Issue 25: cache="staged" holds two buckets (with one rank, an eighth of the default
    budget each, one read twice over, and one being routed to the next epoch), three row
    groups and its bucket files' write buffers (half the budget) at a time, and writes and
    reads its bucket files past the page cache (O_DIRECT); 370 MB of 12 KiB rows staged and
    read through a 300 MiB cgroup, two epochs (the second staged while the first is read), in
    the exact order."""
    rows, width, group_rows = 30_000, 3072, 500
    _write(tmp_path / "d", rows, width, group_rows, files=2)
    with memory_cgroup(300 * 2**20) as group:
        done = run_in(group, """
            import json, sys
            import numpy as np
            import feedline as fl
            ds = fl.read_parquet(sys.argv[1])
            loader = ds.loader(batch_size=256, format="numpy", cache="staged", seed=1,
                               cache_dir=sys.argv[2])
            epochs = []
            for _ in range(2):
                ids = []
                for b in loader:
                    assert (b["x"][:, 0] == b["id"]).all()  # each row's own values
                    ids.append(b["id"])
                epochs.append(np.concatenate(ids).tolist())
            print(json.dumps({"budget": loader.memory_budget, "epochs": epochs,
                              "bucket_rows": loader.stats()["stage_bucket_rows"]}))
        """, str(tmp_path / "d"), str(tmp_path / "cache"))  # fmt: skip
        kills = _oom_kills(group)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert kills == 0
    seen = json.loads(done.stdout)
    assert seen["bucket_rows"] * (width * 4 + 8) <= seen["budget"] // 4
    import feedline as fl
    from feedline.loader.order.stage_routes import stage_plan

    sizes = fl.read_parquet(str(tmp_path / "d")).shard_source().row_group_sizes
    for e in range(2):
        plan = stage_plan(sizes, epoch=e, shuffle=True, seed=1, world_size=1, batch_size=256,
                          drop_last=True, pad_last=False)  # fmt: skip
        assert seen["epochs"][e] == plan.plan(0).tolist()
