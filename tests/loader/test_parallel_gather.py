"""A group's window gather split across threads: the same batches, in the same order, as one
thread; exact resume; the threads joined at every end (breaks, resets, deleted loaders); an
exception in a gather thread reaches the caller with its traceback."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import feedline as fl
from feedline.loader import nodes
from feedline.loader.nodes import gather_threads as gt

SERIES, STEPS, FEATURES, SIZE, HORIZON, BATCH = 6, 1500, 8, 96, 8, 128
MARK = "broke off after 3 batches"


@pytest.fixture(scope="module")
def windows_loader() -> fl.Loader:
    """Windows of 3,328 bytes (96 + 8 steps of 8 float32): a batch of 128 is 416 KiB, over
    ``MIN_PART_BYTES``, so a group of batches is split across the threads."""
    rng = np.random.default_rng(0)
    n = SERIES * STEPS
    columns = {"s": np.repeat(np.arange(SERIES), STEPS), "t": np.tile(np.arange(STEPS), SERIES)}
    columns |= {f"f{j}": rng.standard_normal(n, dtype=np.float32) for j in range(FEATURES)}
    ds = fl.from_arrow(pa.table(columns))
    windows = fl.Windows(SIZE, HORIZON, by="s", order_by="t",
                         features=[f"f{j}" for j in range(FEATURES)])  # fmt: skip
    return ds.loader(windows=windows, batch_size=BATCH, seed=3, drop_last=False, format="numpy")


def gather(loader: fl.Loader, threads: int, *, group: int = 4, fmt: str | None = None,
           epoch: int = 0) -> nodes.Gather:  # fmt: skip
    order = nodes.Order(loader._plan, epoch=epoch)
    return nodes.Gather(order, loader._prepare(), shuffle=True, seed=loader.seed, group=group,
                        fmt=fmt, threads=threads)  # fmt: skip


def gather_thread_names() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("feedline-gather")]


def storage(value: object) -> int:
    """Where the memory a batch's array is a view of starts."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().data_ptr()
    assert isinstance(value, np.ndarray) and value.base is not None
    return value.base.__array_interface__["data"][0]


def as_numpy(value: object) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


@pytest.mark.parametrize("fmt", [None, "torch"])
@pytest.mark.parametrize(("threads", "group"), [(2, 4), (3, 3), (4, 2), (2, 5)])
def test_split_gathers_are_the_single_threads_batches_in_order(
    windows_loader: fl.Loader, threads: int, group: int, fmt: str | None
) -> None:
    with gather(windows_loader, 1, group=group, fmt=fmt) as one:
        want = [(b.number, b.indices.copy(), {k: as_numpy(v).copy() for k, v in b.data.items()})
                for b in one]  # fmt: skip
    with gather(windows_loader, threads, group=group, fmt=fmt) as many:
        got = list(many)
        bases = {storage(b.data["inputs"]) for b in got[:group]}
    assert len(bases) == min(threads, group)  # the first group came in that many parts
    assert [b.number for b in got] == [w[0] for w in want] == list(range(len(want)))
    assert len(got[-1]) < BATCH  # the short last batch too
    for batch, (_, indices, data) in zip(got, want, strict=True):
        np.testing.assert_array_equal(batch.indices, indices)
        for key, values in data.items():
            value = as_numpy(batch.data[key])
            assert value.dtype == values.dtype and value.shape == values.shape
            assert value.tobytes() == values.tobytes()  # bit-identical
    assert not gather_thread_names()  # closed with the node


