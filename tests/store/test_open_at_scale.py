"""Opening a dataset of many shards: requests per rank that do not grow with the shards, and
footer checks made with each shard's first read instead of all of them on open (issue 25, 5).

The checks themselves are unchanged: every shard's footer is checked against the manifest
(size, footer digest, rows, row groups, schema) before any row of it is used.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
import feedline.store.dataset_files as dataset_files
from feedline.store.manifest import MANIFEST_NAME, schema_to_json


def _write(path: Any, shards: int, storage_options: dict[str, Any] | None = None) -> None:
    fl.range(shards * 8).write(
        path, rows_per_shard=8, row_group_rows=4, storage_options=storage_options
    )


def _open_and_first_batch(proxy: Any, url: str, options: dict[str, Any]) -> tuple[int, int]:
    """Requests of one rank's open (``fl.open`` and ``ds.loader``) and of its first batch."""
    start = len(proxy.requests)
    ds = fl.open(url, storage_options=options)
    loader = ds.loader(
        batch_size=4, shuffle=True, seed=0, rank=1, world_size=4, cache="none",
        cache_dir=False, format="numpy", shuffle_window=2, prefetch=0,
    )  # fmt: skip
    opened = len(proxy.requests)
    listings = [path for _, path in proxy.requests[start:opened] if "list-type" in path]
    assert listings == []  # a listing grows with the objects (a page per thousand)
    next(iter(loader))
    return opened - start, len(proxy.requests) - opened


@pytest.mark.timeout(120)
def test_requests_of_an_open_and_first_batch_do_not_grow_with_the_shards(s3_proxy, monkeypatch):
    """On S3 (moto, behind a counting proxy): a rank opening a dataset of 6 or of 24 shards
    (over EAGER_FOOTER_SHARDS, lowered to 4 here) makes the same few requests, none of them a
    listing, and so does its first batch. Before, the open listed the folder and checked
    every footer: 2 requests per shard."""
    monkeypatch.setattr(dataset_files, "EAGER_FOOTER_SHARDS", 4)
    bucket, proxy = s3_proxy
    counts = {}
    for shards in (6, 24):
        url = f"{bucket.url}/ds{shards}"
        _write(url, shards, bucket.storage_options)
        counts[shards] = _open_and_first_batch(proxy, url, bucket.storage_options)
    (open_small, first_small), (open_large, first_large) = counts[6], counts[24]
    assert open_small == open_large <= 4, counts  # the manifest's HEAD and GET
    assert first_small == first_large, counts


def test_small_datasets_still_check_every_footer_on_open(tmp_path):
    out = tmp_path / "ds"
    _write(out, 3)
    doc = json.loads((out / MANIFEST_NAME).read_text())
    doc["shards"][2]["footer"] = "sha256:" + "0" * 64
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(fl.IntegrityError, match=doc["shards"][2]["path"]):
        fl.open(out)


def _footer(doc: dict) -> None:
    doc["shards"][1]["footer"] = "sha256:" + "0" * 64


def _row_groups(doc: dict) -> None:
    doc["shards"][1]["row_groups"] = [2, 6]


def _rows_moved(doc: dict) -> None:  # the totals still add up
    doc["shards"][1].update(rows=9, row_groups=[5, 4])
    doc["shards"][2].update(rows=7, row_groups=[4, 3])


def _schema(doc: dict) -> None:
    doc["schema"] = schema_to_json(pa.schema({"id": pa.int32()}))


def _huge(doc: dict) -> None:
    doc["shards"][1].update(rows=2**40, row_groups=[2**39, 2**39])
    del doc["rows"]


def _swapped_file(doc: dict, folder: Any) -> None:
    pq.write_table(pa.table({"id": list(range(8))}), folder / doc["shards"][1]["path"])


@pytest.mark.parametrize(
    "lie",
    [_footer, _row_groups, _rows_moved, _schema, _huge, _swapped_file],
)
@pytest.mark.parametrize("how", ["to_arrow", "memory", "none", "node", "count_rows"])
def test_footers_checked_on_first_read_keep_every_guarantee(tmp_path, monkeypatch, lie, how):
    """With the footers checked lazily (every dataset here), a manifest that lies about a
    shard, or a shard swapped for another file, is still refused before any row of it is
    used, by every reader: a FeedlineError naming the shard, never rows."""
    monkeypatch.setattr(dataset_files, "EAGER_FOOTER_SHARDS", 0)
    out = tmp_path / "ds"
    _write(out, 4)
    doc = json.loads((out / MANIFEST_NAME).read_text())
    if lie is _swapped_file:
        lie(doc, out)
    else:
        lie(doc)
        (out / MANIFEST_NAME).write_text(json.dumps(doc))
    ds = fl.open(out)  # no footer read here
    # a lie about sizes may be refused by the loader's memory and disk checks before a read
    named = r"part-\d{5}" if lie is not _huge else "Fix:"
    with pytest.raises(fl.FeedlineError, match=named):
        if how == "to_arrow":
            ds.to_arrow()
        elif how == "count_rows":
            sum(batch.num_rows for batch in ds.iter_batches())
        else:
            kwargs = {"cache_dir": tmp_path / "cache"} if how == "node" else {}
            list(ds.loader(batch_size=4, cache=how, format="numpy", **kwargs))
    with pytest.raises(fl.FeedlineError):
        fl.verify(out)
