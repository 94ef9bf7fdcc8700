"""The commit protocol: old-or-new after a crash anywhere, one writer at a time, stale locks.

Crash tests run a real writer in a child process, pause it at a named step of the commit
(the no-op hook ``feedline.store.commit._reached``, replaced inside the child only) or after
a random delay, SIGKILL it, and check by ids that the folder opens as exactly the old or
exactly the new dataset, and that the next write succeeds and cleans up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
from feedline.io.storage.paths import resolve
from feedline.store import commit as commit_mod
from feedline.store import write_lock as writelock
from feedline.store.commit import STAGING_PREFIX
from feedline.store.manifest import MANIFEST_NAME
from feedline.store.version_files import VERSIONS_DIR
from feedline.store.write_lock import LOCK_NAME

REPO = Path(__file__).resolve().parents[2]
OLD = list(range(0, 500))
NEW = list(range(10_000, 10_600))

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import pyarrow as pa
    import feedline as fl
    from feedline.store import commit
    from feedline.store import shards

    point, count, url, options = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    seen = {}

    def pause(step):
        seen[step] = seen.get(step, 0) + 1
        if step == point and seen[step] == count:
            print("PAUSED", step, flush=True)
            time.sleep(600)

    commit._reached = pause
    close = shards.ShardWriter._close_shard

    def closing(self):
        close(self)
        pause("shard")

    shards.ShardWriter._close_shard = closing

    sleep = float(options.pop("sleep", 0))
    mode = options.pop("mode", "overwrite")
    if mode == "vacuum":
        print("READY", flush=True)
        fl.vacuum(url, keep_versions=1, storage_options=options or None)
        print("DONE", flush=True)
        sys.exit(0)

    def slow(batch):
        time.sleep(sleep)
        return batch

    print("READY", flush=True)
    table = pa.table({"id": pa.array(range(10_000, 10_600), pa.int64())})
    ds = fl.from_arrow(table).map_batches(slow, batch_size=50)
    ds.write(url, mode=mode, rows_per_shard=100, storage_options=options or None)
    print("DONE", flush=True)
    """
)


def _env() -> dict[str, str]:
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def _start(
    url: str,
    point: str,
    count: int = 1,
    options: dict | None = None,
    sleep: float = 0,
    mode: str = "overwrite",
):
    args = [point, str(count), url, json.dumps(dict(options or {}, sleep=sleep, mode=mode))]
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], env=_env(), stdout=subprocess.PIPE, text=True
    )


def _kill_at(
    url: str, point: str, count: int = 1, options: dict | None = None, mode: str = "overwrite"
) -> None:
    """Run the child writer until it pauses at ``point`` (the ``count``-th time), SIGKILL it.

    ``mode``: the write's (``overwrite``, ``append``), or ``vacuum`` to run ``fl.vacuum``."""
    proc = _start(url, point, count, options, mode=mode)
    try:
        assert _read_line(proc, timeout=120) == "READY"
        line = _read_line(proc, timeout=120)
        assert line == f"PAUSED {point}", f"the writer printed {line!r}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert box, f"the writer printed nothing in {timeout} s"
    return box[0].strip()


def _ids(url: str, options: dict | None = None) -> list[int]:
    ds = fl.open(url, storage_options=options, verify=True)
    return sorted(ds.to_arrow()["id"].to_pylist())


def _write_old(url: str, options: dict | None = None) -> None:
    fl.from_arrow(pa.table({"id": OLD})).write(url, rows_per_shard=100, storage_options=options)


def _listing(url: str, options: dict | None = None) -> list[str]:
    loc = resolve(url, options)
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in loc.fs.ls(loc.path, detail=False))


def _assert_clean(url: str, options: dict | None = None) -> None:
    """Only the manifest, the version files and the shards retained versions name are left."""
    names = {MANIFEST_NAME, VERSIONS_DIR}
    for version in fl.history(url, storage_options=options):
        ds = fl.open(url, storage_options=options, version=version.version)
        names.update(s.path for s in ds.manifest.shards)
    assert _listing(url, options) == sorted(names)


