"""cache="staged": the batches, order and state of cache="memory", staged one epoch ahead."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from staged_batches import ROW, batches, same, staged_options

from feedline.errors import IntegrityError
from feedline.loader.data.staging.stager import BUCKET_SHARE, RECYCLED_BUCKET_SHARE, StagedEpochs
from feedline.loader.order import sample_order
from feedline.loader.order.stage_routes import StagePlan


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_staged_batches_equal_memory_batches(write, tmp_path, seed, world, drop_last):
    """Every rank, two epochs: the same batches, in the same order, as cache="memory" (a
    bucket is 37 rows: many buckets per rank, row groups split across them)."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    for rank in range(world):
        common = {"seed": seed, "rank": rank, "world_size": world, "drop_last": drop_last}
        staged = ds.loader(cache="staged", **staged_options(tmp_path, **common))
        memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
        for _ in range(2):
            same(batches(staged), batches(memory))
        assert staged.stats()["cache"] == "staged"
        assert staged.stats()["shuffle_mode"] == "exact"
        assert staged.state_dict() == memory.state_dict()


@pytest.mark.parametrize(("world", "drop_last", "pad_last"),
                         [(1, True, True), (3, False, True), (4, False, False)])  # fmt: skip
def test_staged_epochs_over_lazy_rows_route_by_the_inverse_permutation(
    write, tmp_path, monkeypatch, world, drop_last, pad_last
):
    """Over LAZY_ROWS rows (100 here) the order is lazy and each node's rows find their ranks
    by inverting it (no rank materializes another rank's plan): the batches are still those of
    cache="memory", for every rank, padding included."""
    monkeypatch.setattr(sample_order, "LAZY_ROWS", 100)
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    asked = []
    real = StagePlan.plan
    monkeypatch.setattr(StagePlan, "plan", lambda self, r: asked.append(r) or real(self, r))
    for rank in range(world):
        common = {"seed": 3, "rank": rank, "world_size": world, "drop_last": drop_last,
                  "pad_last": pad_last}  # fmt: skip
        memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
        with ds.loader(cache="staged", **staged_options(tmp_path / str(rank), **common)) as staged:
            for _ in range(2):
                same(batches(staged), batches(memory))
        assert set(asked) == {rank}, asked  # only its own plan, never the others'
        asked.clear()


def test_pad_last_and_shuffle_false_follow_memory(write, tmp_path):
    ds = write(101, row_group_rows=10)
    for extra in ({"drop_last": False, "pad_last": True, "world_size": 3, "rank": 2},
                  {"shuffle": False, "world_size": 2, "rank": 1}):  # fmt: skip
        staged = ds.loader(cache="staged", **staged_options(tmp_path, **extra))
        memory = ds.loader(cache="memory", batch_size=8, format="numpy", **extra)
        same(batches(staged), batches(memory))


def test_exact_resume_mid_epoch(write, tmp_path):
    """A state taken mid-epoch 1 resumes in a new staged loader (same cache folder) with the
    rest of the memory loader's epoch."""
    ds = write(400)
    common = {"seed": 3, "world_size": 2, "rank": 1}
    first = ds.loader(cache="staged", **staged_options(tmp_path, **common))
    batches(first)
    head = batches(first, 5)
    state = first.state_dict()
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
    batches(memory)
    whole = batches(memory)
    assert state == memory.state_dict() | {"batches": 5}
    resumed = ds.loader(cache="staged", **staged_options(tmp_path, world_size=2, rank=1))
    resumed.load_state_dict(state)
    same(head + batches(resumed), whole)
    same(batches(resumed), batches(memory))  # and the next epoch


def test_elastic_resume_mid_epoch(write, tmp_path):
    """Two ranks stop mid-epoch; three staged ranks resume: exactly the memory loaders'."""
    ds = write(500)
    states = []
    for rank in range(2):
        old = ds.loader(cache="staged", **staged_options(tmp_path, seed=4, world_size=2, rank=rank))
        batches(old, 7)
        states.append(old.state_dict())
    for rank in range(3):
        new = ds.loader(cache="staged", **staged_options(tmp_path, world_size=3, rank=rank))
        ref = ds.loader(cache="memory", batch_size=8, format="numpy", world_size=3, rank=rank)
        new.load_state_dict(states)
        ref.load_state_dict(states)
        same(batches(new), batches(ref))
        same(batches(new), batches(ref))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("elastic", [False, True])
