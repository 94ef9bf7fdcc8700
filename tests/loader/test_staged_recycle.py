"""cache="staged" on one rank: each epoch after the first staged from the epoch before's
buckets as they are read (no dataset pass), and every way that can stop half-way."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from staged_batches import batches, same, staged_options

from feedline.loader.data.staging import exchange as stage_exchange
from feedline.loader.data.staging import recycle, stager
from feedline.loader.order import sample_order


def _sources(loader):
    return [e["stage_source"] for e in loader.stats()["staged_epochs"]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize(("drop_last", "pad_last", "shuffle"),
                         [(True, False, True), (False, True, True), (False, False, True),
                          (False, False, False)])  # fmt: skip
def test_later_epochs_are_staged_from_the_epoch_before_and_equal_memory_batches(
    write, tmp_path, seed, drop_last, pad_last, shuffle
):
    """Five epochs, every column compared with cache="memory": epoch 0 from the dataset, each
    later one from the epoch before's buckets (no row read from the dataset), whatever the
    plan leaves out (drop_last's remainder: 301 rows, batches of 8) or repeats (padding)."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    common = {"seed": seed, "drop_last": drop_last, "pad_last": pad_last, "shuffle": shuffle}
    staged = ds.loader(cache="staged", **staged_options(tmp_path, **common))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
    for _ in range(5):
        same(batches(staged), batches(memory))
    assert staged._prepare().source.join(60)
    epochs = staged.stats()["staged_epochs"]
    assert [e["stage_source"] for e in epochs] == ["dataset"] + ["epoch before"] * 5
    assert [e["stage_rows_read"] for e in epochs] == [301] + [0] * 5
    assert staged.state_dict() == memory.state_dict()


@pytest.mark.timeout(120)
def test_a_lazy_order_is_recycled_too(write, tmp_path, monkeypatch):
    """Over LAZY_ROWS rows (100 here: a lazy permutation) the epochs after the first still
    come from the epoch before and equal cache="memory"'s."""
    monkeypatch.setattr(sample_order, "LAZY_ROWS", 100)
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=2))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=2)
    for _ in range(3):
        same(batches(staged), batches(memory))
    assert _sources(staged)[:3] == ["dataset", "epoch before", "epoch before"]


@pytest.mark.timeout(120)
def test_an_epoch_left_half_way_stages_the_next_from_the_dataset(write, tmp_path):
    """The loop reads 3 batches of epoch 0, then set_epoch(1): epoch 1 was never fully
    routed, so it is staged from the dataset, and its batches are cache="memory"'s; epoch 2
    comes from epoch 1's buckets again. (The bucket is 37 rows; prefetch=0 so that the 3
    batches do not read the epoch's buckets ahead.)"""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=4, prefetch=0))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=4)
    same(batches(staged, 3), batches(memory, 3))
    staged.set_epoch(1)
    memory.set_epoch(1)
    same(batches(staged), batches(memory))  # epoch 1, whole
    same(batches(staged), batches(memory))  # epoch 2, from epoch 1's buckets
    assert staged._prepare().source.join(60)
    assert _sources(staged)[:3] == ["dataset", "dataset", "epoch before"], _sources(staged)


