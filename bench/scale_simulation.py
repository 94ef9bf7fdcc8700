"""The 100-node open, order and commit at reduced size: requests, memory and bytes per rank.

Usage::

    git worktree add /tmp/h25-before 0dbe281      # the code before (issue 25, item 5)
    .venv/bin/python bench/scale_simulation.py [--shards 2000] [--ranks 100]
        [--sample-ranks 3] [--before /tmp/h25-before] [--rows 10**6,...,5*10**10]

Each side (``before``: the worktree ``--before``; ``after``: this checkout) runs in its own
process against its own S3 API (moto on loopback, behind a counting proxy:
``tests/s3_proxy.py``) and prints one JSON line of counts:

- ``write``: a dataset of ``--shards`` one-row-group shards written by the local engine
  (``fl.range(...).write("s3://...")``): requests of the whole write and of its commit step,
  and the bytes copied (S3 ``CopyObject``) at the commit;
- ``engine_commit``: the commit of a Ray write, simulated without a cluster: the Ray
  engine's own sink (``ShardSink.write``, what each write task runs) writes ``--shards``
  tasks' shards where the write tasks put them (the staging folder before; the dataset
  folder under final names after), then the driver's finishing step
  (``feedline.engines.ray.write._finalize``) and the commit: requests and bytes copied
  (the Spark engine's feedline writer does the same);
- ``open``: per simulated rank (a fresh S3 client each), the requests of ``fl.open`` plus
  ``ds.loader(...)`` (the open), and of the rank's first batch (``cache="none"``,
  ``cache_dir=False``: read straight from the bucket), the wall time of each. All
  ``--ranks`` ranks open on the ``after`` side; on the ``before`` side, whose per-rank
  requests grow with the shards, ``--sample-ranks`` of them (their counts are the same);
- ``manifest``: the manifest's bytes, and its size and parse time for 170,000 synthetic
  shards (format 1; and on ``after`` format 2, the compact shard table);
- ``order`` (``after`` only: both paths live there): peak memory (tracemalloc) of one rank's
  order for an exact shuffle of N rows among ``--ranks`` ranks: the whole permutation
  materialized then split (what every rank did before ``LAZY_ROWS``; up to 10**8 rows), and
  the lazy Feistel permutation evaluated at the rank's first 1,000 batches (every N) and at
  its whole share (up to 10**8 rows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, tracemalloc, uuid
side, shards, ranks, sample, rows_list, tests = sys.argv[1:7]
shards, ranks, sample = int(shards), int(ranks), int(sample)
sys.path.insert(0, tests)
import boto3, s3fs
from moto.server import ThreadedMotoServer
from s3_proxy import S3Proxy
import feedline as fl
import pyarrow as pa

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
proxy = S3Proxy(f"http://{host}:{port}").start()
copies = []
handle = proxy._handle
def counting(handler):
    if handler.headers.get("x-amz-copy-source"):
        copies.append(handler.path)
    handle(handler)
proxy._handle = counting
boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
             aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(
                 Bucket="bench")

def options():
    return {"key": "testing", "secret": "testing", "skip_instance_cache": True,
            "use_listings_cache": False,
            "client_kwargs": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1"}}

def mark():
    return len(proxy.requests), len(copies)

def since(start):
    return len(proxy.requests) - start[0], copies[start[1]:]

def copied_bytes(paths):
    fs = s3fs.S3FileSystem(**options())
    return sum(fs.size(p.split("?")[0].lstrip("/")) for p in paths)

out = {"side": side, "shards": shards}
rows_per_shard = 64
url = "s3://bench/ds"

# --- the local engine's write, and its commit step
import feedline.store.commit as commit_mod
commit_marks = {}
real_commit = commit_mod.commit
def timed_commit(write, manifest):
    commit_marks["start"] = mark()
    real_commit(write, manifest)
    commit_marks["end"] = mark()
commit_mod.commit = timed_commit
import feedline.store.dataset_files as files_mod
files_mod.commit = timed_commit
start = mark()
t0 = time.perf_counter()
fl.range(shards * rows_per_shard).write(url, rows_per_shard=rows_per_shard,
                                        storage_options=options())
write_s = time.perf_counter() - t0
requests, copied = since(start)
commit_requests = commit_marks["end"][0] - commit_marks["start"][0]
commit_copies = copies[commit_marks["start"][1]:commit_marks["end"][1]]
out["write"] = {"requests": requests, "commit_requests": commit_requests,
                "copies": len(commit_copies), "bytes_copied": copied_bytes(commit_copies),
                "seconds": round(write_s, 2)}
commit_mod.commit = files_mod.commit = real_commit

# --- a Ray write's finish and commit, without a cluster: the engine's own sink writes each
# task's shards (as its write tasks do), then the driver's _finalize and the commit
import inspect, types
from feedline.io.storage.paths import resolve
from feedline.engines.protocol import WriteOptions
from feedline.engines.ray import write as ray_write
from feedline.store.manifest import Manifest
schema = pa.schema({"id": pa.int64()})
target = resolve("s3://bench/engine", options())
with commit_mod.writing(target) as write:
    wopts = WriteOptions(rows_per_shard=rows_per_shard)
    if "into" in inspect.signature(ray_write.ShardSink.__init__).parameters:  # as write_plan
        into = None if target.is_local else write.shard_folder
        sink = ray_write.ShardSink(write.staging, schema, wopts, into, write.write_id)
    else:
        sink = ray_write.ShardSink(write.staging, schema, wopts)
    results = []
    for task in range(shards):
        block = pa.table({"id": pa.array(range(rows_per_shard), pa.int64())})
        results += sink.write([block], types.SimpleNamespace(task_idx=task))
    results.sort(key=lambda row: (row["task"], row["seq"]))
    start = mark()
    t0 = time.perf_counter()
    made = ray_write._finalize(write, results, None)
    commit_mod.commit(write, Manifest(schema, made))
    requests, copied = since(start)
out["engine_commit"] = {"requests": requests, "copies": len(copied),
                        "bytes_copied": copied_bytes(copied),
                        "shard_bytes": sum(s.bytes for s in made),
                        "seconds": round(time.perf_counter() - t0, 2)}

# --- the manifest
fs = s3fs.S3FileSystem(**options())
out["manifest"] = {"bytes": fs.size("bench/ds/_feedline.json")}
from feedline.store import manifest as manifest_mod
synthetic = [manifest_mod.ShardInfo(f"part-{i:05d}-0a1b2c3d4e5f.parquet", 300_000,
                                    300_000_000, (32768,) * 9 + (5_088,),
                                    "sha256:" + f"{i:064x}", "sha256:" + f"{i + 1:064x}", True)
             for i in range(170_000)]
big = manifest_mod.Manifest(pa.schema({"id": pa.int64(), "x": pa.binary()}), synthetic)
formats = {}
compact = getattr(manifest_mod, "COMPACT_SHARDS", None)
for label, limit in (("format1", 10**9), ("format2", 0)):
    if compact is None and label == "format2":
        continue
    if compact is not None:
        manifest_mod.COMPACT_SHARDS = limit
    text = big.to_json().encode()
    t0 = time.perf_counter()
    try:
        manifest_mod.Manifest.from_json(text, "synthetic")
        parse = round(time.perf_counter() - t0, 2)
    except fl.FormatError as exc:
        parse = str(exc)[:90]
    formats[label] = {"bytes": len(text), "parse_s": parse}
if compact is not None:
    manifest_mod.COMPACT_SHARDS = compact
out["manifest"]["170k_shards"] = formats

# --- open per rank
ranks_run = range(ranks) if side == "after" else sorted({0, ranks // 2, ranks - 1})[:sample]
per_rank = []
for rank in ranks_run:
    start = mark()
    t0 = time.perf_counter()
    ds = fl.open(url, storage_options=options())
    loader = ds.loader(batch_size=32, shuffle=True, seed=0, rank=rank, world_size=ranks,
                       cache="none", cache_dir=False, format="numpy", shuffle_window=8)
    open_requests = len(proxy.requests) - start[0]
    open_s = time.perf_counter() - t0
    first = next(iter(loader))
    per_rank.append({"rank": rank, "open": open_requests,
                     "first_batch": len(proxy.requests) - start[0] - open_requests,
                     "open_s": round(open_s, 3),
                     "first_batch_s": round(time.perf_counter() - t0 - open_s, 3)})
    if hasattr(loader, "close"):
        loader.close()
out["open"] = {
    "ranks_simulated": len(per_rank),
    "open_requests": sorted({r["open"] for r in per_rank}),
    "first_batch_requests": sorted({r["first_batch"] for r in per_rank}),
    "open_s_median": sorted(r["open_s"] for r in per_rank)[len(per_rank) // 2],
    "first_batch_s_median": sorted(r["first_batch_s"] for r in per_rank)[len(per_rank) // 2],
}

# --- order memory per rank
if side == "after":
    from feedline.loader.order.lazy_permutation import LazyPermutation
    from feedline.loader.order.sample_order import _positions, epoch_permutation, split_for_rank
    order = {}
    batch = 256
    for n in [int(eval(r)) for r in rows_list.split(",")]:
        rank = ranks - 1
        row = {}
        if n <= 10**8:  # materialized: 8 bytes a row and more (10**9: 7.6 GB, BENCHMARKS.md)
            tracemalloc.start()
            perm = epoch_permutation(n, 0, 0)
            plan = split_for_rank(perm, rank=rank, world_size=ranks, batch_size=batch,
                                  drop_last=True)
            first = plan.indices[: 1000 * batch].copy()
            row["materialized_mb"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
            tracemalloc.stop()
            del perm, plan
        share = n // (ranks * batch)
        counts = [("lazy_first_1000_batches_mb", min(1000, share))]
        if n <= 10**8:
            counts.append(("lazy_share_mb", share))
        for label, count in counts:
            tracemalloc.start()
            lazy = LazyPermutation(n, 0, 0).take(_positions(rank, count * batch, ranks, batch))
            row[label] = round(tracemalloc.get_traced_memory()[1] / 2**20, 2)
            tracemalloc.stop()
            assert lazy.size == count * batch and int(lazy.max()) < n
        order[str(n)] = row
    out["order"] = order

proxy.stop()
server.stop()
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=100)
    parser.add_argument("--sample-ranks", type=int, default=3)
    parser.add_argument("--before", default="/tmp/h25-before")
    parser.add_argument("--rows", default="10**6,10**7,10**8,10**9,5*10**10")
    parser.add_argument("--sides", default="before,after")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    roots = {"before": Path(args.before).resolve(), "after": here}
    for side in args.sides.split(","):
        root = roots[side]
        argv = [side, args.shards, args.ranks, args.sample_ranks, args.rows, here / "tests"]
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, *map(str, argv)],
            capture_output=True,
            text=True,
            cwd=root,
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
            check=False,
        )
        if done.returncode:
            print(json.dumps({"side": side, "error": done.stderr.strip().splitlines()[-5:]}))
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["wall_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
