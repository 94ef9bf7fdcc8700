"""Storage faults injected by ``faults.FaultPlan`` into read, write and loader paths: every fault
either recovers with exactly the same rows (asserted by ids) or raises a clear FeedlineError
naming the object."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from faults import Fault, FaultPlan, FaultyFileSystem

import feedline as fl
from feedline.io.storage.faults import is_transient
from feedline.io.storage.retrying_fs import RetryingFileSystem

#: retries fast enough for tests (the backoff itself is checked in test_backoff_*)
FAST = fl.RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.002)
N = 600


def _ids(ds: fl.Dataset) -> list[int]:
    return sorted(ds.to_arrow()["id"].to_pylist())


@pytest.fixture
def local_ds(tmp_path: Path) -> Path:
    """A feedline dataset of N rows (ids 0..N-1) in 3 shards of 4 row groups each."""
    path = tmp_path / "ds"
    fl.range(N).write(path, rows_per_shard=200, row_group_rows=50)
    return path


@pytest.fixture
def s3_ds(s3_bucket: Any) -> tuple[str, dict[str, Any]]:
    """The same dataset on the loopback S3 server."""
    url = f"{s3_bucket.url}/ds"
    fl.range(N).write(url, rows_per_shard=200, row_group_rows=50, **_so(s3_bucket))
    return url, s3_bucket.storage_options


def _so(bucket: Any) -> dict[str, Any]:
    return {"storage_options": bucket.storage_options}


# --------------------------------------------------------------------------- the policy itself


def test_transient_and_permanent_errors_are_told_apart() -> None:
    transient = [
        TimeoutError(),
        ConnectionResetError(),
        OSError(errno.EBUSY, "503 SlowDown"),
        OSError(errno.ETIMEDOUT, "timed out"),
        OSError(errno.EAGAIN, "again"),
    ]
    permanent = [
        FileNotFoundError("404"),
        PermissionError("403"),
        OSError(errno.ENOSPC, "full"),
        ValueError("bug"),
        fl.DataError("x. Fix: y"),
    ]
    assert all(is_transient(e) for e in transient)
    assert not any(is_transient(e) for e in permanent)

    class ClientError(Exception):  # the shape of botocore's, without importing it
        def __init__(self, status: int, code: str) -> None:
            self.response = {
                "Error": {"Code": code},
                "ResponseMetadata": {"HTTPStatusCode": status},
            }

    assert is_transient(ClientError(503, "SlowDown")) and is_transient(ClientError(500, "X"))
    assert not is_transient(ClientError(403, "AccessDenied"))
    wrapped = OSError(errno.EIO, "unknown")  # s3fs wraps unknown codes; the cause decides
    wrapped.__cause__ = ClientError(429, "TooManyRequests")
    assert is_transient(wrapped)


def test_backoff_is_exponential_capped_and_bounded() -> None:
    waits: list[float] = []
    policy = fl.RetryPolicy(attempts=5, base_delay=0.1, max_delay=0.3, jitter=0.0)

    def always(attempt: int) -> None:
        raise TimeoutError(f"attempt {attempt}")

    with pytest.raises(fl.StorageError) as info:
        policy.run(always, what="read", url="s3://b/k", sleep=waits.append)
    assert waits == pytest.approx([0.1, 0.2, 0.3, 0.3])
    message = str(info.value)
    assert "s3://b/k" in message and "5 attempts" in message and "attempt 5" in message
    assert "Fix:" in message and info.value.attempts == 5
    assert isinstance(info.value.__cause__, TimeoutError)
    jittered: list[float] = []
    with pytest.raises(fl.StorageError):
        fl.RetryPolicy(attempts=3, base_delay=1.0, jitter=0.5).run(
            always, what="read", url="u", sleep=jittered.append
        )
    assert 0.5 <= jittered[0] <= 1.0 and 1.0 <= jittered[1] <= 2.0


def test_permanent_errors_are_not_retried() -> None:
    calls: list[int] = []

    def denied(attempt: int) -> None:
        calls.append(attempt)
        raise PermissionError("403 AccessDenied")

    with pytest.raises(PermissionError):
        FAST.run(denied, what="info", url="s3://b/k")
    assert calls == [1]


@pytest.mark.parametrize("op", ["mv", "rm", "pipe", "close", "mkdir"])
def test_a_call_that_took_effect_before_failing_is_retried_safely(op: str) -> None:
    memory = fsspec.filesystem("memory")
    root = f"/faults-after-{op}"
    memory.pipe_file(f"{root}/a", b"old")
    plan = FaultPlan([Fault(op, error="unavailable", after=True)])
    fs = RetryingFileSystem(FaultyFileSystem(memory, plan), FAST)
    if op == "mv":
        fs.mv(f"{root}/a", f"{root}/b")
        assert not memory.exists(f"{root}/a") and memory.cat_file(f"{root}/b") == b"old"
    elif op == "rm":
        fs.rm(f"{root}/a")
        assert not memory.exists(f"{root}/a")
    elif op == "pipe":
        fs.pipe_file(f"{root}/a", b"new")
        assert memory.cat_file(f"{root}/a") == b"new"
    elif op == "close":
        with fs.open(f"{root}/a", "wb") as handle:
            handle.write(b"new bytes")
        assert memory.cat_file(f"{root}/a") == b"new bytes"
    else:
        fs.makedirs(f"{root}/d/e", exist_ok=True)
    assert plan.fired == [(op, plan.fired[0][1], "unavailable")]
    if memory.exists(root):
        memory.rm(root, recursive=True)


def test_a_read_file_survives_truncation_and_resets_byte_for_byte() -> None:
    memory = fsspec.filesystem("memory")
    data = b"x" * 150_000 + b"\n" + b"".join(b"line %d\n" % i for i in range(2000))
    memory.pipe_file("/faults-lines/a.txt", data)
    plan = FaultPlan(
        [Fault("read", nth=2, error="truncate", times=3), Fault("read", nth=9, error="reset")]
    )
    fs = RetryingFileSystem(FaultyFileSystem(memory, plan), FAST)
    with fs.open("/faults-lines/a.txt") as handle:
        assert handle.readline() == data[:150_001]  # a line longer than one block
        assert handle.tell() == 150_001
        lines = [handle.readline() for _ in range(2000)]
        assert b"".join(lines) == data[150_001:] and handle.readline() == b""
        assert handle.seek(-7, 2) == len(data) - 7 and handle.read() == data[-7:]
        handle.seek(10)
        assert handle.read(5) == data[10:15]
    assert [f[2] for f in plan.fired] == ["truncate"] * 3 + ["reset"]
    memory.rm("/faults-lines", recursive=True)


def test_exclusive_create_retried_after_it_took_effect_is_not_a_conflict() -> None:
    memory = fsspec.filesystem("memory")
    plan = FaultPlan([Fault("pipe", error="timeout", after=True, path="lock")])
    fs = RetryingFileSystem(FaultyFileSystem(memory, plan), FAST)
    fs.pipe_file("/faults-create/lock", b"writer-1", mode="create")  # made, then "timed out"
    assert memory.cat_file("/faults-create/lock") == b"writer-1" and len(plan.fired) == 1
    with pytest.raises(FileExistsError):  # someone else's object is still a conflict
        fs.pipe_file("/faults-create/lock", b"writer-2", mode="create")
    memory.rm("/faults-create", recursive=True)


def test_an_abandoned_upload_is_never_committed() -> None:
    memory = fsspec.filesystem("memory")
    fs = RetryingFileSystem(memory, FAST)
    handle = fs.open("/faults-abandoned/a.bin", "wb")
    handle.write(b"half a shard")
    del handle  # dropped without close(), as after a crash in the writer
    assert not memory.exists("/faults-abandoned/a.bin")
    with pytest.raises(RuntimeError), fs.open("/faults-abandoned/b.bin", "wb") as handle:
        handle.write(b"partial")
        raise RuntimeError("the writer failed")
    assert not memory.exists("/faults-abandoned/b.bin")


# --------------------------------------------------------------------------- read paths


@pytest.mark.parametrize(
    ("op", "error", "nth"),
    [
        ("open", "unavailable", 2),
        ("read", "unavailable", 2),
        ("read", "timeout", 4),
        ("read", "reset", 5),
        ("read", "server_error", 2),
        ("read", "truncate", 2),
        ("info", "unavailable", 3),
        ("cat", "unavailable", 1),  # the manifest
    ],
)
def test_open_and_read_recover_from_transient_faults(
    local_ds: Path, op: str, error: str, nth: int
) -> None:
    plan = FaultPlan([Fault(op, nth=nth, error=error, times=2)])
    url, options = plan.wrap(local_ds, retry=FAST)
    ds = fl.open(url, storage_options=options, verify=True)
    assert _ids(ds) == list(range(N))
    assert [f[0] for f in plan.fired] == [op, op]  # both faults fired and were survived


def test_listing_a_folder_recovers(local_ds: Path) -> None:
    plan = FaultPlan([Fault("list", error="timeout", times=2), Fault("info", error="reset")])
    url, options = plan.wrap(local_ds, retry=FAST)
    assert _ids(fl.read_parquet(url, storage_options=options)) == list(range(N))
    assert [f[0] for f in plan.fired] == ["info", "list", "list"]


def test_read_parquet_and_csv_recover_over_s3(s3_bucket: Any) -> None:
    fs, root = s3_bucket.fs(), s3_bucket.url[5:]
    body = "id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(N))
    fs.pipe_file(f"{root}/in/a.csv", body.encode())
    plan = FaultPlan(
        [Fault("read", nth=1, error="unavailable", times=2), Fault("info", error="timeout")]
    )
    url, options = plan.wrap(f"{s3_bucket.url}/in/a.csv", s3_bucket.storage_options, FAST)
    assert _ids(fl.read_csv(url, storage_options=options)) == list(range(N))
    assert len(plan.fired) == 3
    fl.read_csv(f"{s3_bucket.url}/in/a.csv", **_so(s3_bucket)).write(
        f"{s3_bucket.url}/pq", rows_per_shard=200, **_so(s3_bucket)
    )
    plan = FaultPlan([Fault("read", nth=3, error="truncate", times=3, path="part-")])
    url, options = plan.wrap(f"{s3_bucket.url}/pq/*.parquet", s3_bucket.storage_options, FAST)
    assert _ids(fl.read_parquet(url, storage_options=options)) == list(range(N))
    assert len(plan.fired) == 3


def test_csv_byte_ranges_over_s3_recover_in_order(s3_bucket: Any) -> None:
    from feedline.io.csv.reader import CsvSource

    body = "id,name\n" + "".join(f"{i},n{i}\n" for i in range(N))
    s3_bucket.fs().pipe_file(f"{s3_bucket.url[5:]}/big.csv", body.encode())
    plan = FaultPlan(
        [Fault("read", nth=3, error="truncate", times=4), Fault("read", nth=20, error="reset")]
    )
    url, options = plan.wrap(f"{s3_bucket.url}/big.csv", s3_bucket.storage_options, FAST)
    source = CsvSource(url, split_bytes=701, storage_options=options)
    assert len(source.read_tasks(None, None)) > 5
    table = fl.Dataset.from_source(source).to_arrow()
    assert table["id"].to_pylist() == list(range(N))
    assert table["name"].to_pylist() == [f"n{i}" for i in range(N)]
    assert len(plan.fired) == 5


def test_open_and_read_over_s3_recover(s3_ds: tuple[str, dict[str, Any]]) -> None:
    url, so = s3_ds
    plan = FaultPlan(
        [
            Fault("cat", error="unavailable", path="_feedline.json"),
            Fault("read", nth=2, error="reset", times=3),
            Fault("open", nth=2, error="server_error"),
        ]
    )
    faulty, options = plan.wrap(url, so, FAST)
    assert _ids(fl.open(faulty, storage_options=options, verify=True)) == list(range(N))
    assert len(plan.fired) == 5


def test_persistent_transient_fault_raises_storage_error_naming_the_object(local_ds: Path) -> None:
    plan = FaultPlan([Fault("read", nth=2, error="unavailable", times=None, path="part-00001")])
    url, options = plan.wrap(local_ds, retry=FAST)
    ds = fl.open(url, storage_options=options)  # read 1: the footer, checked on open
    with pytest.raises(fl.StorageError) as info:
        ds.to_arrow()
    message = str(info.value)
    assert "part-00001" in message and "4 attempts" in message and "Fix:" in message
    assert len(plan.fired) == FAST.attempts  # bounded: tried exactly `attempts` times


@pytest.mark.parametrize(("error", "raised"), [("denied", fl.StorageError), ("not_found", None)])
def test_permanent_read_faults_fail_at_once(local_ds: Path, error: str, raised: Any) -> None:
    plan = FaultPlan([Fault("open", error=error, times=None, path="part-00002")])
    url, options = plan.wrap(local_ds, retry=FAST)
    with pytest.raises(raised or fl.FeedlineError) as info:
        fl.open(url, storage_options=options).to_arrow()
    assert "part-00002" in str(info.value) and "Fix:" in str(info.value)
    assert len(plan.fired) == 1  # not retried


# --------------------------------------------------------------------------- write paths


@pytest.mark.parametrize(
    "faults",
    [
        [Fault("write", nth=2, error="reset", times=2)],
        [Fault("close", nth=2, error="unavailable", times=3)],
        [Fault("pipe", error="server_error", times=2, path="_feedline.json")],  # the commit
        [Fault("mkdir", error="unavailable"), Fault("info", nth=2, error="timeout", times=2)],
    ],
    ids=["write", "upload", "commit", "metadata"],
)
def test_write_recovers_from_transient_faults(s3_bucket: Any, faults: list[Fault]) -> None:
    plan = FaultPlan(faults)
    url, options = plan.wrap(f"{s3_bucket.url}/out", s3_bucket.storage_options, FAST)
    info = fl.range(N).write(url, rows_per_shard=150, storage_options=options)
    assert info.rows == N and len(plan.fired) == sum(f.times for f in faults)
    ds = fl.open(f"{s3_bucket.url}/out", verify=True, **_so(s3_bucket))
    assert _ids(ds) == list(range(N)) and len(ds.manifest.shards) == 4


@pytest.mark.parametrize(
    ("fault", "words", "where"),
    [
        (Fault("close", nth=2, error="denied", times=None), "refused", "part-"),
        (Fault("write", nth=3, error="disk_full", times=None), "free space", "part-"),
        (Fault("close", nth=1, error="unavailable", times=None), "4 attempts", "part-"),
        (Fault("pipe", error="denied", path="_feedline.json"), "refused", "_feedline.json"),
    ],
    ids=["denied", "disk-full", "retries-exhausted", "commit-denied"],
)
def test_failed_write_keeps_the_previous_dataset(
    s3_ds: tuple[str, dict[str, Any]], fault: Fault, words: str, where: str
) -> None:
    url, so = s3_ds
    before = fl.open(url, storage_options=so).manifest
    plan = FaultPlan([fault])
    faulty, options = plan.wrap(url, so, FAST)
    new = fl.from_arrow(pa.table({"id": np.arange(N, N + 500, dtype=np.int64)}))
    with pytest.raises(fl.StorageError) as info:
        new.write(faulty, rows_per_shard=100, storage_options=options)
    message = str(info.value)
    assert words in message and "Fix:" in message and where in message
    after = fl.open(url, storage_options=so, verify=True)
    assert after.manifest == before  # no manifest of the failed write
    assert _ids(after) == list(range(N))
    fl.range(7).write(url, storage_options=so)  # a re-run replaces it
    assert _ids(fl.open(url, storage_options=so, verify=True)) == list(range(7))


def test_disk_full_on_a_local_target_is_a_clear_error(local_ds: Path) -> None:
    plan = FaultPlan([Fault("write", error="disk_full", times=None)])
    url, options = plan.wrap(local_ds, retry=FAST)
    with pytest.raises(fl.StorageError, match=r"No space left.*Fix: free space"):
        fl.range(10).write(url, storage_options=options)
    assert _ids(fl.open(local_ds, verify=True)) == list(range(N))


# --------------------------------------------------------------------------- loader paths


@pytest.mark.parametrize(
    ("cache", "shard_cache"), [("memory", False), ("none", False), ("memory", True)]
)
def test_loader_recovers_and_yields_every_id_once(
    s3_ds: tuple[str, dict[str, Any]], cache: str, shard_cache: bool, tmp_path: Path
) -> None:
    url, so = s3_ds
    plan = FaultPlan(
        [
            Fault("read", nth=2, error="unavailable", times=2),
            Fault("open", nth=3, error="timeout"),
            Fault("read", nth=1, error="truncate", times=1, path="part-00002"),
        ]
    )
    faulty, options = plan.wrap(url, so, FAST)
    kwargs = {"batch_size": 40, "seed": 3, "cache": cache, "format": "numpy"}
    loader = fl.open(faulty, storage_options=options).loader(
        **kwargs, cache_dir=shard_cache and tmp_path
    )
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = np.concatenate([b["id"] for b in loader])
        assert sorted(ids.tolist()) == list(range(N))  # nothing lost, nothing repeated
    assert sorted(f[2] for f in plan.fired) == ["timeout", "truncate", "unavailable", "unavailable"]
    clean = fl.open(url, storage_options=so).loader(**kwargs, cache_dir=False)
    clean.set_epoch(1)
    np.testing.assert_array_equal(ids, np.concatenate([b["id"] for b in clean]))


@pytest.mark.parametrize("shard_cache", [False, True])
def test_loader_with_a_lost_shard_raises_naming_it(
    s3_ds: tuple[str, dict[str, Any]], shard_cache: bool, tmp_path: Path
) -> None:
    url, so = s3_ds
    plan = FaultPlan([Fault("read", nth=2, error="server_error", times=None, path="part-00001")])
    faulty, options = plan.wrap(url, so, FAST)
    loader = fl.open(faulty, storage_options=options).loader(  # read 1: the footer, on open
        batch_size=40, format="numpy", cache_dir=shard_cache and tmp_path
    )
    with pytest.raises(fl.StorageError) as info:
        list(loader)
    assert "part-00001" in str(info.value) and "Fix:" in str(info.value)


# --------------------------------------------------------------------------- stalls


@pytest.mark.timeout(60)
def test_a_stall_past_the_timeout_is_retried(local_ds: Path) -> None:
    policy = fl.RetryPolicy(attempts=3, base_delay=0.001, timeout=0.5)
    plan = FaultPlan([Fault("read", nth=2, error="stall", stall_s=3.0)])
    url, options = plan.wrap(local_ds, retry=policy)
    start = time.monotonic()
    assert _ids(fl.open(url, storage_options=options)) == list(range(N))
    assert plan.fired and time.monotonic() - start < 3.0  # did not wait for the stall


@pytest.mark.timeout(60)
def test_a_permanent_stall_raises_instead_of_hanging(s3_ds: tuple[str, dict[str, Any]]) -> None:
    url, so = s3_ds
    policy = fl.RetryPolicy(attempts=2, base_delay=0.001, timeout=0.3)
    plan = FaultPlan(
        [Fault("read", nth=2, error="stall", times=None, stall_s=2.0, path="part-00000")]
    )
    faulty, options = plan.wrap(url, so, policy)
    loader = fl.open(faulty, storage_options=options).loader(  # read 1: the footer, on open
        batch_size=40, format="numpy", cache_dir=False
    )
    with pytest.raises(fl.StorageError) as info:
        list(loader)
    message = str(info.value)
    assert "part-00000" in message and "longer than 0.3 s" in message and "Fix:" in message