def test_the_loader_with_split_gathers_yields_its_single_thread_epoch(
    windows_loader: fl.Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gt, "auto_threads", lambda *_: 1)
    windows_loader.set_epoch(1)
    one = [{k: v.copy() for k, v in b.items()} for b in windows_loader]
    monkeypatch.setattr(gt, "auto_threads", lambda *_: 2)
    monkeypatch.setattr(gt, "CHECK_S", 0.0)  # look at once (one thread until the first look)
    seen: set[str] = set()
    many = []
    windows_loader.set_epoch(1)
    for b in windows_loader:
        seen.update(gather_thread_names())
        many.append(b)
    assert seen  # the split ran
    assert len(many) == len(one)
    for a, b in zip(many, one, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_resume_through_split_gathers_is_exact(windows_loader: fl.Loader) -> None:
    with gather(windows_loader, 1, group=3) as node:
        want = [b.data["inputs"].copy() for b in node]
    for stop in (1, 3, 4, 7):
        with gather(windows_loader, 2, group=3) as node:
            head = [next(node).data["inputs"].copy() for _ in range(stop)]
            state = node.get_state()
        assert state == {"epoch": 0, "batches": stop}
        with gather(windows_loader, 2, group=3, epoch=5) as node:
            node.reset(state)
            tail = [b.data["inputs"] for b in node]
        got = head + tail
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_no_gather_thread_outlives_early_breaks_resets_or_the_loader(
    windows_loader: fl.Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = set(threading.enumerate())
    for k in range(200):  # prefetched pipelines, broken off after a few batches
        node = nodes.Prefetch(gather(windows_loader, 2, group=2), depth=1, group=2)
        for _, _batch in zip(range(1 + k % 3), node, strict=False):
            pass
        if k % 2:
            node.reset({"epoch": 0, "batch": 1})
            next(node)
        node.close()
    assert not gather_thread_names()
    monkeypatch.setattr(gt, "auto_threads", lambda *_: 2)
    monkeypatch.setattr(gt, "CHECK_S", 0.0)  # look at once (one thread until the first look)
    for _ in range(100):  # the loader's own pipeline: broken off, then the loader deleted
        loader = fl.Loader(windows_loader._source(), windows=windows_loader.windows,
                           batch_size=BATCH, seed=1)  # fmt: skip
        for _, _batch in zip(range(3), loader, strict=False):
            pass
        del loader, _batch
    gc.collect()
    assert not gather_thread_names()
    assert set(threading.enumerate()) <= before


def boom(x: int) -> int:
    if x == 2:
        raise ValueError(f"part {x} failed")
    return x


def test_an_error_in_a_gather_thread_reaches_the_caller_with_its_traceback() -> None:
    pool = gt.GatherThreads(3)
    with pytest.raises(ValueError, match="part 2 failed") as info:
        pool.map(boom, [0, 1, 2])
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == "boom"  # raised in the pool's thread, its frames intact
    assert pool.map(boom, [0, 1, 3]) == [0, 1, 3]  # the pool keeps working
    pool.close()
    assert not gather_thread_names()


def test_the_automatic_count_splits_only_while_a_cpu_is_idle() -> None:
    assert gt.auto_threads(idle_cpus=0.0) == 1
    assert gt.auto_threads(idle_cpus=1e9) == gt.gather_threads()
    ticks = gt.cpu_ticks()  # this machine's: Linux
    assert ticks is not None and 0 <= ticks[0] <= ticks[1]
    assert gt.batch_cuts([100] * 8, 3, row_bytes=gt.MIN_PART_BYTES) == [0, 3, 6, 8]


@pytest.mark.parametrize(("idle_ticks", "want_split"), [(200, True), (0, False), (30, False)])
def test_the_pool_splits_by_the_idle_cpu_time_it_reads(
    monkeypatch: pytest.MonkeyPatch, idle_ticks: int, want_split: bool
) -> None:
    # 2 CPUs, 200 ticks between two looks: all idle, all busy, 0.3 of a CPU idle
    readings = iter([(1000, 5000), (1000 + idle_ticks, 5200)])
    monkeypatch.setattr(gt, "cpu_ticks", lambda: next(readings))
    monkeypatch.setattr(gt.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(gt, "gather_threads", lambda: 2)
    monkeypatch.setattr(gt, "CHECK_S", 0.0)
    pool = gt.GatherThreads(None)
    assert pool.threads == (2 if want_split else 1)


def test_a_split_loader_left_unclosed_at_exit_prints_nothing(tmp_path: Path) -> None:
    script = tmp_path / "unclosed.py"
    script.write_text(
        textwrap.dedent(f"""
        import threading
        import numpy as np, pyarrow as pa
        import torch  # changes the order modules are torn down in: the failure needs it
        import feedline as fl
        from feedline.loader.nodes import gather_threads as gt
        gt.auto_threads, gt.CHECK_S = (lambda *_: 2), 0.0
        ds = fl.from_arrow(pa.table({{"s": np.repeat(np.arange(20), 300),
                                     "v": np.ones(6000, dtype=np.float32)}}))
        loader = ds.loader(windows=fl.Windows(100, 4, by="s", features="v"), batch_size=256,
                           seed=0, drop_last=False)
        batches = iter(loader)
        for _, batch in zip(range(3), batches):
            pass
        assert any(t.name.startswith("feedline-gather") for t in threading.enumerate())
        print("{MARK}")  # exits with the loop broken off and never closed
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert MARK in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