def test_resume_at_an_epoch_boundary_while_the_next_epoch_is_staged(
    write, tmp_path, monkeypatch, elastic
):
    """The state is taken at the end of epoch 0 while the old loader's stager is still
    staging epoch 1 (held in pass 2); a new loader (same folder, same or another world size)
    resumes with epoch 1 exactly as cache="memory" gives it."""
    ds = write(400)
    gate, entered = threading.Event(), threading.Event()
    receive = StagedEpochs._receive

    def held(self, plan, task, report):
        if plan.epoch == 1 and self.world_size == 2:
            entered.set()
            gate.wait(60)
        return receive(self, plan, task, report)

    monkeypatch.setattr(StagedEpochs, "_receive", held)
    old = ds.loader(cache="staged", **staged_options(tmp_path, seed=9, world_size=2, rank=0))
    batches(old)
    assert entered.wait(60)  # epoch 1 is being staged right now
    state = old.state_dict()
    world = 1 if elastic else 2
    new = ds.loader(cache="staged", **staged_options(tmp_path, world_size=world, rank=0))
    ref = ds.loader(cache="memory", batch_size=8, format="numpy", world_size=world, rank=0)
    new.load_state_dict(state)
    ref.load_state_dict(state)
    if not elastic:  # the new loader waits for the old one's staging of the same epoch
        threading.Timer(0.2, gate.set).start()
    assert batches(new) == [] and batches(ref) == []  # epoch 0 was complete
    new.set_epoch(1)
    ref.set_epoch(1)
    expected = batches(ref)
    assert len(expected) == (400 // 8 if elastic else 400 // 16)
    same(batches(new), expected)
    gate.set()
    report = {r["epoch"]: r for r in new.stats()["staged_epochs"]}
    assert report[1]["staged_here"] is elastic  # same plan: the old loader's inbox was used


def test_metrics_report_staging_and_whether_it_was_hidden(write, tmp_path):
    ds = write(300)
    loader = ds.loader(cache="staged", **staged_options(tmp_path, seed=1))
    batches(loader)
    batches(loader)
    metrics = loader.metrics()
    assert [m["epoch"] for m in metrics] == [0, 1]
    assert all(m["stage_s"] >= 0 and m["stage_wait_s"] >= 0 for m in metrics)
    assert all(isinstance(m["stage_hidden"], bool) for m in metrics)
    report = loader.stats()["staged_epochs"]
    assert report[0]["stage_rows_read"] == 300 and report[0]["staged_here"]
    assert report[0]["stage_buckets"] == -(-296 // 37)  # 37 batches of 8 rows, 37 per bucket


@pytest.mark.parametrize(("world", "share"), [(1, RECYCLED_BUCKET_SHARE), (2, BUCKET_SHARE)])
def test_memory_stays_within_the_budget_per_bucket(write, tmp_path, world, share):
    """A bucket holds at most a sixteenth of memory_budget (an eighth with one rank, whose
    later epochs run no pass 1 beside its buckets): the pass-2 chunk is that big."""
    ds = write(300)
    loader = ds.loader(cache="staged", **staged_options(tmp_path, world_size=world,
                                                        memory_budget=ROW * 64 * 16))  # fmt: skip
    assert loader.stats()["stage_bucket_rows"] == ROW * 64 * 16 // share // ROW


def test_ranks_of_a_node_with_other_budgets_read_its_inbox_as_it_was_cut(write, tmp_path):
    """memory_budget="auto" follows the memory free when each rank's loader starts, so the
    ranks of one node may cut buckets differently: each reads the node's inbox as its sender
    cut it (by the layout the node published), not by its own cut."""
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    for rank, rows in [(0, 37), (1, 53)]:
        common = {"seed": 3, "rank": rank, "world_size": 2}
        budget = ROW * rows * BUCKET_SHARE
        staged = ds.loader(cache="staged", **staged_options(tmp_path, memory_budget=budget,
                                                             **common))  # fmt: skip
        memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
        assert staged.stats()["stage_bucket_rows"] == rows
        for _ in range(2):
            same(batches(staged), batches(memory))
        staged.close()


@pytest.mark.parametrize("cut", [-5, 0, "37", True, None])
def test_a_published_layout_with_a_bad_bucket_size_is_refused(write, tmp_path, cut):
    ds = write(100)
    loader = ds.loader(cache="staged", **staged_options(tmp_path))
    batches(loader)  # staged, its layout published
    for path in (tmp_path / "cache").rglob("layout.json"):
        path.write_text(json.dumps({"bucket_rows": cut}))
    with pytest.raises(IntegrityError, match="bucket_rows"):
        batches(ds.loader(cache="staged", **staged_options(tmp_path)))


def test_a_published_bucket_size_over_the_epoch_allocates_nothing_and_fails_clearly(
    write, tmp_path
):
    """A layout naming more rows per bucket than the epoch has (here 2^40) is not trusted for
    an allocation: the bucket is cut at the epoch's end, and its files' rows, checked against
    the positions, do not fill it."""
    ds = write(100)
    batches(ds.loader(cache="staged", **staged_options(tmp_path)))
    for path in (tmp_path / "cache").rglob("layout.json"):
        path.write_text(json.dumps({"bucket_rows": 2**40}))
    with pytest.raises(IntegrityError, match="rows"):
        batches(ds.loader(cache="staged", **staged_options(tmp_path)))


def test_no_staged_file_is_written_and_a_restart_reuses_the_inbox(write, tmp_path, monkeypatch):
    """The rank's rows are served from its buckets in memory (never read from the dataset
    again): nothing but the exchange's bucket files is written. A new loader resuming
    mid-epoch reads the epoch's inbox again (pass 1 is not run again) and yields the rest of
    cache="memory"'s epoch."""
    from feedline.loader.data.staging import session

    def refuse(self, indices, out=None):
        raise AssertionError("a staged batch was read from the dataset")

    monkeypatch.setattr(session.DirectRows, "gather", refuse)
    ds = write(300)
    first = ds.loader(cache="staged", **staged_options(tmp_path, seed=8))
    head = batches(first, 6)
    state = first.state_dict()
    folder = tmp_path / "cache" / "staged"
    written = [p for p in folder.rglob("*") if p.is_file() and ".locks" not in p.parts]
    assert written and all("exchange" in p.parts for p in written)
    assert not list(folder.rglob("*.stage"))
    again = ds.loader(cache="staged", **staged_options(tmp_path, seed=8))
    again.load_state_dict(state)
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=8)
    same(head + batches(again), batches(memory))
    report = again.stats()["staged_epochs"][0]
    assert report["staged_here"] is False and report["stage_rows_read"] == 0


def test_a_damaged_inbox_is_staged_again(write, tmp_path):
    """A bucket file that lost bytes (a lost write) is never served: a new loader finds the
    inbox incomplete, its node sends the rows again, and the batches stay exact."""
    ds = write(300)
    loader = ds.loader(cache="staged", **staged_options(tmp_path, seed=2))
    expected = batches(loader)
    files = sorted((tmp_path / "cache" / "staged" / "exchange").rglob("e0/to0/from0/r0.b1"))
    assert len(files) == 1
    with open(files[0], "r+b") as f:
        f.truncate(files[0].stat().st_size - 8)
    again = ds.loader(cache="staged", **staged_options(tmp_path, seed=2))
    same(batches(again), expected)
    assert again.stats()["staged_epochs"][0]["staged_here"] is True


def test_auto_stages_over_the_budget_and_says_so(write, tmp_path, caplog):
    """cache="auto" over memory_budget stages epochs (exact), with the INFO line and reason;
    with shuffle=False it still streams row groups."""
    ds = write(400)
    kw = {"batch_size": 8, "format": "numpy", "memory_budget": 4000, "cache_dir": tmp_path}
    with caplog.at_level(logging.INFO, logger="feedline"):
        auto = ds.loader(seed=5, **kw)
        stats = auto.stats()
    assert stats["cache"] == "staged" and stats["shuffle_mode"] == "exact"
    assert "stages each epoch" in stats["shuffle_reason"]
    assert any("stages each epoch" in r.getMessage() for r in caplog.records)
    same(batches(auto), batches(ds.loader(seed=5, cache="memory", batch_size=8,
                                             format="numpy")))  # fmt: skip
    assert ds.loader(shuffle=False, **kw).stats()["cache"] == "none"


def test_auto_streams_strings_and_unshared_nodes(write, tmp_path):
    """Strings cannot be staged, nor several nodes without stage_dir: auto streams, and the
    reason says why."""
    ds = write(400)
    kw = {"batch_size": 8, "format": "numpy", "memory_budget": 4000, "cache_dir": tmp_path}
    two = ds.loader(world_size=2, rank=0, ranks_per_node=1, **kw).stats()
    assert two["shuffle_mode"] == "two-level" and "no stage_dir" in two["shuffle_reason"]


def test_staged_refuses_strings(tmp_path):
    import pyarrow as pa

    import feedline as fl
    from feedline.errors import ConfigurationError

    fl.from_arrow(pa.table({"s": ["a", "b"]})).write(tmp_path / "ds")
    loader = fl.open(tmp_path / "ds").loader(cache="staged", strings="list",
                                             cache_dir=tmp_path / "c")  # fmt: skip
    with pytest.raises(ConfigurationError, match="strings or binary"):
        loader.stats()


def test_several_nodes_need_a_stage_dir(write, tmp_path):
    from feedline.errors import ConfigurationError

    ds = write(100)
    loader = ds.loader(cache="staged", world_size=2, rank=0, ranks_per_node=1,
                       cache_dir=tmp_path)  # fmt: skip
    with pytest.raises(ConfigurationError, match="stage_dir"):
        loader.stats()


def test_bucket_files_are_checked_against_the_marker(write, tmp_path, monkeypatch):
    """A bucket file changed after its marker was written is refused, never served."""
    from feedline.errors import IntegrityError
    from feedline.loader.data.staging import exchange as stage_exchange

    ds = write(200)
    commit = stage_exchange._FileOutbox.commit

    def commit_then_damage(self):
        commit(self)
        victim = sorted(self.folder.iterdir())[0]
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0xFF
        victim.write_bytes(bytes(data))

    monkeypatch.setattr(stage_exchange._FileOutbox, "commit", commit_then_damage)
    loader = ds.loader(cache="staged", **staged_options(tmp_path))
    with pytest.raises(IntegrityError, match="marker"):
        batches(loader)


@pytest.mark.timeout(60)
def test_a_closed_loader_stages_again_and_stays_exact(write, tmp_path):
    """Closing the loader cancels the staging ahead (its stager thread ends); iterating again
    stages what it needs and yields cache="memory"'s batches."""
    ds = write(300)
    loader = ds.loader(cache="staged", **staged_options(tmp_path, seed=6))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=6)
    same(batches(loader), batches(memory))
    loader.close()
    source = loader._prepare().source
    assert source.join(30)
    same(batches(loader), batches(memory))


