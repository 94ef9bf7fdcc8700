"""Window batches copied by ``torch.index_select`` into reused buffers (``copier="torch"``).

The loader picks it for torch batches gathered on the loop's thread (``prefetch=0``); the
windows must be bit-identical to NumPy's copy, kept batches never overwritten, resume exact.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader.data.window_gather import (
    strided_windows,
    torch_gather_windows,
    torch_window_blocks,
)
from feedline.loader.data.windows import WindowSampler, window_copier

torch = pytest.importorskip("torch")

SERIES, STEPS, SIZE, HORIZON = 7, 60, 9, 3


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("float32", (8,)), ("float64", ()), ("int16", (2, 3)), ("uint8", (5,)), ("int64", (1,))],
)
def test_the_torch_copy_equals_numpys_for_every_dtype_and_shape(dtype: str, shape: tuple) -> None:
    rng = np.random.default_rng(1)
    values = (rng.standard_normal((500, *shape)) * 100).astype(dtype)
    starts = rng.integers(0, 500 - 17 + 1, 333)
    out = np.full((333, 17, *shape), 7, dtype=dtype)
    got = torch_gather_windows(torch_window_blocks(values, 17), starts, out)
    assert got is out
    want = strided_windows(values, 17)[starts]
    assert got.tobytes() == want.tobytes()


def test_a_start_outside_the_windows_is_a_configuration_error() -> None:
    values = np.arange(40, dtype=np.float32).reshape(20, 2)
    out = np.empty((2, 5, 2), dtype=np.float32)
    with pytest.raises(ConfigurationError, match=r"start rows 3\.\.16 leave the 16 windows"):
        torch_gather_windows(torch_window_blocks(values, 5), np.array([3, 16]), out)
    with pytest.raises(ConfigurationError, match="holds 24 bytes a window"):
        torch_gather_windows(torch_window_blocks(values, 5), np.array([0]), out[:1, :3])


def test_the_loader_picks_the_torch_copy_only_on_the_loops_thread() -> None:
    assert window_copier("torch", 0) == "torch"
    assert window_copier("torch", 2) == "numpy"  # a second OpenMP team beside the loop's
    assert window_copier("numpy", 0) == "numpy"
    with pytest.raises(ConfigurationError, match="copier='cuda'"):
        WindowSampler(_dataset().shard_source(), _windows(), layout=None,
                      widen_unsigned=False, copier="cuda")  # fmt: skip


def _dataset() -> fl.Dataset:
    rng = np.random.default_rng(0)
    n = SERIES * STEPS
    return fl.from_arrow(pa.table({
        "s": np.repeat(np.arange(SERIES), STEPS),
        "t": np.tile(np.arange(STEPS), SERIES),
        "a": rng.standard_normal(n, dtype=np.float32),
        "b": rng.standard_normal(n, dtype=np.float32),
    }))  # fmt: skip


def _windows() -> fl.Windows:
    return fl.Windows(SIZE, HORIZON, by="s", order_by="t", features=["a", "b"])


def _loader(prefetch: int, fmt: str = "torch") -> fl.Loader:
    return _dataset().loader(windows=_windows(), batch_size=16, seed=5, drop_last=False,
                             format=fmt, prefetch=prefetch)  # fmt: skip


def test_kept_torch_copied_batches_are_never_overwritten_and_equal_numpys() -> None:
    loader = _loader(prefetch=0)
    assert loader._prepare().source.fills_buffers  # the torch copy into reused buffers
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        kept = list(loader)  # every batch held at once: no buffer may be handed out again
        reference = _loader(prefetch=2, fmt="numpy")
        reference.set_epoch(epoch)
        want = list(reference)
        assert len(kept) == len(want) == -(-loader.num_samples // 16)
        for a, b in zip(kept, want, strict=True):
            for key in ("inputs", "targets"):
                assert a[key].numpy().tobytes() == b[key].tobytes()


def test_resume_with_the_torch_copy_is_exact() -> None:
    want = [b["inputs"].clone() for b in _loader(prefetch=0)]
    for stop in (1, 4, len(want) - 1):
        loader = _loader(prefetch=0)
        head = [b["inputs"].clone() for _, b in zip(range(stop), loader, strict=False)]
        state = loader.state_dict()
        resumed = _loader(prefetch=0)
        resumed.load_state_dict(state)
        got = head + [b["inputs"] for b in resumed]
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def test_batches_not_kept_reuse_the_same_buffers() -> None:
    addresses = {b["inputs"].data_ptr() for b in _loader(prefetch=0)}
    assert 1 <= len(addresses) <= 4  # the pool's sets, not one allocation a batch
