"""Shared helpers for the foundation tests: small input files written into ``tmp_path``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import settings

import feedline as fl

# The suite's property tests draw the same examples on every run ("derandomize"), so a
# submission's CI cannot fail on an example no earlier run drew; a failing example found by
# exploring is added to its test with ``@example``. Explore with new random examples:
# ``HYPOTHESIS_PROFILE=explore make test`` (or ``pytest`` with that variable set).
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


@pytest.fixture
def engine() -> fl.LocalEngine:
    """A local engine with a fixed, small number of workers (the same on every machine)."""
    return fl.LocalEngine(parallelism=4, memory_budget="64MB")


@pytest.fixture
def parquet_folder(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``n_files`` Parquet files holding consecutive ``id`` values.

    File ``i`` holds ids ``i * rows .. (i + 1) * rows - 1`` and a float column ``x = id / 2``,
    written with ``row_group_size`` rows per row group. Returns the folder.
    """

    def make(
        n_files: int = 3,
        rows: int = 100,
        row_group_size: int | None = None,
        name: str = "pq",
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for i in range(n_files):
            ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
            table = pa.table({"id": ids, "x": ids / 2})
            pq.write_table(table, folder / f"part-{i:04d}.parquet", row_group_size=row_group_size)
        return folder

    return make


# --------------------------------------------------------------------------- S3 on loopback


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API served by moto on 127.0.0.1 (a free port), for the whole session.

    Nothing leaves the machine: s3fs talks HTTP to this server as it would to AWS.
    """
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@dataclass(frozen=True)
class S3Bucket:
    """A fresh, empty bucket on the loopback S3 server.

    ``url`` is ``s3://<bucket>``; ``storage_options`` is what feedline's ``storage_options=``
    arguments take; ``fs()`` returns an s3fs filesystem for setting up and inspecting.
    """

    url: str
    endpoint: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)


def s3_options(endpoint: str) -> dict[str, Any]:
    """s3fs options for the loopback server (fixed test credentials, no listing cache)."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "use_listings_cache": False,
    }


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> S3Bucket:
    """A new bucket per test (a random name, so tests never see each other's data)."""
    name = f"feedline-{uuid.uuid4().hex[:12]}"
    bucket = S3Bucket(f"s3://{name}", s3_endpoint, s3_options(s3_endpoint))
    import boto3  # s3fs sends a LocationConstraint that us-east-1 refuses; boto3 does not

    boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=name)
    return bucket


@pytest.fixture
def s3_proxy(s3_bucket: S3Bucket) -> Iterator[tuple[S3Bucket, Any]]:
    """``s3_bucket`` reached through a loopback HTTP proxy (tests/s3_proxy.py) that counts the
    requests the server receives and injects faults; returns (that bucket seen through the
    proxy, the proxy). ``s3_bucket`` itself still talks to the server directly."""
    from s3_proxy import S3Proxy

    proxy = S3Proxy(s3_bucket.endpoint).start()
    try:
        yield S3Bucket(s3_bucket.url, proxy.endpoint, s3_options(proxy.endpoint)), proxy
    finally:
        proxy.stop()
