"""The local shard cache of remote datasets, over a real S3 API on loopback (moto server)."""

from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, IntegrityError, StorageError
from feedline.loader.data import shard_cache

N, PER_SHARD = 1000, 125  # 8 shards of one row group each: one shard per streaming pool


def ids(loader) -> np.ndarray:
    return np.concatenate([np.asarray(b["id"]) for b in loader])


def remote(s3_bucket, n: int = N, per_shard: int = PER_SHARD) -> fl.Dataset:
    url = f"{s3_bucket.url}/ds"
    options = s3_bucket.storage_options
    fl.range(n).write(url, rows_per_shard=per_shard, row_group_rows=per_shard,
                      storage_options=options)  # fmt: skip
    return fl.open(url, storage_options=options)


def settle() -> None:
    """Wait for the shard prefetch threads of collected loaders to end."""
    gc.collect()
    for thread in threading.enumerate():
        if thread.name == "feedline-shard-prefetch":
            thread.join(timeout=10)


def cached_names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def expected_names(ds: fl.Dataset, shards=None) -> set[str]:
    chosen = ds.manifest.shards if shards is None else [ds.manifest.shards[i] for i in shards]
    return {f"sha256-{s.checksum.split(':', 1)[1]}.parquet" for s in chosen}


def test_cold_cache_downloads_every_shard_once_and_warm_cache_needs_no_object(
    s3_bucket, tmp_path
) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "cache"
    cold = ds.loader(batch_size=100, format="numpy", cache="memory", cache_dir=folder, seed=3)
    for epoch in (0, 1):
        cold.set_epoch(epoch)
        assert sorted(ids(cold).tolist()) == list(range(N))
    stats = cold.stats()
    assert stats["shard_downloads"] == 8 and stats["shard_corrupt"] == 0
    assert cached_names(folder) == expected_names(ds)
    assert not list((folder / ".tmp").iterdir())
    reference = [b["id"].tolist() for b in ds.loader(batch_size=100, format="numpy", seed=3,
                                                     cache_dir=False)]  # fmt: skip

    # the shard objects are gone from the bucket: a warm cache must not need them
    s3_bucket.fs().rm([f"{s3_bucket.url}/ds/{s.path}" for s in ds.manifest.shards])
    for cache in ("memory", "none"):
        window = 2 if cache == "none" else None
        warm = ds.loader(batch_size=100, format="numpy", cache=cache, cache_dir=folder, seed=3,
                         shuffle_window=window)  # fmt: skip
        got = [b["id"].tolist() for b in warm]
        assert sorted(i for batch in got for i in batch) == list(range(N))
        if cache == "memory":
            assert got == reference  # the same exact permutation as reading S3 directly
        assert warm.stats()["shard_downloads"] == 0 and warm.stats()["shard_hits"] >= 8


def test_streaming_first_batch_waits_only_for_the_first_pools(s3_bucket, tmp_path) -> None:
    ds = remote(s3_bucket)
    loader = ds.loader(batch_size=50, format="numpy", cache="none", shuffle_window=1,
                       prefetch=0, cache_dir=tmp_path / "c", seed=1)  # fmt: skip
    it = iter(loader)
    first = next(it)["id"]
    # one pool = one shard; the prefetch thread runs at most AHEAD shards past the reader
    assert loader.stats()["shard_downloads"] <= 1 + shard_cache.AHEAD + 1 < 8
    rest = np.concatenate([first] + [b["id"] for b in it])
    assert sorted(rest.tolist()) == list(range(N))
    assert loader.stats()["shard_downloads"] == 8