@pytest.mark.timeout(120)
def test_a_resume_mid_epoch_beside_the_abandoned_loader_is_exact(write, tmp_path):
    """A state taken mid-epoch 1 resumes in a new loader on the same folder while the old
    loader (not closed) still stages epoch 2 from epoch 1's buckets it will never read: the
    new one does not wait for it, stages epoch 2 from the dataset, and stays exact."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    old = ds.loader(cache="staged", **staged_options(tmp_path, seed=6))
    batches(old)
    head = batches(old, 5)
    state = old.state_dict()
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=6)
    batches(memory)
    whole = batches(memory)
    resumed = ds.loader(cache="staged", **staged_options(tmp_path))
    resumed.load_state_dict(state)
    same(head + batches(resumed), whole)
    same(batches(resumed), batches(memory))  # epoch 2
    same(batches(resumed), batches(memory))  # epoch 3, from epoch 2's buckets
    sources = _sources(resumed)
    assert sources[1] == "dataset" and sources[2] == "epoch before", sources
    old.close()


@pytest.mark.timeout(120)
def test_a_loader_closed_mid_epoch_drops_the_epoch_being_recycled(write, tmp_path):
    """close() mid-epoch aborts the epoch staged from it: no marker, no files left aside;
    iterating again stages what it needs and stays exact."""
    ds = write(1000, rows_per_shard=250, row_group_rows=23)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=8, prefetch=0))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=8)
    same(batches(staged, 3), batches(memory, 3))
    staged.close()
    assert staged._prepare().source.join(30)
    exchange = tmp_path / "cache" / "staged" / "exchange"
    assert not list(exchange.rglob("*.aside.*"))  # the rows routed so far, dropped
    assert not [m for m in exchange.rglob("from0.done") if "/e1/" in m.as_posix()]
    same(batches(staged), batches(memory))  # epoch 1 (the loop resumes at the next one)
    same(batches(staged), batches(memory))


@pytest.mark.timeout(120)
def test_a_failing_router_falls_back_to_the_dataset(write, tmp_path, monkeypatch, caplog):
    """A routing error (a disk full, say) aborts the recycled epoch with a warning; the
    epoch is staged from the dataset and the batches are unchanged."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)

    def broken(self, ids, rows):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recycle.Recycler, "_route", broken)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=1))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=1)
    with caplog.at_level("WARNING"):
        for _ in range(3):
            same(batches(staged), batches(memory))
    assert _sources(staged)[:3] == ["dataset"] * 3
    assert "staged from the dataset" in caplog.text


@pytest.mark.timeout(120)
def test_a_recycled_epoch_commits_with_its_own_bucket_size(write, tmp_path, monkeypatch):
    """Another loader on the same folder (another memory_budget) that published its bucket
    size for the epoch being recycled, then stopped before committing (cancelled), does not
    leave its size on the epoch this loader commits: the epoch is read as it was cut."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=2))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=2)
    source = staged._prepare().source
    commit = recycle.Recycler._commit

    def another_loader_published_first(self):
        plan = source.planner(self.epoch)
        source.exchange.publish(plan.key, self.epoch, {"bucket_rows": 53})
        commit(self)

    monkeypatch.setattr(recycle.Recycler, "_commit", another_loader_published_first)
    for _ in range(3):
        same(batches(staged), batches(memory))
    assert _sources(staged)[1:3] == ["epoch before", "epoch before"]


def test_starting_to_recycle_an_epoch_publishes_no_bucket_size(write, tmp_path, monkeypatch):
    """A loader staging the next epoch from the dataset on the same folder publishes its
    bucket size and sends by it under the epoch's lock; this loader's recycler, started
    without that lock, must not replace it (it publishes its own when it commits)."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=2))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=2)
    source = staged._prepare().source
    source.planner = staged._stage_plan
    nxt = source.planner(1)
    source.exchange.publish(nxt.key, 1, {"bucket_rows": 53})  # the other loader's
    seen = []
    prepare = recycle.Recycler.prepare

    def watched(self, *args, **kwargs):
        seen.append(source.exchange.layout(nxt.key, 1, 0, timeout=None))
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(recycle.Recycler, "prepare", watched)
    for _ in range(2):
        same(batches(staged), batches(memory))
    assert seen[0] == {"bucket_rows": 53}


def test_an_inbox_of_the_older_format_is_staged_again(write, tmp_path):
    """A complete inbox whose marker names no bucket-file format (an earlier feedline's)
    is dropped and staged again, not misread."""
    ds = write(120, row_group_rows=20)
    first = ds.loader(cache="staged", **staged_options(tmp_path, seed=3))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=3)
    expected = batches(memory)
    same(batches(first), expected)
    first.close()
    markers = [m for m in (tmp_path / "cache").rglob("from0.done") if "/e0/" in m.as_posix()]
    assert markers
    for marker in markers:
        doc = json.loads(marker.read_text())
        del doc["format"]
        marker.write_text(json.dumps(doc))
    again = ds.loader(cache="staged", **staged_options(tmp_path, seed=3))
    same(batches(again), expected)
    assert again.stats()["staged_epochs"][0]["staged_here"] is True  # staged again


def test_a_bucket_file_of_broken_rows_is_refused_before_use(tmp_path):
    """A file whose size is not whole rows of the layout is an IntegrityError."""
    from feedline.errors import IntegrityError

    path = tmp_path / "r0.b0"
    path.write_bytes(bytes(20))
    arrays = [("x", np.dtype("<f4"), (1,))]  # rows of 16 bytes
    with pytest.raises(IntegrityError, match="whole rows"):
        stage_exchange._read_table(path, arrays, 20, 0)