def _plant_orphans(folder: str) -> None:
    """Shards of interrupted writes that no version names: a commit's cleanup deletes them."""
    for write_id in ("0123456789ab", "0123456789ac", "0123456789ad"):
        Path(folder, f"part-00000-{write_id}.parquet").write_bytes(b"orphan")


def _every_version_readable(url: str, options: dict | None = None) -> dict[int, list[int]]:
    """The ids of every retained version, each verified against its checksums."""
    found = {}
    for version in fl.history(url, storage_options=options):
        ds = fl.open(url, storage_options=options, verify=True, version=version.version)
        found[version.version] = sorted(ds.to_arrow()["id"].to_pylist())
    return found


# --------------------------------------------------------------------------- crash safety

#: (step, how many times it is passed before the kill, the data the folder must hold after)
KILL_POINTS = [
    pytest.param("shard", 2, OLD, id="after-2-staged-shards"),
    pytest.param("staged", 1, OLD, id="all-staged"),
    pytest.param("moved", 3, OLD, id="3-shards-moved-in"),
    pytest.param("version-staged", 1, OLD, id="version-file-written-not-committed"),
    pytest.param("manifest-staged", 1, OLD, id="manifest-fsynced-not-renamed"),
    pytest.param("committed", 1, NEW, id="committed-before-cleanup"),
    pytest.param("collected", 2, NEW, id="mid-cleanup"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("point", "count", "expected"), KILL_POINTS)
def test_sigkill_at_any_commit_step_leaves_old_or_new(tmp_path, point, count, expected):
    out = str(tmp_path / "out")
    _write_old(out)
    _plant_orphans(out)
    _kill_at(out, point, count)
    assert _ids(out) == expected
    assert (tmp_path / "out" / LOCK_NAME).exists()  # the dead writer's lock is left...
    fl.from_arrow(pa.table({"id": [1, 2, 3]})).write(out)  # ...and broken by the next write
    assert _ids(out) == [1, 2, 3]
    _assert_clean(out)


@pytest.mark.slow
@pytest.mark.parametrize(("point", "count", "expected"), KILL_POINTS)
def test_sigkill_at_any_step_of_an_append_leaves_every_retained_version_readable(
    tmp_path, point, count, expected
):
    out = str(tmp_path / "out")
    _write_old(out)
    fl.from_arrow(pa.table({"id": [-1]})).write(out)  # version 2 replaces OLD: both retained
    _write_old(out)  # version 3: OLD again
    _plant_orphans(out)
    _kill_at(out, point, count, mode="append")
    appended = sorted(OLD + NEW) if expected is NEW else OLD
    versions = _every_version_readable(out)
    assert versions[1] == OLD and versions[2] == [-1] and versions[3] == OLD
    assert versions == ({1: OLD, 2: [-1], 3: OLD} | ({4: appended} if expected is NEW else {}))
    assert _ids(out) == appended
    fl.from_arrow(pa.table({"id": [7]})).write(out, mode="append")  # breaks the dead lock
    assert _ids(out) == sorted([*appended, 7])
    assert [v.operation for v in fl.history(out)][-1] == "append"
    _assert_clean(out)


VACUUM_POINTS = [
    pytest.param("vacuumed-version", 1, id="first-version-file-deleted"),
    pytest.param("vacuumed-version", 2, id="two-version-files-deleted"),
    pytest.param("collected", 1, id="first-file-collected"),
    pytest.param("collected", 3, id="mid-collection"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("point", "count"), VACUUM_POINTS)
def test_sigkill_at_any_step_of_a_vacuum_leaves_every_retained_version_readable(
    tmp_path, point, count
):
    out = str(tmp_path / "out")
    for first in (0, 1000, 2000):  # versions 1-3 replace each other, 4 appends to 3
        fl.from_arrow(pa.table({"id": list(range(first, first + 300))})).write(
            out, rows_per_shard=100
        )
    fl.from_arrow(pa.table({"id": [-5]})).write(out, mode="append")
    (tmp_path / "out" / "part-00000-0123456789ab.parquet").write_bytes(b"orphan")
    before = _every_version_readable(out)
    _kill_at(out, point, count, mode="vacuum")
    after = _every_version_readable(out)  # whatever the vacuum got to, each one still reads
    assert 4 in after and all(after[v] == before[v] for v in after)
    assert after[4] == sorted([-5, *range(2000, 2300)])
    report = fl.vacuum(out, keep_versions=1)  # breaks the dead lock and finishes
    assert report.versions_kept == [4]
    assert _every_version_readable(out) == {4: before[4]}
    _assert_clean(out)


@pytest.mark.slow
def test_sigkill_after_random_delays_leaves_old_or_new(tmp_path):
    out = str(tmp_path / "out")
    _write_old(out)
    rng = random.Random(7)
    for _ in range(3):
        proc = _start(out, "never", sleep=0.05)  # 12 batches: the write takes > 0.6 s
        assert _read_line(proc, timeout=120) == "READY"
        time.sleep(rng.uniform(0.0, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        ids = _ids(out)
        assert ids in (OLD, NEW), ids[:10]
        if ids == NEW:
            _write_old(out)
    fl.from_arrow(pa.table({"id": [5]})).write(out)
    assert _ids(out) == [5]
    _assert_clean(out)


@pytest.mark.slow
def test_killed_first_write_is_incomplete_until_rewritten(tmp_path):
    out = str(tmp_path / "fresh")
    _kill_at(out, "moved", 6)  # every shard moved in, no manifest yet
    with pytest.raises(fl.IncompleteDatasetError, match="Fix:"):
        fl.open(out)
    fl.from_arrow(pa.table({"id": [9]})).write(out)
    assert _ids(out) == [9]
    _assert_clean(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "count", "expected"),
    [
        pytest.param("shard", 2, OLD, id="2-shards-written-in-place"),
        pytest.param("committed", 1, NEW, id="manifest-put-before-cleanup"),
    ],
)
def test_sigkill_on_s3_leaves_old_or_new(s3_bucket, point, count, expected):
    url, options = f"{s3_bucket.url}/ds", s3_bucket.storage_options
    _write_old(url, options)
    _kill_at(url, point, count, options)
    assert _ids(url, options) == expected
    fl.from_arrow(pa.table({"id": [4, 5]})).write(url, storage_options=options)
    assert _ids(url, options) == [4, 5]
    _assert_clean(url, options)


def test_orphans_beside_a_manifest_are_ignored(tmp_path):
    out = tmp_path / "out"
    _write_old(str(out))
    (out / "part-00000-0123456789ab.parquet").write_bytes(b"not even parquet")
    (out / f"{STAGING_PREFIX}0123456789ab").mkdir()
    (out / f"{STAGING_PREFIX}0123456789ab" / "part-00000-0123456789ab.parquet").write_bytes(b"x")
    assert _ids(str(out)) == OLD
    assert fl.open(out).count() == len(OLD)
    fl.from_arrow(pa.table({"id": [1]})).write(out)
    _assert_clean(str(out))


def test_a_folder_with_only_leftovers_is_incomplete(tmp_path):
    for leftover in (f"{STAGING_PREFIX}0123456789ab", LOCK_NAME, "part-00000-0123456789ab.parquet"):
        out = tmp_path / leftover.strip(".")
        out.mkdir()
        if leftover.startswith(STAGING_PREFIX):
            (out / leftover).mkdir()
        else:
            (out / leftover).write_bytes(b"{}")
        with pytest.raises(fl.IncompleteDatasetError, match="interrupted"):
            fl.open(out)


def test_datasets_with_pre_write_id_shard_names_are_replaced_cleanly(tmp_path):
    out = tmp_path / "legacy"
    _write_old(str(out))
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    for index, shard in enumerate(manifest["shards"]):  # rename to the old part-NNNNN.parquet
        (out / shard["path"]).rename(out / f"part-{index:05d}.parquet")
        shard["path"] = f"part-{index:05d}.parquet"
    del manifest["version"]  # written before versions, too: no version entry, no _versions
    shutil.rmtree(out / VERSIONS_DIR)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert _ids(str(out)) == OLD
    fl.from_arrow(pa.table({"id": [1]})).write(out)
    assert _ids(str(out)) == [1]
    assert _every_version_readable(str(out)) == {1: OLD, 2: [1]}  # the old one is version 1
    _assert_clean(str(out))


def test_failed_write_leaves_the_old_dataset_and_no_leftovers(tmp_path):
    out = tmp_path / "out"
    _write_old(str(out))
    before = _listing(str(out))

    with pytest.raises(fl.UserFunctionError):
        fl.range(1000).map_batches(_explode_at_300, batch_size=100).write(out, rows_per_shard=100)
    assert _listing(str(out)) == before
    assert _ids(str(out)) == OLD


def test_a_failure_while_moving_shards_in_rolls_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(str(out))
    before = _listing(str(out))
    moves = []

    def fail_on_third(step):
        if step == "moved":
            moves.append(step)
            if len(moves) == 3:
                raise OSError("disk gone")

    monkeypatch.setattr(commit_mod, "_reached", fail_on_third)
    with pytest.raises(OSError, match="disk gone"):
        fl.from_arrow(pa.table({"id": NEW})).write(out, rows_per_shard=100)
    assert _listing(str(out)) == before  # moved shards, staging and lock removed
    assert _ids(str(out)) == OLD


# --------------------------------------------------------------------------- concurrent writers


def _hold_lock(out: Path, **fields) -> None:
    doc = {
        "write_id": "feedface0000",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "heartbeat": time.time(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps(doc | fields))


def test_a_live_lock_refuses_a_second_writer_and_keeps_the_data(tmp_path):
    out = tmp_path / "out"
    _write_old(str(out))
    _hold_lock(out)  # a writer in this very process: alive
    with pytest.raises(fl.ConcurrentWriteError) as info:
        fl.from_arrow(pa.table({"id": NEW})).write(out)
    message = str(info.value)
    assert "feedface0000" in message and str(os.getpid()) in message and "Fix:" in message
    assert _ids(str(out)) == OLD
    assert json.loads((out / LOCK_NAME).read_text())["write_id"] == "feedface0000"


def test_a_lock_from_another_host_expires_after_its_timeout(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(str(out))
    _hold_lock(out, host="elsewhere.example", pid=1, heartbeat=time.time() - 60)
    with pytest.raises(fl.ConcurrentWriteError, match=r"elsewhere\.example"):
        fl.from_arrow(pa.table({"id": [1]})).write(out)
    monkeypatch.setattr(writelock, "LOCK_TIMEOUT_S", 30.0)  # now 60 s is too old
    fl.from_arrow(pa.table({"id": [1]})).write(out)
    assert _ids(str(out)) == [1]
    assert not (out / LOCK_NAME).exists()


def test_a_lock_of_a_dead_process_on_this_host_is_broken_at_once(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    _hold_lock(out, pid=int(proc.stdout))  # that process has exited
    fl.from_arrow(pa.table({"id": [1]})).write(out)
    assert _ids(str(out)) == [1]


def test_garbage_lock_is_treated_by_its_age(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_bytes(b"\x00garbage")
    with pytest.raises(fl.ConcurrentWriteError):  # fresh: maybe a writer mid-create
        fl.from_arrow(pa.table({"id": [1]})).write(out)
    monkeypatch.setattr(writelock, "LOCK_TIMEOUT_S", -1.0)
    fl.from_arrow(pa.table({"id": [1]})).write(out)
    assert _ids(str(out)) == [1]


def test_a_writer_whose_manifest_changed_underneath_does_not_commit(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_old(str(out))
    sneaky = []

    def another_writer_commits(step):  # the lock was (wrongly) broken and someone committed
        if step == "staged" and not sneaky:
            sneaky.append(1)
            manifest = out / MANIFEST_NAME
            manifest.write_text(manifest.read_text().replace('"created"', '"created" ', 1))

    monkeypatch.setattr(commit_mod, "_reached", another_writer_commits)
    with pytest.raises(fl.ConcurrentWriteError, match="committed by another writer"):
        fl.from_arrow(pa.table({"id": NEW})).write(out)
    assert _ids(str(out)) == OLD
    assert not (out / LOCK_NAME).exists()


def _racing_writes(url: str, options: dict | None, n: int = 4) -> tuple[list, list]:
    barrier = threading.Barrier(n)
    winners, losers = [], []

    def write(k: int) -> None:
        barrier.wait()
        try:
            fl.from_arrow(pa.table({"id": [k] * 50})).write(url, storage_options=options)
            winners.append(k)
        except fl.ConcurrentWriteError as exc:
            losers.append(str(exc))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            losers.append(f"unexpected {exc!r}")

    threads = [threading.Thread(target=write, args=(k,)) for k in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return winners, losers


@pytest.mark.parametrize("where", ["local", "s3"])
def test_concurrent_writers_one_wins_the_others_get_a_clear_error(tmp_path, request, where):
    if where == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        url, options = f"{bucket.url}/ds", bucket.storage_options
    else:
        url, options = str(tmp_path / "ds"), None
    _write_old(url, options)
    for _ in range(3):
        winners, losers = _racing_writes(url, options)
        assert len(winners) + len(losers) == 4 and winners
        assert all("Fix:" in m and "unexpected" not in m for m in losers), losers
        ids = _ids(url, options)
        assert ids in ([k] * 50 for k in winners)  # exactly one winner's data, complete
        _assert_clean(url, options)


def test_replacing_metadata_never_overwrites_a_newer_write(tmp_path):
    out = tmp_path / "out"
    _write_old(str(out))
    opened = fl.open(out).manifest
    updated = dataclasses.replace(opened, statistics={"rows": len(OLD)})
    fl.from_arrow(pa.table({"id": NEW})).write(out)  # committed after the open
    with pytest.raises(fl.ConcurrentWriteError, match="rewritten after it was opened"):
        commit_mod.replace_manifest(resolve(str(out)), opened, updated)
    assert _ids(str(out)) == NEW
    current = fl.open(out).manifest
    commit_mod.replace_manifest(
        resolve(str(out)), current, dataclasses.replace(current, statistics={"n": 1})
    )
    assert fl.open(out).manifest.statistics == {"n": 1}
    assert _ids(str(out)) == NEW
    _assert_clean(str(out))
    _hold_lock(out)
    with pytest.raises(fl.ConcurrentWriteError, match="in progress"):
        commit_mod.replace_manifest(resolve(str(out)), current, current)


def test_a_running_write_keeps_its_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(writelock, "HEARTBEAT_S", 0.05)
    folder = resolve(str(tmp_path))
    lock = writelock.WriterLock(folder, "0123456789ab")
    lock.acquire()
    try:
        first = json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"]
        deadline = time.monotonic() + 10
        while json.loads((tmp_path / LOCK_NAME).read_text() or "{}").get("heartbeat", 0) <= first:
            assert time.monotonic() < deadline, "the heartbeat never moved"
            time.sleep(0.02)
    finally:
        lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("feedline-lock")]


def _explode_at_300(batch):
    if batch["id"][0].as_py() >= 300:
        raise ValueError("boom")
    return batch


def test_on_s3_a_failed_write_removes_its_shards_and_leftovers_are_incomplete(s3_bucket):
    url, options = f"{s3_bucket.url}/ds", s3_bucket.storage_options
    _write_old(url, options)
    before = _listing(url, options)
    failing = fl.range(1000).map_batches(_explode_at_300, batch_size=100)
    with pytest.raises(fl.UserFunctionError):
        failing.write(url, rows_per_shard=100, storage_options=options)
    assert _listing(url, options) == before  # shards written in place were deleted
    assert _ids(url, options) == OLD
    fresh, fs = f"{s3_bucket.url}/fresh", s3_bucket.fs()
    fs.pipe_file(f"{fresh}/part-00000-0123456789ab.parquet", b"half a write")
    with pytest.raises(fl.IncompleteDatasetError, match="interrupted"):
        fl.open(fresh, storage_options=options)


def test_a_lock_create_retried_after_it_took_effect_is_ours(tmp_path):
    folder = resolve(str(tmp_path))
    lock = writelock.WriterLock(folder, "0123456789ab")
    (tmp_path / LOCK_NAME).write_bytes(writelock._lock_text("0123456789ab", time.time()))
    lock.acquire()  # the "first attempt" already created it: no ConcurrentWriteError
    assert lock.held()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_manifest_put_whose_response_is_lost_leaves_a_complete_dataset(s3_bucket):
    from faults import Fault, FaultPlan  # tests/faults.py: the fault-injecting filesystem

    url, options = f"{s3_bucket.url}/ds", s3_bucket.storage_options
    _write_old(url, options)
    # every PUT of the manifest takes effect, then its response is lost (a 500 after the fact)
    plan = FaultPlan(
        [Fault("pipe", error="server_error", after=True, times=None, path=MANIFEST_NAME)]
    )
    retry = fl.RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002)
    faulty, faulty_options = plan.wrap(url, options, retry)
    with pytest.raises(fl.FeedlineError):
        fl.from_arrow(pa.table({"id": NEW})).write(
            faulty, rows_per_shard=100, storage_options=faulty_options
        )
    assert plan.fired
    # the commit did happen: the abort must not have deleted the shards it names
    assert _ids(url, options) == NEW
    fl.from_arrow(pa.table({"id": [3]})).write(url, storage_options=options)
    assert _ids(url, options) == [3]
    _assert_clean(url, options)


# --------------------------------------------------------------------------- conditional S3


def test_on_s3_two_writers_racing_on_a_publish_one_gets_concurrent_write_error(
    s3_bucket, s3_proxy, monkeypatch
):
    """A's manifest PUT is in flight (held by the proxy, after A's last check) while B breaks
    A's lock as stale and commits: A's PUT is conditional on the manifest A started from, so
    it fails instead of silently overwriting B's commit."""
    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    url, options = f"{s3_bucket.url}/ds", s3_bucket.storage_options  # B: straight to the server
    _write_old(url, options)
    held = proxy.add(Rule("PUT", f"/ds/{MANIFEST_NAME}", hold=True, times=1))
    outcome: list[BaseException | None] = []

    def writer_a() -> None:
        try:
            fl.from_arrow(pa.table({"id": [1] * 50})).write(
                url, storage_options=proxied.storage_options
            )
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=writer_a)
    thread.start()
    try:
        assert held.arrived.wait(60), "writer A never reached its manifest PUT"
        monkeypatch.setattr(writelock, "LOCK_TIMEOUT_S", -1.0)  # B judges A's lock stale
        fl.from_arrow(pa.table({"id": [2] * 50})).write(url, storage_options=options)
    finally:
        held.release()
        thread.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], fl.ConcurrentWriteError), outcome
    assert "committed by another writer" in str(outcome[0]) and "Fix:" in str(outcome[0])
    assert _ids(url, options) == [2] * 50  # B's commit stands, complete
    monkeypatch.setattr(writelock, "LOCK_TIMEOUT_S", 120.0)
    _assert_clean(url, options)


def test_on_s3_a_heartbeat_on_a_lock_someone_else_broke_fails_cleanly(
    s3_bucket, s3_proxy, monkeypatch
):
    """The heartbeat's PUT is in flight (after it read the lock as its own) when another
    writer breaks the lock and takes it: the PUT is conditional on the ETag read, so it
    fails; the heartbeat stops, the lock counts as lost, and the other lock is untouched."""
    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    monkeypatch.setattr(writelock, "HEARTBEAT_S", 0.05)
    folder = resolve(f"{s3_bucket.url}/ds", proxied.storage_options)
    lock = writelock.WriterLock(folder, "aaaaaaaaaaaa")
    lock.acquire()
    held = proxy.add(Rule("PUT", f"/ds/{LOCK_NAME}", hold=True, times=1))
    fs, key = s3_bucket.fs(), f"{s3_bucket.url[5:]}/ds/{LOCK_NAME}"
    other = writelock._lock_text("bbbbbbbbbbbb", time.time())
    try:
        assert held.arrived.wait(30), "the heartbeat never wrote"
        fs.rm_file(key)  # another writer breaks the lock...
        fs.pipe_file(key, other)  # ...and takes it
    finally:
        held.release()
    lock._thread.join(30)
    assert not lock._thread.is_alive()  # the heartbeat stopped, nothing raised
    assert fs.cat_file(key) == other  # never overwritten
    assert not lock.held()
    write = commit_mod.PendingWrite(folder)
    write._lock = lock
    with pytest.raises(fl.ConcurrentWriteError, match=r"lost its lock.*Fix:"):
        write.check_unchanged()
    lock.release()
    assert fs.cat_file(key) == other  # a release deletes only its own lock


def test_on_s3_a_release_deletes_only_the_lock_it_read(s3_bucket, s3_proxy):
    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    folder = resolve(f"{s3_bucket.url}/ds", proxied.storage_options)
    fs, key = s3_bucket.fs(), f"{s3_bucket.url[5:]}/ds/{LOCK_NAME}"
    lock = writelock.WriterLock(folder, "aaaaaaaaaaaa")
    lock.acquire()
    held = proxy.add(Rule(("DELETE", "POST"), f"ds/{LOCK_NAME}", hold=True, times=1))
    other = writelock._lock_text("bbbbbbbbbbbb", time.time())
    releasing = threading.Thread(target=lock.release)
    releasing.start()
    try:
        assert held.arrived.wait(30), "the release never deleted"
        fs.pipe_file(key, other)  # taken over after the release read it as its own
    finally:
        held.release()
        releasing.join(30)
    assert fs.cat_file(key) == other


def test_on_s3_breaking_a_stale_lock_deletes_only_the_lock_judged_stale(
    s3_bucket, s3_proxy, monkeypatch
):
    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    folder = resolve(f"{s3_bucket.url}/ds", proxied.storage_options)
    fs, key = s3_bucket.fs(), f"{s3_bucket.url[5:]}/ds/{LOCK_NAME}"
    abandoned = {"write_id": "aaaaaaaaaaaa", "host": "elsewhere", "heartbeat": time.time() - 3600}
    fs.pipe_file(key, json.dumps(abandoned).encode())
    monkeypatch.setattr(writelock, "LOCK_TIMEOUT_S", 60.0)
    held = proxy.add(Rule(("DELETE", "POST"), f"ds/{LOCK_NAME}", hold=True, times=1))
    breaker = writelock.WriterLock(folder, "bbbbbbbbbbbb")
    outcome: list[BaseException | None] = []

    def acquire() -> None:
        try:
            breaker.acquire()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=acquire)
    thread.start()
    fresh = writelock._lock_text("cccccccccccc", time.time())
    try:
        assert held.arrived.wait(30), "the stale lock was never deleted"
        fs.pipe_file(key, fresh)  # a third writer broke it first and holds it now
    finally:
        held.release()
        thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], fl.ConcurrentWriteError), outcome
    assert fs.cat_file(key) == fresh  # the live lock survived
    breaker.release()


@pytest.mark.parametrize("key", [LOCK_NAME, MANIFEST_NAME])
def test_on_s3_a_conditional_put_whose_response_is_lost_is_recognised_as_done(
    s3_bucket, s3_proxy, key
):
    """The lock's create (If-None-Match) or the manifest's PUT (If-Match) takes effect but
    its response is lost (a 500); the retry's condition then fails, and reading the object
    back shows it was this write's own request, so the write goes on and commits."""
    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    url, options = f"{s3_bucket.url}/ds", s3_bucket.storage_options
    _write_old(url, options)
    proxy.add(Rule("PUT", f"/ds/{key}", status=500, code="InternalError", after=True, times=1))
    retry = fl.RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)
    table = pa.table({"id": NEW})
    fl.from_arrow(table).write(url, rows_per_shard=100, storage_options={
        **proxied.storage_options, "retry": retry})  # fmt: skip
    assert proxy.count("PUT", f"/ds/{key}") >= 2  # the lost one, and the retry
    assert _ids(url, options) == NEW
    _assert_clean(url, options)
