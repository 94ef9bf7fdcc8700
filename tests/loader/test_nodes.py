"""The loader's nodes: the next/reset/get_state protocol, custom pipelines, the Map workers
(threads and processes: order, errors, dead workers, shared memory) and ToDevice on CPU."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import map_fns
import numpy as np
import pyarrow as pa
import pytest
import torch

import feedline as fl
from feedline.errors import ConfigurationError, DataError, UserFunctionError
from feedline.loader import nodes
from feedline.loader.nodes import shm
from feedline.loader.nodes.worker_task import _run


def dataset(n: int = 64) -> fl.Dataset:
    ids = np.arange(n, dtype=np.int64)
    x = (ids[:, None] + np.arange(3)).astype(np.float32)
    return fl.from_arrow(pa.table({"id": ids, "x": pa.array(list(x), pa.list_(pa.float32(), 3))}))


def ids_of(node: nodes.Node, k: int | None = None) -> list[list[int]]:
    out = []
    for batch in node:
        out.append(np.asarray(batch.data["id"]).tolist())
        if k is not None and len(out) == k:
            break
    return out


def shm_names() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()} if Path("/dev/shm").is_dir() else set()


def test_nodes_report_the_delivered_position_and_reset_to_it() -> None:
    loader = dataset(50).loader(batch_size=8, seed=4, drop_last=False)
    whole = ids_of(loader.source_node())
    assert [len(b) for b in whole] == [8] * 6 + [2]  # a short last batch
    node = nodes.Prefetch(nodes.Format(loader.source_node(), "numpy"), depth=2)
    head = ids_of(node, 3)
    state = json.loads(json.dumps(node.state_dict()))
    assert state == {"epoch": 0, "batches": 3}  # the caller's position, not the thread's
    node.reset(state)
    assert head + ids_of(node) == whole
    node.load_state_dict({"epoch": 0, "batches": 5})
    assert ids_of(node) == whole[5:]
    node.reset()  # the current epoch again, from its start
    assert ids_of(node) == whole
    node.reset({"epoch": 1, "batches": 0})  # another epoch: the loader's order for it
    loader.set_epoch(1)
    assert ids_of(node) == [b["id"].tolist() for b in loader]
    node.close()
    with pytest.raises(ConfigurationError, match="get_state"):
        node.reset({"epoch": -1, "batches": 0})


def test_node_states_and_loader_states_name_the_position_alike() -> None:
    """Issue 24.17: one name, ``"batches"``, in the loader's and the nodes' states."""
    loader = dataset(40).loader(batch_size=8, seed=1, format="numpy", prefetch=0)
    iterator = iter(loader)
    head = [next(iterator)["id"].tolist() for _ in range(2)]
    iterator.close()
    state = loader.state_dict()
    node = loader.source_node()
    assert (
        node.get_state()
        == {"epoch": 0, "batches": 2}
        == {k: state[k] for k in ("epoch", "batches")}
    )
    rest = ids_of(node)
    node.reset(state)  # a loader state is a node state too (its other keys are ignored)
    assert ids_of(node) == rest
    node.reset({"epoch": 0, "batch": 1})  # an earlier feedline's node state still reads
    assert ids_of(node) == [head[1], *rest]
    with pytest.raises(ConfigurationError, match="'batches'"):
        node.reset({"epoch": 0, "batch": 1, "batches": 2})  # two positions: which one?


def test_a_custom_pipeline_resumes_exactly_through_map_and_prefetch() -> None:
    loader = dataset(60).loader(batch_size=7, seed=2, drop_last=False)

    def pipeline(source: nodes.Node) -> nodes.Node:
        node = nodes.Map(source, map_fns.augment, num_workers=2, seed=loader.seed)
        return nodes.ToDevice(nodes.Prefetch(nodes.Format(node, "torch"), depth=3), "cpu")

    def values(node: nodes.Node, k: int | None = None) -> list[np.ndarray]:
        out = []
        for batch in node:
            out.append(batch.data["noisy"].numpy().copy())
            if k is not None and len(out) == k:
                break
        return out

    with pipeline(loader.source_node()) as full:
        expected = values(full)
    with pipeline(loader.source_node()) as first:
        head = values(first, 4)
        state = first.get_state()
    with pipeline(dataset(60).loader(batch_size=7, seed=2, drop_last=False).source_node()) as again:
        again.reset(state)
        tail = values(again)
    assert len(head) + len(tail) == len(expected) == 9
    for got, want in zip(head + tail, expected, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_map_output_is_the_inline_output_whatever_the_worker_timing(worker_type: str) -> None:
    ds = dataset(96)
    inline = ds.loader(batch_size=16, seed=9, format="numpy", transform=map_fns.augment)
    workers = ds.loader(batch_size=16, seed=9, format="numpy", transform=map_fns.slow_augment,
                        num_workers=2, worker_type=worker_type)  # fmt: skip
    with workers:
        for a, b in zip(inline, workers, strict=True):
            assert set(a) == {"id", "noisy", "flip"}
            np.testing.assert_array_equal(a["id"], b["id"])
            np.testing.assert_array_equal(a["noisy"], b["noisy"])  # same rng per sample
            np.testing.assert_array_equal(a["flip"], b["flip"])
        assert workers.stats()["worker_type"] == worker_type


def test_a_thread_worker_exception_reaches_the_loop_with_its_traceback() -> None:
    loader = dataset(32).loader(batch_size=4, shuffle=False, transform=map_fns.fail_on_7,
                                num_workers=2)  # fmt: skip
    with pytest.raises(UserFunctionError, match="ValueError: sample seven is cursed") as info:
        list(loader)
    cause = info.value.__cause__
    assert isinstance(cause, ValueError)
    assert "fail_on_7" in [f.name for f in _frames(cause)]  # the original traceback
    assert any("row index 7" in note for note in cause.__notes__)
    assert loader.state_dict()["batches"] == 1  # batch 1 holds sample 7: not delivered
    with pytest.raises(UserFunctionError):  # the same batch fails again, the workers live on
        list(loader)
    loader.close()


def _frames(exc: BaseException) -> list:
    import traceback

    return traceback.extract_tb(exc.__traceback__)


def test_a_process_worker_exception_comes_back_with_the_worker_traceback_text() -> None:
    loader = dataset(32).loader(batch_size=4, shuffle=False, transform=map_fns.fail_on_7,
                                num_workers=2, worker_type="process")  # fmt: skip
    with loader, pytest.raises(UserFunctionError) as info:
        list(loader)
    message = str(info.value)
    assert "sample seven is cursed" in message and "Fix:" in message
    assert 'raise ValueError("sample seven is cursed")' in message  # the worker's frames
    assert "row index 7" in message
    assert isinstance(info.value.__cause__, ValueError)
    feedline_error = dataset(32).loader(
        batch_size=4,
        shuffle=False,
        num_workers=1,
        transform=map_fns.data_error_on_7,
        worker_type="process",
    )
    with feedline_error, pytest.raises(DataError, match="sample 7") as info:
        list(feedline_error)  # feedline's own errors keep their type
    assert any("worker process" in note for note in info.value.__notes__)


def test_a_killed_worker_process_is_reported_and_the_workers_restart(tmp_path) -> None:
    fn = map_fns.KillOnce(str(tmp_path / "killed"))
    loader = dataset(32).loader(batch_size=4, shuffle=False, transform=fn, num_workers=2,
                                worker_type="process", format="numpy")  # fmt: skip
    delivered: list[list[int]] = []
    with loader:
        with pytest.raises(UserFunctionError, match="exited unexpectedly"):
            for batch in loader:  # batches handed over before the failure (timing decides)
                delivered.append(batch["id"].tolist())
        assert loader._workers.pids == []  # the pool was shut down
        rest = [b["id"].tolist() for b in loader]  # new workers, from the first batch not given
    assert [4, 5, 6, 7] not in delivered  # the batch of the killed sample never came out
    assert delivered + rest == [list(range(i, i + 4)) for i in range(0, 32, 4)]  # none lost


def test_process_workers_refuse_a_transform_they_cannot_receive() -> None:
    with pytest.raises(ConfigurationError, match="module level"):
        dataset(8).loader(batch_size=4, transform=lambda s, rng: s, num_workers=1,
                          worker_type="process")  # fmt: skip
    with pytest.raises(ConfigurationError, match="worker_type"):
        dataset(8).loader(batch_size=4, transform=map_fns.augment, worker_type="gpu")


def test_worker_outputs_travel_in_shared_memory_not_in_the_message() -> None:
    inputs, outputs = shm.Segments(), shm.Segments()
    arrays = {"__indices__": np.arange(16, dtype=np.int64), "id": np.arange(16, dtype=np.int64)}
    layout, nbytes = shm.plan_layout(arrays)
    segment = inputs.acquire(nbytes)
    shm.write(segment, arrays, layout)
    attached = shm.Attached()
    try:
        reply = _run(map_fns.big_output, False, attached, outputs,
                     ("task", 0, False, 0, 0, segment.name, layout))  # fmt: skip
        assert len(pickle.dumps(reply)) < 2048  # 16 x 64 KiB of arrays are not in it
        assert not any(isinstance(v, np.ndarray) for v in reply)
        _, _, rows, name, out_layout, skipped, *_ = reply  # then retired names, seconds
        views = shm.read(attached.get(name), out_layout)
        assert rows == 16 and skipped == [] and views["image"].shape == (16, 16, 1024)
        assert views["image"][3, 0, 0] == 3.0
        lists, _ = pickle.loads(views.pop("__objects__").tobytes())
        assert lists["name"][:2] == ["s0", "s1"]  # only ragged values are pickled
        del views
    finally:
        attached.close()
        outputs.close(unlink=True)
        inputs.close(unlink=True)


def test_process_workers_leave_no_shared_memory_behind() -> None:
    before = shm_names()
    loader = dataset(64).loader(batch_size=8, seed=1, format="numpy", transform=map_fns.big_output,
                                num_workers=2, worker_type="process")  # fmt: skip
    batches = list(loader)
    assert [b["name"][0] == f"s{b['id'][0]}" for b in batches] == [True] * 8
    assert all((b["image"][:, 0, 0] == b["id"]).all() for b in batches)
    iterator = iter(loader)
    next(iterator)  # an iteration abandoned with chunks in flight
    loader.close()
    assert shm_names() <= before


def test_to_device_and_pin_pass_batches_through_on_cpu() -> None:
    loader = dataset(8).loader(batch_size=4, shuffle=False, device="cpu")
    batches = list(loader)
    assert [b["id"].device.type for b in batches] == ["cpu", "cpu"]
    node = nodes.ToDevice(dataset(8).loader(batch_size=4).source_node(), None)
    assert not node.active and len(list(node)) == 2
    with pytest.warns(UserWarning, match="pin_memory"):
        pinned = nodes.Pin(nodes.Format(dataset(8).loader(batch_size=4).source_node()))
    assert pinned.active is torch.cuda.is_available()
    assert len(list(pinned)) == 2
    with pytest.raises(ConfigurationError, match="format='torch'"):
        dataset(8).loader(batch_size=4, format="numpy", device="cpu")


def test_collate_stacks_samples_and_keeps_ragged_values_as_lists() -> None:
    class Samples(nodes.Stage):
        def produce(self) -> nodes.Batch:
            batch = self.source.next()
            batch.data = [{"i": int(i), "v": np.full(2, i), "s": "x" * int(i)}
                          for i in batch.indices]  # fmt: skip
            return batch

    node = nodes.Collate(Samples(nodes.Order.of([5], batch_size=3, shuffle=False,
                                                drop_last=False)))  # fmt: skip
    first, second = list(node)
    assert first.data["v"].shape == (3, 2) and first.data["i"].tolist() == [0, 1, 2]
    assert first.data["s"] == ["", "x", "xx"] and len(second) == 2
    bad = nodes.Map(dataset(8).loader(batch_size=4, shuffle=False).source_node(),
                    lambda s, rng: {"v": np.zeros(int(s["id"]) % 2 + 1)})  # fmt: skip
    with pytest.raises(UserFunctionError, match="different shapes"):
        next(bad)