def test_pack_rows_round_trips_through_a_bucket_file(tmp_path):
    """Rows of mixed dtypes and shapes packed, written, read back: the same values, every
    part aligned."""
    rows = {"a": np.arange(12, dtype="<f8").reshape(4, 3), "b": np.array([1, 0, 1, 1], "?"),
            "c": np.arange(8, dtype="<i2").reshape(4, 2)}  # fmt: skip
    arrays = [(k, v.dtype, v.shape[1:]) for k, v in rows.items()]
    ex = stage_exchange.StorageExchange(tmp_path, "k", node=0, nodes=1)
    out = ex.send("p", 0, 0)
    out.write(0, 0, stage_exchange.pack_rows(np.array([3, 1]), rows, np.array([2, 0])))
    out.commit()
    ex.wait("p", 0, timeout=5)
    [table] = list(ex.tables("p", 0, 0, 0, arrays))
    positions, got = stage_exchange.split_rows(table, arrays)
    assert positions.tolist() == [3, 1]
    for key, values in rows.items():
        np.testing.assert_array_equal(got[key], values[[2, 0]])


def test_recycling_needs_one_rank_on_one_node(write, tmp_path):
    """Two ranks: each stages from the dataset (a rank reads only its own rows)."""
    ds = write(120, row_group_rows=20)
    for rank in range(2):
        loader = ds.loader(
            cache="staged", **staged_options(tmp_path, seed=1, world_size=2, rank=rank)
        )
        batches(loader)
        batches(loader)
        assert loader._prepare().source.join(30)
        assert set(_sources(loader)) == {"dataset"}


@pytest.mark.timeout(120)
def test_recycling_can_be_turned_off(write, tmp_path, monkeypatch):
    monkeypatch.setattr(stager, "RECYCLE", False)
    ds = write(120, row_group_rows=20)
    loader = ds.loader(cache="staged", **staged_options(tmp_path, seed=1))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=1)
    for _ in range(3):
        same(batches(loader), batches(memory))
    assert set(_sources(loader)) == {"dataset"}


def test_a_recycler_routes_concurrent_buckets_once_each():
    """Buckets handed over from several threads at once, one of them twice: every row goes
    to its destination once, and the epoch commits once."""
    sent, commits = [], []

    class Box:
        def write(self, rank, bucket, block):
            sent.append(block[:, :8].copy().view("<i8").ravel())

        def commit(self):
            commits.append(1)

        def abort(self):
            raise AssertionError("not aborted")

    ids = np.random.default_rng(0).permutation(1000)
    target = np.random.default_rng(1).permutation(1000)
    r = recycle.Recycler(epoch=1, ids=ids, bucket_rows=64, outbox=Box(), cut=50, spill_to=1)
    assert r.prepare(target, rows=1000, spill=[])

    def bucket(b):  # positions [64 b, 64 b + 64) of the epoch before, as read from its file
        at = np.arange(b * 64, min(1000, b * 64 + 64))
        return [stage_exchange.pack_rows(at, {"v": ids[at].reshape(-1, 1)})]

    threads = [threading.Thread(target=r.take, args=(b, bucket(b))) for b in [*range(16), 3]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert r.join(30) and r.committed and commits == [1]
    positions = np.sort(np.concatenate(sent))
    np.testing.assert_array_equal(positions, np.arange(1000))


@pytest.mark.timeout(60)
def test_no_staging_thread_waits_for_the_training_loop(write, tmp_path):
    """Mid-epoch and between epochs, the epoch being staged from the one read holds no
    thread: the router stops when idle and the stager defers that epoch (a loop that stops
    iterating, and never closes its loader, leaves no thread behind)."""
    ds = write(1000, rows_per_shard=250, row_group_rows=23)
    loader = ds.loader(cache="staged", **staged_options(tmp_path, seed=2, prefetch=0))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=2)

    def staging_threads():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            alive = [t.name for t in threading.enumerate() if t.name.startswith("feedline-stag")]
            if not alive:
                return []
            time.sleep(0.05)
        return alive

    same(batches(loader, 3), batches(memory, 3))
    assert staging_threads() == []  # mid-epoch 0: epoch 1 half routed, nothing waits
    same(batches(loader), batches(memory))
    assert staging_threads() == []
    same(batches(loader), batches(memory))  # epoch 1: staged from epoch 0 all the same
    assert _sources(loader)[:2] == ["dataset", "epoch before"]
