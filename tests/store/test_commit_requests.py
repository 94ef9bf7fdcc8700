"""The commit on S3: no copy of a shard, and requests that do not grow with the shards
(issue 25, item 5)."""

from __future__ import annotations

from typing import Any

import pytest

import feedline as fl
import feedline.store.dataset_files as dataset_files


@pytest.mark.timeout(120)
def test_commit_on_s3_copies_nothing_and_its_requests_do_not_grow(s3_proxy, monkeypatch):
    """The local engine writes shards under their final names; the commit lists the staging
    folder and the dataset once (it checked each shard with existence requests before: about
    three per shard) and writes the manifest conditionally."""
    bucket, proxy = s3_proxy
    counts = {}
    real = dataset_files.commit

    def counted(write: Any, manifest: Any) -> None:
        start = len(proxy.requests)
        real(write, manifest)
        counts[len(manifest.shards)] = len(proxy.requests) - start

    monkeypatch.setattr(dataset_files, "commit", counted)
    for shards in (3, 12):
        url = f"{bucket.url}/ds{shards}"
        fl.range(shards * 4).write(url, rows_per_shard=4, storage_options=bucket.storage_options)
        assert fl.open(url, storage_options=bucket.storage_options).count() == shards * 4
    assert proxy.copies == []
    assert counts[3] == counts[12], counts