def test_lru_eviction_keeps_the_folder_under_the_limit_with_exact_epochs(
    s3_bucket, tmp_path
) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    limit = 3 * max(s.bytes for s in ds.manifest.shards)
    loader = ds.loader(batch_size=50, format="numpy", cache="none", shuffle_window=1,
                       cache_dir=folder, cache_limit=limit, seed=2)  # fmt: skip
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sorted(ids(loader).tolist()) == list(range(N))
        size = sum(p.stat().st_size for p in folder.iterdir() if not p.name.startswith("."))
        assert size <= limit
    stats = loader.stats()
    assert stats["shard_evictions"] > 0 and stats["shard_downloads"] > 8  # re-downloaded
    with pytest.raises(ConfigurationError, match=r"smaller than shard.*Fix:"):
        list(ds.loader(batch_size=50, format="numpy", cache_dir=tmp_path / "tiny",
                       cache_limit=100))  # fmt: skip


def test_a_corrupted_cached_shard_is_detected_and_downloaded_again(s3_bucket, tmp_path) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    list(ds.loader(batch_size=100, format="numpy", cache_dir=folder))
    victim = folder / sorted(expected_names(ds))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    victim.write_bytes(bytes(data))
    loader = ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache="none")
    assert sorted(ids(loader).tolist()) == list(range(N))
    stats = loader.stats()
    assert (stats["shard_corrupt"], stats["shard_downloads"]) == (1, 1)
    assert cached_names(folder) == expected_names(ds)


def test_disk_full_while_caching_is_a_clear_error_and_leaves_the_cache_consistent(
    s3_bucket, tmp_path, monkeypatch
) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    real = shard_cache.write_chunk
    written = []

    def full_disk(fd: int, data) -> None:  # the disk fills up half-way through a shard
        real(fd, bytes(data)[: len(data) // 2])
        written.append(os.fstat(fd).st_size)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shard_cache, "write_chunk", full_disk)
    loader = ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache_limit="1MB")
    with pytest.raises(StorageError) as info:
        list(loader)
    message = str(info.value)
    del loader, info
    settle()  # the prefetch thread may still be failing on its own shard
    assert "Disk full" in message and str(folder) in message and "Fix:" in message
    assert "s3://" in message and "part-" in message and "1000000" in message
    assert written and all(size > 0 for size in written)  # real partial files were written
    assert cached_names(folder) == set() and not list((folder / ".tmp").iterdir())

    monkeypatch.setattr(shard_cache, "write_chunk", real)  # space again: the cache recovers
    again = ds.loader(batch_size=100, format="numpy", cache_dir=folder)
    assert sorted(ids(again).tolist()) == list(range(N))
    assert cached_names(folder) == expected_names(ds)


def test_leftovers_of_a_killed_download_are_ignored_and_removed(s3_bucket, tmp_path) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    name = sorted(expected_names(ds))[0]
    (folder / ".tmp").mkdir(parents=True)
    (folder / ".locks").mkdir()
    stale = folder / ".tmp" / f"{name}.99999.deadbeef.part"
    stale.write_bytes(b"half a shard")
    (folder / ".locks" / f"{name}.lock").touch()
    loader = ds.loader(batch_size=100, format="numpy", cache_dir=folder)
    assert sorted(ids(loader).tolist()) == list(range(N))
    assert not stale.exists() and cached_names(folder) == expected_names(ds)


def test_plain_parquet_folder_on_s3_is_cached_by_size(s3_bucket, tmp_path) -> None:
    fs = s3_bucket.fs()
    for i in range(3):
        ids_ = np.arange(i * 100, (i + 1) * 100, dtype=np.int64)
        with fs.open(f"{s3_bucket.url}/plain/part-{i}.parquet", "wb") as handle:
            pq.write_table(pa.table({"id": ids_}), handle)
    ds = fl.open(f"{s3_bucket.url}/plain", storage_options=s3_bucket.storage_options)
    folder = tmp_path / "c"
    loader = ds.loader(batch_size=50, format="numpy", cache_dir=folder)
    assert sorted(ids(loader).tolist()) == list(range(300))
    names = cached_names(folder)
    assert len(names) == 3 and all(n.startswith("plain-") for n in names)
    again = ds.loader(batch_size=50, format="numpy", cache_dir=folder, cache="none")
    assert sorted(ids(again).tolist()) == list(range(300))
    assert again.stats()["shard_downloads"] == 0