def test_a_share_over_the_page_cache_drops_its_pages_and_stays_exact(write, tmp_path, monkeypatch):
    """A node whose share is more than its memory drops each shard's pages after pass 1 read
    them (posix_fadvise); the batches are still cache="memory"'s. (One rank: epoch 1 is
    staged from epoch 0's buckets, so only epoch 0 reads the shards.)"""
    from feedline.loader.data.staging import share, stager

    dropped = []
    monkeypatch.setattr(stager, "memory_room", lambda: 1)
    drop = share._drop_pages
    monkeypatch.setattr(
        share, "_drop_pages", lambda layout, f: (dropped.append(f), drop(layout, f))
    )
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    staged = ds.loader(cache="staged", **staged_options(tmp_path, seed=3))
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", seed=3)
    same(batches(staged), batches(memory))
    assert staged._prepare().source.join(60)  # epoch 1, staged ahead
    assert sorted(dropped) == [0, 1, 2, 3]  # each shard once, by epoch 0's pass 1
    assert [e["stage_source"] for e in staged.stats()["staged_epochs"]] == [
        "dataset", "epoch before"]  # fmt: skip


def test_a_file_system_that_refuses_o_direct_transfers_falls_back_to_the_page_cache(
    write, tmp_path, monkeypatch
):
    """Some file systems take O_DIRECT at open and refuse its transfers (EINVAL): the bucket
    files are then written and read through the page cache, and the batches are unchanged.
    (Simulated: no such file system here; the system calls refuse what a descriptor opened
    with O_DIRECT asks.)"""
    import errno
    import fcntl
    import os

    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        pytest.skip("no O_DIRECT on this platform")
    refused = []

    def refusing(call):
        def run(fd, *args):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & direct:
                refused.append(call.__name__)
                raise OSError(errno.EINVAL, "Invalid argument")
            return call(fd, *args)

        return run

    monkeypatch.setattr(os, "pwrite", refusing(os.pwrite))
    monkeypatch.setattr(os, "readv", refusing(os.readv))
    ds = write(301, rows_per_shard=100, row_group_rows=23)
    common = {"seed": 5, "rank": 1, "world_size": 2, "drop_last": False}
    with ds.loader(cache="staged", **staged_options(tmp_path, **common)) as staged:
        memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
        for _ in range(2):
            same(batches(staged), batches(memory))
    assert {"pwrite", "readv"} <= set(refused)  # both were refused, then retried without


