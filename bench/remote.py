"""Loader throughput from ``s3://`` (moto on loopback): shard cache cold and warm vs pyarrow+s3fs.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/remote.py [--rows 1000000] [--shards 8]

Starts a moto S3 server in a separate process (``python -m moto.server``) on 127.0.0.1, writes
``--rows`` rows of ``id`` (int64) and ``x`` (float32[32] tensor) there as a feedline dataset of
``--shards`` shards (row groups of up to 65,536 rows), and times one shuffled epoch (batch 256,
NumPy batches; the median of ``--repeat`` runs, each cold run in a fresh cache folder) of:

- feedline with the shard cache cold (an empty cache folder) and warm (the same folder again),
  cache="memory" (exact permutation) and cache="none" (streaming, two-level shuffle over pools
  of ``--window`` row groups);
- feedline reading S3 directly (``cache_dir=False``);
- the baseline: plain ``pyarrow.parquet.read_table`` of every shard over s3fs (4 threads, as
  many as feedline's cache load), then a NumPy permutation and one ``np.take`` per batch.

Reports samples/s over the epoch (time from creating the loader to its last batch) and the
time to the first batch; writes ``bench/out/remote.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import feedline as fl

BATCH = 256
DIM = 32


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    """A moto S3 server in its own process (it does not share the GIL with the loader)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the moto server did not start")


def storage_options(endpoint: str) -> dict[str, Any]:
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "use_listings_cache": False,
    }


def make_data(url: str, rows: int, shards: int, options: dict[str, Any]) -> fl.Dataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, DIM), dtype=np.float32)
    table = pa.table(
        {"id": np.arange(rows, dtype=np.int64), "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x)}
    )
    per_shard = -(-rows // shards)
    fl.from_arrow(table).write(url, rows_per_shard=per_shard, row_group_rows=min(per_shard, 65536),
                               storage_options=options)  # fmt: skip
    return fl.open(url, storage_options=options)


def time_epoch(make_batches) -> dict[str, float]:
    """Seconds to the first batch and for the whole epoch; checks every id came once."""
    start = time.perf_counter()
    first, seen, n = None, [], 0
    for batch in make_batches():
        if first is None:
            first = time.perf_counter() - start
        seen.append(np.asarray(batch["id"]))
        n += len(batch["id"])
    total = time.perf_counter() - start
    ids = np.concatenate(seen)
    assert np.unique(ids).size == ids.size, "a sample was repeated"
    return {"first_batch_s": first or total, "epoch_s": total, "samples": n,
            "samples_per_s": n / total}  # fmt: skip


def median_run(run, repeat: int) -> dict[str, float]:
    """The run (a fresh call each time) with the median epoch time of ``repeat``."""
    runs = sorted((run(k) for k in range(repeat)), key=lambda r: r["epoch_s"])
    return runs[len(runs) // 2]


def feedline_run(
    ds: fl.Dataset, cache: str, cache_dir: Any, window: int | None = None
) -> dict[str, float]:
    def batches():
        loader = ds.loader(batch_size=BATCH, format="numpy", cache=cache, cache_dir=cache_dir,
                           cache_limit="50GB", seed=1, shuffle_window=window)  # fmt: skip
        yield from loader
        batches.stats = loader.stats()

    result = time_epoch(batches)
    stats = getattr(batches, "stats", {})
    result["downloads"] = stats.get("shard_downloads", 0)
    return result


def baseline_run(ds: fl.Dataset, url: str, options: dict[str, Any]) -> dict[str, float]:
    import s3fs

    def batches():
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        paths = [f"{url.removeprefix('s3://')}/{s.path}" for s in ds.manifest.shards]
        with ThreadPoolExecutor(4) as pool:
            tables = list(pool.map(lambda p: pq.read_table(p, filesystem=fs), paths))
        table = pa.concat_tables(tables)
        ids = table["id"].to_numpy()
        x = np.concatenate([c.to_numpy_ndarray() for c in table["x"].chunks])
        order = np.random.default_rng(1).permutation(len(ids))
        for i in range(0, len(order) - BATCH + 1, BATCH):
            idx = order[i : i + BATCH]
            yield {"id": np.take(ids, idx), "x": np.take(x, idx, axis=0)}

    return time_epoch(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (median shown)")
    parser.add_argument("--window", type=int, default=2, help="row groups per streaming pool")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "remote.json"))
    args = parser.parse_args()
    server, endpoint = start_moto()
    work = Path(tempfile.mkdtemp(prefix="feedline-bench-remote-"))
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="bench")  # fmt: skip
        options = storage_options(endpoint)
        url = "s3://bench/ds"
        started = time.perf_counter()
        ds = make_data(url, args.rows, args.shards, options)
        mb = ds.manifest.bytes / 1e6
        print(f"wrote {args.rows} rows, {args.shards} shards, {mb:.1f} MB to {url} in "
              f"{time.perf_counter() - started:.1f} s (moto at {endpoint})")  # fmt: skip
        results: dict[str, dict[str, float]] = {}
        r = args.repeat
        results["pyarrow+s3fs (read all, shuffle-gather)"] = median_run(
            lambda k: baseline_run(ds, url, options), r
        )
        results["feedline direct (cache_dir=False)"] = median_run(
            lambda k: feedline_run(ds, "memory", False), r
        )
        for cache, window in (("memory", None), ("none", args.window)):
            label = f"cache={cache!r}" + (f", window={window}" if window else "")
            results[f"feedline cold cache, {label}"] = median_run(
                lambda k, c=cache, w=window: feedline_run(ds, c, work / f"{c}-{k}", w), r
            )
            results[f"feedline warm cache, {label}"] = median_run(
                lambda k, c=cache, w=window: feedline_run(ds, c, work / f"{c}-0", w), r
            )
        report(results, args, mb)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, dict[str, float]], args: argparse.Namespace, mb: float) -> None:
    base = results["pyarrow+s3fs (read all, shuffle-gather)"]
    print(f"\n{'run':44} {'samples/s':>12} {'first batch s':>14} {'epoch s':>9} "
          f"{'vs baseline':>12} {'downloads':>10}")  # fmt: skip
    for name, r in results.items():
        ratio = r["samples_per_s"] / base["samples_per_s"]
        print(f"{name:44} {r['samples_per_s']:12,.0f} {r['first_batch_s']:14.3f} "
              f"{r['epoch_s']:9.2f} {ratio:11.2f}x {int(r.get('downloads', 0)):10d}")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"rows": args.rows, "shards": args.shards, "megabytes": mb, "batch_size": BATCH,
           "repeat": args.repeat, "window": args.window, "cpus": os.cpu_count(),
           "results": results}  # fmt: skip
    out.write_text(json.dumps(doc, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