def test_local_datasets_are_never_copied(tmp_path) -> None:
    fl.range(100).write(tmp_path / "ds", rows_per_shard=50)
    folder = tmp_path / "c"
    loader = fl.open(tmp_path / "ds").loader(batch_size=10, format="numpy", cache_dir=folder)
    assert sorted(ids(loader).tolist()) == list(range(100))
    assert not folder.exists() and "shard_downloads" not in loader.stats()


def test_ranks_share_a_folder_and_a_resumed_epoch_downloads_only_what_is_left(
    s3_bucket, tmp_path
) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    kw = {"batch_size": 50, "format": "numpy", "cache": "none", "shuffle_window": 1, "seed": 5}
    parts = [ids(ds.loader(rank=r, world_size=2, cache_dir=folder, **kw)) for r in (0, 1)]
    assert not set(parts[0]) & set(parts[1]) and len(parts[0]) == len(parts[1]) == N // 2
    assert sorted(np.concatenate(parts).tolist()) == list(range(N))

    first = ds.loader(cache_dir=tmp_path / "first", **kw)
    it = iter(first)
    head = [next(it)["id"] for _ in range(10)]  # 500 of 1000 rows
    resumed = ds.loader(cache_dir=tmp_path / "fresh", **kw)
    resumed.load_state_dict(first.state_dict())
    tail = ids(resumed)
    assert sorted(np.concatenate([*head, tail]).tolist()) == list(range(N))
    needed = sorted({int(i) // PER_SHARD for i in tail})  # one pool = one shard
    assert len(needed) < 8
    assert cached_names(tmp_path / "fresh") == expected_names(ds, needed)


CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import feedline as fl
    from feedline.loader.data import shard_cache
    endpoint, url, folder = sys.argv[1:4]
    options = {"key": "testing", "secret": "testing", "use_listings_cache": False,
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    ds = fl.open(url, storage_options=options)
    loader = ds.loader(batch_size=100, format="numpy", cache="none", shuffle_window=2,
                       cache_dir=folder, seed=9)
    got = np.concatenate([b["id"] for b in loader])
    stats = loader.stats()
    print(json.dumps({"ids": sorted(got.tolist()), "downloads": stats["shard_downloads"]}))
    """
)


@pytest.mark.slow
def test_two_processes_share_one_folder_and_download_each_shard_once(s3_bucket, tmp_path) -> None:
    ds = remote(s3_bucket)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    args = [sys.executable, str(script), s3_bucket.endpoint, f"{s3_bucket.url}/ds",
            str(tmp_path / "c")]  # fmt: skip
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    for result in results:
        assert result["ids"] == list(range(N))
    assert sum(r["downloads"] for r in results) == len(ds.manifest.shards)
    assert cached_names(tmp_path / "c") == expected_names(ds)


def test_storage_faults_during_a_download_recover_or_leave_no_partial_file(
    s3_bucket, tmp_path
) -> None:
    from faults import Fault, FaultPlan

    remote(s3_bucket)
    fast = fl.RetryPolicy(attempts=4, base_delay=0.01)
    plan = FaultPlan(
        [
            # read 1 of each shard is its footer, checked on open; read 2 starts the download
            Fault("read", nth=2, error="unavailable", times=2, path="part-00001"),
            Fault("read", nth=2, error="truncate", times=1, path="part-00002"),
        ]
    )
    url, options = plan.wrap(f"{s3_bucket.url}/ds", s3_bucket.storage_options, retry=fast)
    ds = fl.open(url, storage_options=options)
    loader = ds.loader(batch_size=100, format="numpy", cache="none", cache_dir=tmp_path / "a")
    assert sorted(ids(loader).tolist()) == list(range(N))  # retried / downloaded again
    assert {error for _, _, error in plan.fired} == {"unavailable", "truncate"}
    assert cached_names(tmp_path / "a") == expected_names(ds)

    broken = FaultPlan([Fault("read", nth=2, error="truncate", times=None, path="part-00003")])
    url, options = broken.wrap(f"{s3_bucket.url}/ds", s3_bucket.storage_options, retry=fast)
    ds = fl.open(url, storage_options=options)
    folder = tmp_path / "b"
    with pytest.raises(StorageError, match=r"part-00003.*Fix:"):
        list(ds.loader(batch_size=100, format="numpy", cache="none", cache_dir=folder))
    settle()
    assert expected_names(ds, [3]).isdisjoint(cached_names(folder))
    assert not list((folder / ".tmp").iterdir())


def test_a_remote_shard_replaced_after_open_is_refused_and_not_cached(s3_bucket, tmp_path) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    shard = ds.manifest.shards[5]
    s3_bucket.fs().pipe_file(f"{s3_bucket.url}/ds/{shard.path}", b"PAR1 not the shard PAR1")
    with pytest.raises(IntegrityError, match=rf"{shard.path}.*Fix:"):
        list(ds.loader(batch_size=100, format="numpy", cache="none", cache_dir=folder))
    settle()
    assert expected_names(ds, [5]).isdisjoint(cached_names(folder))
    assert not list((folder / ".tmp").iterdir())


def test_eviction_never_deletes_a_shard_a_reader_holds(s3_bucket, tmp_path) -> None:
    ds, folder = remote(s3_bucket), tmp_path / "c"
    limit = 2 * max(s.bytes for s in ds.manifest.shards)
    cache = shard_cache.ShardCache.for_files(
        ds.plan.source.files, ds.manifest.shards, folder, limit
    )
    names = [cache.keys[i].name for i in range(3)]
    with cache.using(0) as held:
        os.utime(held, (1, 1))  # the least recently used file, but being read
        cache.prefetch_one(1)
        os.utime(folder / names[1], (2, 2))
        cache.prefetch_one(2)  # needs room: shard 1 goes, the held shard 0 stays
        assert (folder / names[0]).exists() and not (folder / names[1]).exists()
        assert pq.read_table(held)["id"].to_pylist() == list(range(PER_SHARD))
    assert cache.stats.evictions == 1 and cached_names(folder) == {names[0], names[2]}


def test_an_empty_cache_dir_is_a_clear_error(tmp_path):
    ds = fl.from_arrow(pa.table({"id": list(range(10))}))
    with pytest.raises(fl.ConfigurationError, match="cache_dir='' names no folder"):
        ds.loader(batch_size=2, cache_dir="")


def test_uncompressed_tensors_are_copied_from_the_cached_shards(s3_bucket, tmp_path, monkeypatch):
    """A remote dataset read through the shard cache takes the page copy from the local copies
    (feedline/loader/data/page_fill.py) and gives the written values."""
    from feedline.loader.data.page_fill import PageFill

    copied: list[set[str]] = []
    real = PageFill.copy

    def spy(self, *args, **kwargs):
        copied.append(real(self, *args, **kwargs))
        return copied[-1]

    monkeypatch.setattr(PageFill, "copy", spy)
    images = np.random.default_rng(4).integers(0, 256, (400, 2, 8, 8), dtype=np.uint8)
    table = pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images)})
    url = f"{s3_bucket.url}/tensors"
    fl.from_arrow(table).write(url, rows_per_shard=100, row_group_rows=50, compression=None,
                               storage_options=s3_bucket.storage_options)  # fmt: skip
    ds = fl.open(url, storage_options=s3_bucket.storage_options)
    loader = ds.loader(batch_size=100, format="numpy", shuffle=False, cache="memory",
                       cache_dir=tmp_path / "c", prefetch=0)  # fmt: skip
    got = np.concatenate([np.asarray(b["image"]) for b in loader])
    np.testing.assert_array_equal(got, images)
    assert copied == [{"image"}] * 8, copied