def test_row_groups_too_big_for_the_budget_are_decoded_one_at_a_time(write, tmp_path, caplog):
    """Pass 1 decodes row groups ahead only as far as half of memory_budget holds them (a
    row group the size of the budget: none ahead, said at INFO); the batches are unchanged."""
    ds = write(301, rows_per_shard=None, row_group_rows=301)  # one row group: 13 KB
    common = {"seed": 1, "rank": 0, "world_size": 1}
    memory = ds.loader(cache="memory", batch_size=8, format="numpy", **common)
    with (caplog.at_level(logging.INFO, logger="feedline"),
          ds.loader(cache="staged", **staged_options(tmp_path, memory_budget=ROW * 37 * 16,
                                                     **common)) as staged):  # fmt: skip
        same(batches(staged), batches(memory))
    assert "0 row group(s) decoded ahead, not 2" in caplog.text


@pytest.mark.parametrize("claimed", [-1, 2**50, 11])
def test_a_bucket_files_size_is_checked_against_its_marker_before_a_buffer_is_made(
    tmp_path, claimed
):
    """A marker whose size is not the file's (damaged, hostile: negative, a petabyte) is an
    IntegrityError before any buffer of that size is made."""
    from feedline.errors import IntegrityError
    from feedline.loader.data.staging import exchange as stage_exchange

    path = tmp_path / "r0.b0"
    path.write_bytes(bytes(12))
    with pytest.raises(IntegrityError, match="marker says"):
        stage_exchange._read_table(path, [], claimed, 0)


