"""``timeout=``: a transform that never returns raises, naming its sample, instead of
blocking the loader forever (thread workers are abandoned and replaced, process workers
killed and restarted). Every test has a pytest timeout, so a regression fails, not hangs."""

from __future__ import annotations

import os

import map_fns
import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, UserFunctionError
from feedline.loader import nodes


def dataset(n: int = 32) -> fl.Dataset:
    ids = np.arange(n, dtype=np.int64)
    x = (ids[:, None] + np.arange(3)).astype(np.float32)
    return fl.from_arrow(pa.table({"id": ids, "x": pa.array(list(x), pa.list_(pa.float32(), 3))}))


@pytest.fixture
def release():
    """Lets the threads stuck in map_fns.hang_on_5 return when the test is done."""
    map_fns.RELEASE.clear()
    yield map_fns.RELEASE
    map_fns.RELEASE.set()


@pytest.mark.timeout(60)
def test_a_stuck_thread_worker_raises_naming_the_sample_and_is_replaced(release) -> None:
    loader = dataset().loader(batch_size=4, shuffle=False, format="numpy", num_workers=2,
                              transform=map_fns.hang_on_5, timeout=0.5)  # fmt: skip
    got = []
    with pytest.raises(UserFunctionError, match="row index 5") as info:
        for batch in loader:
            got.append(batch["id"].tolist())
    message = str(info.value)
    assert "timeout=0.5" in message and "abandoned" in message and "Fix:" in message
    assert got == [[0, 1, 2, 3]]  # the batch of sample 5 never came out
    workers = loader._workers
    stuck = list(workers.abandoned)
    assert len(stuck) == 1 and stuck[0].is_alive() and stuck[0].daemon
    assert len(workers._threads) == 2  # a new thread took its place
    release.set()  # the stuck call returns: its result is dropped, its thread ends
    stuck[0].join(10)
    assert not stuck[0].is_alive()
    rest = [b["id"].tolist() for b in loader]  # the same workers go on, from batch 1
    assert rest == [list(range(i, i + 4)) for i in range(4, 32, 4)]
    loader.close()


@pytest.mark.timeout(60)
def test_a_stuck_worker_process_is_killed_and_the_workers_restart(tmp_path) -> None:
    marker = tmp_path / "hung"
    loader = dataset().loader(batch_size=4, shuffle=False, format="numpy", num_workers=2,
                              worker_type="process", transform=map_fns.HangOnce(str(marker)),
                              timeout=1)  # fmt: skip
    delivered: list[list[int]] = []
    with loader:
        with pytest.raises(UserFunctionError, match="row index 5") as info:
            for batch in loader:
                delivered.append(batch["id"].tolist())
        assert "killed" in str(info.value) and "worker process" in str(info.value)
        pid = int(marker.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the stuck process is gone
        assert loader._workers.pids == []  # the pool was shut down
        rest = [b["id"].tolist() for b in loader]  # new workers, from the first batch not given
    assert [4, 5, 6, 7] not in delivered
    assert delivered + rest == [list(range(i, i + 4)) for i in range(0, 32, 4)]


@pytest.mark.timeout(60)
def test_a_stuck_batched_transform_names_the_batch(release) -> None:
    loader = dataset().loader(batch_size=4, shuffle=False, format="numpy", num_workers=1,
                              transform=map_fns.hang_batch_with_5, batched=True,
                              timeout=0.5)  # fmt: skip
    named = r"batch of 4 samples at row indices \[4, 5, 6, 7\]"
    with pytest.raises(UserFunctionError, match=named):
        list(loader)
    loader.close()


@pytest.mark.timeout(60)
def test_a_map_node_takes_a_timeout_too(release) -> None:
    source = dataset(16).loader(batch_size=4, shuffle=False).source_node()
    node = nodes.Map(source, map_fns.hang_on_5, num_workers=1, timeout=0.3)
    with node, pytest.raises(UserFunctionError, match="row index 5"):
        list(node)


@pytest.mark.timeout(60)
def test_a_slow_transform_within_the_timeout_is_untouched() -> None:
    loader = dataset(48).loader(batch_size=8, seed=3, format="numpy", num_workers=2,
                                transform=map_fns.slow_augment, timeout=5)  # fmt: skip
    plain = dataset(48).loader(batch_size=8, seed=3, format="numpy",
                               transform=map_fns.slow_augment)  # fmt: skip
    with loader:
        for a, b in zip(loader, plain, strict=True):
            np.testing.assert_array_equal(a["noisy"], b["noisy"])
        assert loader._workers.abandoned == []


def test_timeout_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="needs worker threads or processes"):
        dataset().loader(transform=map_fns.augment, timeout=5)
    for bad in (0, -1, float("nan"), "5", True):
        with pytest.raises(ConfigurationError, match="seconds > 0"):
            dataset().loader(transform=map_fns.augment, num_workers=1, timeout=bad)
