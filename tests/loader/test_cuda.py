"""The accelerator path on a real CUDA device: pinned batches and side-stream device prefetch.

These tests run only where ``torch.cuda.is_available()`` (CI has no GPU; they were run on a lent
H100, see BENCHMARKS.md). Every test compares what reached the GPU, byte for byte, with what the
same loader yields on the CPU, because the failure modes of asynchronous copies are silent: a
pinned buffer reused before its copy finished, or a tensor the caching allocator hands out
again while the caller's stream still reads it, gives plausible numbers, not an error.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _images(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    return pa.table(
        {
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(pixels),
            "x": rng.standard_normal((n,)).astype(np.float32),
            "label": np.arange(n, dtype=np.int64),
        }
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> fl.Dataset:
    path = tmp_path_factory.mktemp("cuda") / "images"
    fl.from_arrow(_images(4096)).write(path, rows_per_shard=1024, row_group_rows=256)
    return fl.open(path)


def _cpu_batches(ds: fl.Dataset, epochs: int, **options: object) -> list[dict[str, np.ndarray]]:
    loader = ds.loader(format="numpy", **options)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.extend({k: np.array(v) for k, v in b.items()} for b in loader)
    return out


def _assert_same(gpu: list[dict], cpu: list[dict[str, np.ndarray]]) -> None:
    assert len(gpu) == len(cpu)
    for got, want in zip(gpu, cpu, strict=True):
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize(("pin_memory", "prefetch"), [(True, 2), (False, 2), (True, 0)])
def test_device_batches_equal_the_cpu_batches(
    images: fl.Dataset, pin_memory: bool, prefetch: int
) -> None:
    # prefetch > 0: copies issued in the prefetch thread (CopyToDevice → Prefetch →
    # AwaitDevice); prefetch=0: ToDevice in the caller's thread. Batches of 64 rows are
    # gathered several to a group, so each column of a group travels in one copy.
    options = {"batch_size": 64, "shuffle": True, "seed": 3, "drop_last": False}
    loader = images.loader(
        format="torch", device="cuda", pin_memory=pin_memory, prefetch=prefetch, **options
    )
    got = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            assert all(t.device.type == "cuda" for t in batch.values())
            got.append({k: t.cpu().numpy() for k, t in batch.items()})
    _assert_same(got, _cpu_batches(images, 2, **options))


def test_batches_kept_on_the_gpu_are_never_overwritten(images: fl.Dataset) -> None:
    # The loop keeps every device batch while the GPU is kept busy on the caller's stream:
    # copies run ahead on the side stream, buffers are recycled, nothing may be clobbered.
    options = {"batch_size": 128, "shuffle": True, "seed": 11}
    loader = images.loader(format="torch", device="cuda", pin_memory=True, **options)
    work = torch.randn(2048, 2048, device="cuda")
    kept = []
    for batch in loader:
        for _ in range(4):
            work = torch.tanh(work @ work)  # a slow step on the current stream
        kept.append(batch)
    torch.cuda.synchronize()
    got = [{k: t.cpu().numpy() for k, t in b.items()} for b in kept]
    _assert_same(got, _cpu_batches(images, 1, **options))


def test_a_consumer_on_its_own_stream_sees_complete_batches(images: fl.Dataset) -> None:
    options = {"batch_size": 256, "shuffle": True, "seed": 5}
    loader = images.loader(format="torch", device="cuda", pin_memory=True, **options)
    stream = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(stream):
        for batch in loader:
            sums.append(batch["image"].to(torch.int64).sum(dim=(1, 2, 3)))
    torch.cuda.synchronize()
    got = torch.cat(sums).cpu().numpy()
    cpu = _cpu_batches(images, 1, **options)
    want = np.concatenate([b["image"].astype(np.int64).sum(axis=(1, 2, 3)) for b in cpu])
    np.testing.assert_array_equal(got, want)


def test_exact_resume_on_the_device(images: fl.Dataset) -> None:
    options = {"batch_size": 64, "shuffle": True, "seed": 9}
    first = images.loader(format="torch", device="cuda", pin_memory=True, **options)
    seen = []
    for i, batch in enumerate(first):
        seen.append(batch["label"].cpu().numpy())
        if i == 20:
            state = first.state_dict()
            break
    resumed = images.loader(format="torch", device="cuda", pin_memory=True, **options)
    resumed.load_state_dict(state)
    seen.extend(b["label"].cpu().numpy() for b in resumed)
    want = [b["label"] for b in _cpu_batches(images, 1, **options)]
    assert len(seen) == len(want)
    for got, expected in zip(seen, want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_pin_memory_without_a_device_yields_pinned_cpu_tensors(images: fl.Dataset) -> None:
    loader = images.loader(batch_size=64, format="torch", pin_memory=True)
    batch = next(iter(loader))
    assert all(t.device.type == "cpu" and t.is_pinned() for t in batch.values())


def test_a_transform_pipeline_reaches_the_device(images: fl.Dataset) -> None:
    def scale(batch: dict, rng: np.random.Generator) -> dict:
        return {"x": batch["x"] * 2, "label": batch["label"]}

    options = {"batch_size": 64, "shuffle": True, "seed": 1, "transform": scale, "batched": True}
    loader = images.loader(format="torch", device="cuda", pin_memory=True, **options)
    got = [{k: t.cpu().numpy() for k, t in b.items()} for b in loader]
    _assert_same(got, _cpu_batches(images, 1, **options))


def test_composed_nodes_on_the_device(images: fl.Dataset) -> None:
    from feedline.loader import nodes

    options = {"batch_size": 32, "shuffle": True, "seed": 4}
    source = images.loader(format="torch", pin_memory=True, **options).source_node()
    ahead = nodes.AwaitDevice(nodes.Prefetch(nodes.CopyToDevice(source, "cuda")), "cuda")
    got = [{k: t.cpu().numpy() for k, t in b.data.items()} for b in ahead]
    _assert_same(got, _cpu_batches(images, 1, **options))
    inline = nodes.ToDevice(images.loader(format="torch", **options).source_node(), "cuda")
    got = [{k: t.cpu().numpy() for k, t in b.data.items()} for b in inline]
    _assert_same(got, _cpu_batches(images, 1, **options))


def test_wide_stacked_batches_on_the_device(tmp_path) -> None:
    rng = np.random.default_rng(2)
    names = [f"f{i}" for i in range(32)]
    columns = {n: rng.standard_normal(20_000).astype(np.float32) for n in names}
    columns["label"] = np.arange(20_000, dtype=np.int64)
    fl.from_arrow(pa.table(columns)).write(tmp_path / "wide", rows_per_shard=5_000)
    ds = fl.open(tmp_path / "wide")
    options = {"batch_size": 100, "shuffle": True, "seed": 6, "stack": {"features": names}}
    loader = ds.loader(format="torch", device="cuda", pin_memory=True, **options)
    got = [{k: t.cpu().numpy() for k, t in b.items()} for b in loader]
    _assert_same(got, _cpu_batches(ds, 1, **options))