@pytest.mark.timeout(60)
def test_rows_sent_to_a_node_that_moves_past_the_epoch_meanwhile_are_dropped(
    write, tmp_path, monkeypatch
):
    """A node whose inbox of an epoch is complete still sends that epoch's rows to nodes that
    asked for them (a restarted receiver). If the receiver moves past the epoch meanwhile and
    deletes its inbox under the files being written, the sender drops those rows and goes on;
    a sender that must send (its own epoch waits on it) still fails loudly."""
    import shutil

    from feedline.errors import StorageError
    from feedline.loader.data.staging import exchange as stage_exchange
    from feedline.loader.data.staging.report import StageReport

    ds = write(300, rows_per_shard=100, row_group_rows=25)
    options = staged_options(tmp_path, seed=1, rank=1, world_size=2, ranks_per_node=1,
                             stage_dir=tmp_path / "shared")  # fmt: skip
    loader = ds.loader(cache="staged", **options)
    source = loader._prepare().source
    source.planner = loader._stage_plan
    plan = source.planner(0)
    receiver = stage_exchange.StorageExchange(tmp_path / "shared", source.key, node=0, nodes=2)
    inbox = receiver.root / plan.key / "e0" / "to0"
    write_rows = stage_exchange._FileOutbox.write

    def receiver_moves_on(self, rank, bucket, block):
        if inbox.exists():  # node 0 drops its inbox of epoch 0, layout and all
            shutil.rmtree(inbox)
        write_rows(self, rank, bucket, block)

    monkeypatch.setattr(stage_exchange._FileOutbox, "write", receiver_moves_on)
    source.exchange.publish(plan.key, 0, {"bucket_rows": 37})  # node 1's own (as _stage does)
    receiver.publish(plan.key, 0, {"bucket_rows": 37})
    source._send(plan, StageReport(0), waiting=False)  # dropped, no error
    receiver.publish(plan.key, 0, {"bucket_rows": 37})
    with pytest.raises((OSError, StorageError)):
        source._send(plan, StageReport(0), waiting=True)
    loader.close()


def test_an_inbox_released_withdraws_its_layout_before_its_markers(tmp_path, monkeypatch):
    """A sender sends to a node whose layout is there and whose marker from it is not: if the
    markers went first, a lagging rank of another node could start sending (reading its share
    again) into an inbox being deleted, as a full-suite run of the 4-rank, 2-node test saw."""
    import shutil

    from feedline.loader.data.staging import exchange as stage_exchange

    receiver = stage_exchange.StorageExchange(tmp_path, "k", node=0, nodes=2)
    sender = stage_exchange.StorageExchange(tmp_path, "k", node=1, nodes=2)
    receiver.publish("p", 3, {"bucket_rows": 5})
    sender.send("p", 3, 0).commit()
    assert sender.delivered("p", 3, 0) and receiver.layout("p", 3, 0, timeout=None)
    seen = []
    remove = shutil.rmtree

    def watched(path, *args, **kwargs):
        seen.append(receiver.layout("p", 3, 0, timeout=None))  # what a sender sees then
        remove(path, *args, **kwargs)

    monkeypatch.setattr(stage_exchange.shutil, "rmtree", watched)
    receiver.release("p", 3)
    assert seen == [None]
    assert not sender.delivered("p", 3, 0)
