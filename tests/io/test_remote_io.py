"""Any fsspec URL everywhere: readers, write, open, verify, stats and the loader over a real S3
API (moto on loopback), ``memory://`` and ``file://``."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

import feedline as fl
from feedline.io.storage.paths import resolve
from feedline.io.storage.retrying_fs import RetryingFileSystem


def _ids(ds: fl.Dataset) -> list[int]:
    return sorted(ds.to_arrow()["id"].to_pylist())


def _put(fs: Any, path: str, data: bytes) -> None:
    fs.pipe_file(path, data)


def _parquet_bytes(ids: range) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": np.asarray(ids, dtype=np.int64)}), sink, row_group_size=25)
    return sink.getvalue()


# --------------------------------------------------------------------------- resolve


def test_local_paths_keep_the_native_filesystem(tmp_path: Path) -> None:
    for url in (tmp_path, f"file://{tmp_path}"):
        loc = resolve(url)
        assert isinstance(loc.fs, LocalFileSystem) and loc.is_local
        assert type(loc.arrow_filesystem()).__name__ == "LocalFileSystem"  # pyarrow's native


def test_remote_filesystems_get_the_retry_policy(s3_bucket: Any) -> None:
    options = {**s3_bucket.storage_options, "retry": {"attempts": 7, "base_delay": 0.01}}
    loc = resolve(f"{s3_bucket.url}/x", options)
    assert isinstance(loc.fs, RetryingFileSystem)
    assert loc.fs.policy == fl.RetryPolicy(attempts=7, base_delay=0.01)
    assert loc.url == f"{s3_bucket.url}/x" and loc.path == f"{s3_bucket.url[5:]}/x"
    assert resolve(f"{s3_bucket.url}/x", {**options, "retry": 1}).fs.policy.attempts == 1


def test_remote_locations_pickle_for_engine_workers(s3_bucket: Any) -> None:
    import pickle

    options = {**s3_bucket.storage_options, "retry": fl.RetryPolicy(attempts=3)}
    loc = resolve(f"{s3_bucket.url}/p.bin", options)
    loc.fs.pipe_file(loc.path, b"payload")
    copy = pickle.loads(pickle.dumps(loc))
    assert isinstance(copy.fs, RetryingFileSystem) and copy.fs.policy.attempts == 3
    assert copy.fs.cat_file(copy.path) == b"payload" and copy.url == loc.url


@pytest.mark.parametrize(
    "retry", [{"attempts": 2, "nope": 1}, "five", {"attempts": 0}, {"jitter": 2.0}]
)
def test_bad_retry_options_are_configuration_errors(s3_bucket: Any, retry: Any) -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        resolve(s3_bucket.url, {**s3_bucket.storage_options, "retry": retry})


def test_unknown_protocol_is_a_configuration_error() -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.read_parquet("nosuchprotocol://bucket/x.parquet")


# --------------------------------------------------------------------------- readers over s3


def test_read_parquet_folder_glob_and_list_from_s3(s3_bucket: Any) -> None:
    fs, root = s3_bucket.fs(), s3_bucket.url[5:]
    for i in range(3):
        _put(fs, f"{root}/pq/part-{i}.parquet", _parquet_bytes(range(i * 100, (i + 1) * 100)))
    _put(fs, f"{root}/pq/_hidden.parquet", b"not parquet")
    options = s3_bucket.storage_options
    assert _ids(fl.read_parquet(f"{s3_bucket.url}/pq", storage_options=options)) == list(range(300))
    globbed = fl.read_parquet(f"{s3_bucket.url}/pq/part-[01].parquet", storage_options=options)
    assert _ids(globbed) == list(range(200))
    listed = [f"{s3_bucket.url}/pq/part-2.parquet", f"{s3_bucket.url}/pq/part-0.parquet"]
    assert _ids(fl.read_parquet(listed, storage_options=options)) == [
        *range(100),
        *range(200, 300),
    ]
    ds = fl.read_parquet(f"{s3_bucket.url}/pq", storage_options=options)
    assert ds.count() == 300
    assert ds.filter(pa.compute.field("id") < 10).count() == 10


def test_read_csv_jsonl_text_from_s3(s3_bucket: Any) -> None:
    fs, root, options = s3_bucket.fs(), s3_bucket.url[5:], s3_bucket.storage_options
    _put(fs, f"{root}/csv/a.csv", b"id,name\n1,a\n2,b\n")
    _put(fs, f"{root}/csv/b.csv.gz", gzip.compress(b"id,name\n3,c\n"))
    csv = fl.read_csv(f"{s3_bucket.url}/csv", storage_options=options).to_arrow()
    assert sorted(csv["id"].to_pylist()) == [1, 2, 3]
    lines = "".join(json.dumps({"id": i, "v": i * 1.5}) + "\n" for i in range(50))
    _put(fs, f"{root}/js/a.jsonl", lines.encode())
    assert _ids(fl.read_jsonl(f"{s3_bucket.url}/js/*.jsonl", storage_options=options)) == list(
        range(50)
    )
    _put(fs, f"{root}/txt/a.txt", b"one\ntwo\n")
    _put(fs, f"{root}/txt/b.txt", b"three")
    text = fl.read_text(f"{s3_bucket.url}/txt", storage_options=options).to_arrow()
    assert text["text"].to_pylist() == ["one", "two", "three"]
    per_file = fl.read_text(
        f"{s3_bucket.url}/txt", per="file", include_paths=True, storage_options=options
    ).to_arrow()
    assert per_file["text"].to_pylist() == ["one\ntwo\n", "three"]
    assert per_file["path"].to_pylist() == [
        f"{s3_bucket.url}/txt/a.txt",
        f"{s3_bucket.url}/txt/b.txt",
    ]


def test_read_images_from_s3_labels_by_folder(s3_bucket: Any) -> None:
    from PIL import Image

    fs, root = s3_bucket.fs(), s3_bucket.url[5:]
    blobs = {}
    for label, shade in (("cats", 10), ("dogs", 200)):
        for i in range(2):
            out = io.BytesIO()
            Image.new("L", (4, 3), shade + i).save(out, format="PNG")
            blobs[f"{label}/{i}.png"] = out.getvalue()
            _put(fs, f"{root}/img/{label}/{i}.png", out.getvalue())
    ds = fl.read_images(f"{s3_bucket.url}/img", storage_options=s3_bucket.storage_options)
    rows = ds.to_arrow().to_pylist()
    assert sorted(r["label"] for r in rows) == ["cats", "cats", "dogs", "dogs"]
    for row in rows:
        rel = row["path"].split("/img/", 1)[1]
        assert row["bytes"] == blobs[rel]
    decoded = ds.transform(fl.DecodeImages("bytes", size=(3, 4))).take(1)
    assert decoded


def test_missing_s3_objects_raise_clear_errors(s3_bucket: Any) -> None:
    options = s3_bucket.storage_options
    with pytest.raises(fl.DataError, match=r"does not exist.*Fix:"):
        fl.read_parquet(f"{s3_bucket.url}/nothing.parquet", storage_options=options)
    with pytest.raises(fl.DataError, match=r"matched no.*Fix:"):
        fl.read_csv(f"{s3_bucket.url}/none/*.csv", storage_options=options)
    with pytest.raises(fl.FormatError, match="Fix:"):
        fl.open(f"{s3_bucket.url}/no-dataset", storage_options=options)


# --------------------------------------------------------------------------- write / open / verify


def test_write_open_verify_stats_on_s3(s3_bucket: Any) -> None:
    url, options = f"{s3_bucket.url}/ds", s3_bucket.storage_options
    table = pa.table({"id": np.arange(1000, dtype=np.int64), "x": np.arange(1000) / 4})
    info = fl.from_arrow(table).write(url, rows_per_shard=300, storage_options=options, stats=True)
    assert (info.rows, info.shards) == (1000, 4)
    names = sorted(p.rsplit("/", 1)[1] for p in s3_bucket.fs().ls(url[5:]))
    # the manifest, its version history and 4 shards
    assert names[:2] == ["_feedline.json", "_versions"] and len(names) == 6
    assert all(n.startswith("part-") and n.endswith(".parquet") for n in names[2:])
    ds = fl.open(url, verify=True, storage_options=options)
    assert _ids(ds) == list(range(1000)) and ds.manifest.rows == 1000
    assert fl.verify(url, storage_options=options).rows == 1000
    assert fl.stats(ds)["x"]["max"] == pytest.approx(999 / 4)
    assert ds.manifest.statistics["rows"] == 1000  # write(stats=True) stored them on s3
    # a shard changed behind the manifest's back is caught
    fs = s3_bucket.fs()
    fs.pipe_file(f"{url[5:]}/{names[2]}", _parquet_bytes(range(300)))
    with pytest.raises(fl.IntegrityError, match=f"{names[2]}.*Fix:"):
        fl.verify(url, storage_options=options)


def test_rewrite_by_another_writer_is_seen_despite_listing_caches(s3_bucket: Any) -> None:
    url = f"{s3_bucket.url}/ds"
    cached = {**s3_bucket.storage_options, "use_listings_cache": True}
    fl.range(100).write(url, rows_per_shard=40, storage_options=cached)
    first = fl.open(url, storage_options=cached)
    assert first.count() == 100
    _ = list(first.loader(batch_size=10, format="numpy", cache_dir=False))
    # another writer (its own filesystem instance, as another process would have)
    other = {**s3_bucket.storage_options, "skip_instance_cache": True}
    fl.range(30).write(url, rows_per_shard=7, storage_options=other)
    again = fl.open(url, storage_options=cached, verify=True)
    assert _ids(again) == list(range(30)) and len(again.manifest.shards) == 5


def test_memory_and_file_urls_round_trip(tmp_path: Path) -> None:
    fl.range(50).write("memory://feedline-remote-test/ds", rows_per_shard=20)
    ds = fl.open("memory://feedline-remote-test/ds", verify=True)
    assert _ids(ds) == list(range(50)) and len(ds.manifest.shards) == 3
    batches = list(ds.loader(batch_size=10, seed=3, format="numpy", cache_dir=False))
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(50))
    again = fl.open("memory://feedline-remote-test/ds").map_batches(lambda b: b)
    again.write(f"file://{tmp_path}/copy")
    assert _ids(fl.open(f"file://{tmp_path}/copy", verify=True)) == list(range(50))
    assert _ids(fl.open(tmp_path / "copy")) == list(range(50))


# --------------------------------------------------------------------------- loader over s3


@pytest.fixture
def s3_dataset(s3_bucket: Any) -> tuple[str, dict[str, Any], int]:
    """A 523-row feedline dataset on s3 (uneven shards and row groups)."""
    n, url = 523, f"{s3_bucket.url}/loader-ds"
    table = pa.table({"id": np.arange(n, dtype=np.int64), "y": np.arange(n) % 5})
    fl.from_arrow(table).write(
        url, rows_per_shard=150, row_group_rows=40, storage_options=s3_bucket.storage_options
    )
    return url, s3_bucket.storage_options, n


def _epoch(loader: Any, epoch: int) -> list[np.ndarray]:
    loader.set_epoch(epoch)
    return [b["id"] for b in loader]


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_loader_epochs_are_permutations_over_s3(s3_dataset: Any, cache: str) -> None:
    url, options, n = s3_dataset
    loader = fl.open(url, storage_options=options).loader(
        batch_size=32,
        shuffle=True,
        seed=7,
        drop_last=False,
        cache=cache,
        format="numpy",
        cache_dir=False,
    )
    orders = []
    for epoch in range(2):
        ids = np.concatenate(_epoch(loader, epoch))
        # every id exactly once: drop_last=False ends the epoch with a short batch, no padding
        assert sorted(ids.tolist()) == list(range(n))
        orders.append(ids)
    assert not np.array_equal(orders[0], orders[1])  # reshuffled each epoch


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_disjoint_equal_shards_covering_the_epoch_over_s3(
    s3_dataset: Any, world: int, tmp_path: Path
) -> None:
    url, options, n = s3_dataset
    ds = fl.open(url, storage_options=options)
    per_rank = []
    for rank in range(world):
        loader = ds.loader(
            batch_size=16,
            rank=rank,
            world_size=world,
            seed=1,
            drop_last=True,
            format="numpy",
            cache_dir=tmp_path,  # the local shard cache, shared by the ranks on this "node"
        )
        batches = _epoch(loader, 3)
        assert len(batches) == len(loader)
        per_rank.append(np.concatenate(batches))
    assert len({len(ids) for ids in per_rank}) == 1  # equal shards
    seen = np.concatenate(per_rank)
    assert len(np.unique(seen)) == len(seen)  # disjoint
    assert len(seen) == (n // (world * 16)) * world * 16  # the whole (dropped-last) epoch


@pytest.mark.parametrize("stop", [0, 5, 11])
def test_exact_mid_epoch_resume_over_s3(s3_dataset: Any, stop: int) -> None:
    url, options, _ = s3_dataset
    kwargs = {"batch_size": 20, "seed": 5, "rank": 1, "world_size": 2, "format": "numpy",
              "cache_dir": False}  # fmt: skip
    full = _epoch(fl.open(url, storage_options=options).loader(**kwargs), 2)
    first = fl.open(url, storage_options=options).loader(**kwargs)
    first.set_epoch(2)
    iterator = iter(first)
    head = [next(iterator)["id"] for _ in range(stop)]
    state = json.loads(json.dumps(first.state_dict()))  # JSON-safe, as a checkpoint keeps it
    iterator.close()
    second = fl.open(url, storage_options=options).loader(**kwargs)
    second.load_state_dict(state)
    tail = [b["id"] for b in second]
    assert len(head) + len(tail) == len(full)
    for got, want in zip(head + tail, full, strict=True):
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- the CLI


def test_cli_convert_verify_inspect_stats_on_s3(
    s3_bucket: Any, tmp_path: Path, capsys: Any
) -> None:
    from feedline.cli.main import main

    src = tmp_path / "in.csv"
    src.write_text("id,x\n" + "".join(f"{i},{i / 2}\n" for i in range(40)))
    client = s3_bucket.storage_options["client_kwargs"]
    flags = [
        *("--storage-option", "key=testing", "--storage-option", "secret=testing"),
        *("--storage-option", f"client_kwargs.endpoint_url={client['endpoint_url']}"),
        *("--storage-option", "client_kwargs.region_name=us-east-1"),
        *("--storage-option", 'retry={"attempts": 3, "base_delay": 0.01}'),
    ]
    url = f"{s3_bucket.url}/cli-ds"
    assert main(["convert", str(src), url, "--quiet", *flags]) == 0
    assert _ids(fl.open(url, storage_options=s3_bucket.storage_options)) == list(range(40))
    assert main(["verify", url, "--quiet", *flags]) == 0
    assert main(["inspect", url, *flags]) == 0
    assert main(["stats", url, *flags]) == 0
    assert "40" in capsys.readouterr().out
    assert main(["verify", url, "--quiet"]) == 2  # no credentials: a clear error, exit 2
    assert main(["verify", url, "--storage-option", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


# --------------------------------------------------------------------------- one retry bound

#: the bound under test: every request is sent at most this many times, by whichever layer
BOUND = fl.RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02, jitter=0.0)


def _one_shard(url: str, options: dict[str, Any]) -> None:
    fl.from_arrow(pa.table({"id": np.arange(60, dtype=np.int64)})).write(
        url, rows_per_shard=100, storage_options=options
    )


def _open_manifest(url: str, options: dict[str, Any], _tmp: Path) -> None:
    fl.open(url, storage_options=options)


def _download_shard(url: str, options: dict[str, Any], tmp: Path) -> None:
    # the loader's shard cache downloads whole shards: feedline's own retry, nothing below
    loader = fl.open(url, storage_options=options).loader(
        batch_size=8, format="numpy", cache_dir=tmp / "cache"
    )
    list(loader)


def _upload_shard(url: str, options: dict[str, Any], _tmp: Path) -> None:
    _one_shard(url, options)  # botocore retries the PUT; feedline calls it once


def _commit_manifest(url: str, options: dict[str, Any], _tmp: Path) -> None:
    _one_shard(url, options)  # the conditional manifest PUT: feedline's retry, botocore once


@pytest.mark.parametrize(
    ("method", "key", "code", "operation"),
    [
        pytest.param("GET", "/_feedline.json", "ServiceUnavailable", _open_manifest, id="read"),
        pytest.param("GET", "/_feedline.json", "SlowDown", _open_manifest, id="read-slowdown"),
        pytest.param("GET", "/part-", "ServiceUnavailable", _download_shard, id="download"),
        pytest.param("PUT", "/part-", "ServiceUnavailable", _upload_shard, id="upload"),
        pytest.param("PUT", "/_feedline.json", "SlowDown", _commit_manifest, id="commit"),
    ],
)
def test_a_persistent_503_reaches_the_server_at_most_attempts_times(
    s3_bucket: Any, s3_proxy: Any, tmp_path: Path, method: str, key: str, code: str, operation: Any
) -> None:
    """botocore, s3fs and feedline each used to retry around the others (up to 5 x 5 x 5
    requests for one SlowDown); now exactly one layer retries each request."""
    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    url = f"{s3_bucket.url}/ds"
    if operation in (_open_manifest, _download_shard):
        _one_shard(url, s3_bucket.storage_options)  # written directly, not through the proxy
    proxy.add(Rule(method, key, status=503, code=code))  # persistent: every matching request
    options = {**proxied.storage_options, "retry": BOUND}
    with pytest.raises(fl.StorageError, match=r"after 3 attempts.*Fix:"):
        operation(url, options, tmp_path)
    assert proxy.count(method, key) == BOUND.attempts


def test_the_retry_bound_survives_pickling_to_engine_workers(s3_proxy: Any) -> None:
    import pickle

    from s3_proxy import Rule

    proxied, proxy = s3_proxy
    loc = resolve(f"{proxied.url}/k.bin", {**proxied.storage_options, "retry": BOUND})
    copy = pickle.loads(pickle.dumps(loc))
    proxy.add(Rule("HEAD", "/k.bin", status=503))
    with pytest.raises(fl.StorageError, match="after 3 attempts"):
        copy.fs.info(copy.path)  # a metadata call: botocore's retries, s3fs's loop off
    assert proxy.count("HEAD", "/k.bin") == BOUND.attempts


def test_botocore_attempts_cannot_be_set_beside_the_policy(s3_bucket: Any) -> None:
    options = {**s3_bucket.storage_options, "config_kwargs": {"retries": {"max_attempts": 9}}}
    with pytest.raises(fl.ConfigurationError, match=r"one bound.*Fix:"):
        resolve(s3_bucket.url, options)
    adaptive = {**s3_bucket.storage_options, "config_kwargs": {"retries": {"mode": "adaptive"}}}
    assert resolve(s3_bucket.url, adaptive).fs.backend_retries
