"""Staged epochs (``cache="staged"``) against the node cache and the two-level stream, in
memory cgroups, on 1 node with data 2x its memory and on 2 simulated nodes.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/staged_shuffle.py --mb 600

Data: ``--mb`` MB of rows of ``id`` (int64) and ``x`` = float32[3072] (12 KiB, as in issue
25's table; random, so zstd does not shrink it), in id order, row groups of ``--group``
rows, 8 shards. Each reader runs in its own process inside a fresh cgroup-v1 memory cgroup
(needs root) whose limit is the process's memory after its imports plus ``--memory`` MB
(default: half the data): page cache (read or mapped files, the staged files' too) and the
loader's own memory are charged to it, as on a
machine of that size. ``memory_budget`` is the loader's default, ``"auto"`` (a quarter of
what the cgroup leaves). The data files' pages are dropped before each reader starts.

Readers (batches of 256, numpy, ``--epochs`` epochs or ``--seconds``, whichever ends first;
``--step-ms``: a training step per batch that leaves the CPU, as a GPU's does):

* ``node``: ``cache="node"`` (exact), its file filled beforehand outside the cgroups;
* ``stream``: ``cache="none"``, the two-level shuffle;
* ``staged``: ``cache="staged"`` (exact), epoch 0 staged before its first batch, epoch 1 in
  the background while epoch 0 is read (with one rank, from epoch 0's buckets as they are
  read; with several, from the dataset).

Setups: ``1 node`` (world_size 1) and ``2 nodes`` (world_size 2, one rank per node, each in
its own cgroup with its own cache folder; the staged ranks share an exchange folder); with
``--ranks-per-node R``, each node's R ranks share its cgroup (``--memory`` for the node, set
by its first rank) and its cache folder, as local ranks of one machine do.

Reported per rank: samples/s over the epochs read and after epoch 0 (``steady``: the
staged path stages epoch 0 before its first batch, later ones while the one before is
read), the first batch's latency, the bytes
read from the dataset per epoch (the loader's count for stream and staged; for the node
cache the whole file is read into each node), the process's storage reads and writes per
epoch (``/proc/self/io``: includes the staging files), each epoch's staging time and
whether it was hidden, the cgroup's peak and whether it was OOM-killed; and the shuffle
quality: the mean chi-square of the dataset decile of each batch's samples (an exact
permutation ~9; 9 degrees of freedom) with the share of batches failing p < 0.01
(chi-square > 21.67), and the mean number of distinct row groups per batch. Results go to
``bench/out/staged_shuffle.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parent / "out" / "staged_shuffle.json"
MEMORY = Path("/sys/fs/cgroup/memory")
WIDTH = 3072
ROW_BYTES = WIDTH * 4 + 8
BATCH = 256
SEED = 5
CHI2_P01 = 21.666  # chi-square, 9 degrees of freedom, p = 0.01


def make_data(path: Path, mb: float, group: int) -> int:
    import pyarrow as pa

    import feedline as fl

    rows = int(mb * 1e6 // ROW_BYTES) // group * group
    if (path / "_feedline").exists() or (path.exists() and any(path.glob("*.parquet"))):
        return fl.open(path).count()
    shutil.rmtree(path, ignore_errors=True)
    ids = np.arange(rows, dtype=np.int64)
    x = np.random.default_rng(0).random((rows, WIDTH), dtype=np.float32)  # incompressible
    table = pa.table({"id": ids, "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x)})
    fl.from_arrow(table).write(path, rows_per_shard=-(-rows // 8), row_group_rows=group)
    return rows


@contextlib.contextmanager
def memory_cgroup(name: str) -> Iterator[Path]:
    """A fresh cgroup-v1 memory cgroup under this process's own; removed at the end."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = next((ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1] == "memory"), None)
    if own is None or not (MEMORY / "memory.limit_in_bytes").exists():
        raise SystemExit("this bench needs a cgroup-v1 memory controller (and root)")
    group = MEMORY / own.lstrip("/") / f"feedline-staged-{os.getpid()}-{name}"
    group.mkdir()
    try:
        yield group
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def evict(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _io() -> dict[str, int]:
    rows = (line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {k: int(v) for k, v in rows}


def quality(batches: list[np.ndarray], rows: int, group: int) -> dict[str, float]:
    """Mean chi-square of each batch's dataset deciles, share failing p<0.01, and the mean
    number of distinct row groups per batch."""
    chi, fails, groups = [], 0, []
    for ids in batches:
        if len(ids) < BATCH:
            continue
        counts = np.bincount(ids * 10 // rows, minlength=10)
        expected = len(ids) / 10
        value = float(((counts - expected) ** 2 / expected).sum())
        chi.append(value)
        fails += value > CHI2_P01
        groups.append(len(np.unique(ids // group)))
    return {"chi2_mean": float(np.mean(chi)), "chi2_fail_share": fails / max(1, len(chi)),
            "row_groups_per_batch": float(np.mean(groups))}  # fmt: skip


def reader(args: argparse.Namespace, name: str, rank: int, world: int, group_path: str,
           cache_dir: str, stage_dir: str) -> dict[str, Any]:  # fmt: skip
    """In the reader process: join the cgroup, cap it, read, report."""
    import pyarrow.parquet  # noqa: F401  (imports charged outside the cgroup, for every reader)

    import feedline as fl
    import feedline.loader.loader

    fl.open(args.data).count()
    cgroup = Path(group_path)
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    if rank % args.ranks_per_node == 0:  # the node's first rank caps the node's cgroup
        base = int((cgroup / "memory.usage_in_bytes").read_text())
        (cgroup / "memory.limit_in_bytes").write_text(str(base + int(args.memory * 1e6)))
    deadline = time.monotonic() + 60  # the others wait for the cap (reported below)
    while (limit := int((cgroup / "memory.limit_in_bytes").read_text())) >= 1 << 60:
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: the node's first rank did not cap {cgroup}")
        time.sleep(0.05)
    ds = fl.open(args.data)
    rows = ds.count()
    kw: dict[str, Any] = {"batch_size": BATCH, "seed": SEED, "format": "numpy",
                          "rank": rank, "world_size": world, "cache_dir": cache_dir}  # fmt: skip
    if name == "staged":
        kw |= {"cache": "staged", "ranks_per_node": args.ranks_per_node, "stage_dir": stage_dir}
    else:
        kw |= {"cache": name}
    loader = ds.loader(**kw)
    if rank % args.ranks_per_node == 0:
        data_files = sorted(Path(args.data).glob("*.parquet"))
        evict(data_files + sorted(Path(cache_dir).rglob("*.flcache")))
    io0, start = _io(), time.perf_counter()
    first, seen, batches, epochs = None, 0, [], 0
    epoch_ends: list[tuple[float, int]] = []  # (seconds, samples) at each epoch's end
    deadline = start + args.seconds
    for _ in range(args.epochs):
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            ids = np.asarray(batch["id"])
            batches.append(ids.copy())
            if args.step_ms:  # a training step that leaves the CPU (a GPU's)
                time.sleep(args.step_ms / 1000)
            seen += len(ids)
            if time.perf_counter() > deadline:
                break
        else:
            epochs += 1
            epoch_ends.append((time.perf_counter() - start, seen))
            continue
        break
    seconds = time.perf_counter() - start
    steady = None  # after epoch 0 (whose staging comes before its first batch)
    if epoch_ends and seconds > epoch_ends[0][0] and seen > epoch_ends[0][1]:
        steady = (seen - epoch_ends[0][1]) / (seconds - epoch_ends[0][0])
    io1 = _io()
    source = loader._prepare().source
    if hasattr(source, "join"):  # the epoch staged ahead: its time, once done
        source.join(600)
    memory_stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    stats = loader.stats()
    per_epoch = max(seen / max(1, rows // world), 1e-9)
    if name == "staged":
        staged = stats["staged_epochs"]
        done = [s for s in staged if s["epoch"] < epochs or s["stage_s"] > 0]
        dataset = sum(s["stage_bytes_read"] for s in done) / max(1, len(done))
    elif name == "none":
        dataset = rows * ROW_BYTES  # every rank streams every row group each epoch
    else:
        dataset = rows * ROW_BYTES  # the node cache holds (and pages in) every row
    out = {
        "reader": name, "rank": rank, "world_size": world, "rows": rows, "step_ms": args.step_ms,
        "samples": seen, "seconds": seconds, "samples_per_s": seen / seconds,
        "steady_samples_per_s": steady,
        "first_batch_s": first, "epochs_read": seen / max(1, rows // world),
        "dataset_bytes_per_epoch": dataset,
        "io_read_bytes_per_epoch": (io1["read_bytes"] - io0["read_bytes"]) / per_epoch,
        "io_write_bytes_per_epoch": (io1["write_bytes"] - io0["write_bytes"]) / per_epoch,
        "memory_limit_bytes": limit, "memory_budget": loader.memory_budget,
        "peak_bytes": int((cgroup / "memory.max_usage_in_bytes").read_text()),
        "limit_hits": int((cgroup / "memory.failcnt").read_text()),
        "anon_bytes_end": int(memory_stat["total_rss"]),
        "shuffle_mode": stats["shuffle_mode"], "shuffle_window": stats["shuffle_window"],
        "load_avg_1m": os.getloadavg()[0],
    } | quality(batches, rows, args.group)  # fmt: skip
    if name == "staged":
        out["staging"] = [{k: s[k] for k in ("epoch", "stage_s", "stage_wait_s",
                                              "stage_hidden", "stage_rows_read")}
                          for s in stats["staged_epochs"]]  # fmt: skip
    # exactness: the batches are cache="memory"'s order
    from feedline.loader.order.stage_routes import stage_plan

    if name != "none":
        sizes = ds.shard_source().row_group_sizes
        plan = [
            stage_plan(sizes, epoch=e, shuffle=True, seed=SEED, world_size=world,
                       batch_size=BATCH, drop_last=True, pad_last=False).plan(rank)
            for e in range(epochs + 1)
        ]  # fmt: skip
        got = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        want = np.concatenate(plan)[: got.size]
        out["exact_order"] = bool(np.array_equal(got, want))
    return out


def run_setup(args: argparse.Namespace, name: str, world: int, work: Path) -> list[dict]:
    """``world`` readers of ``name`` at once, each node's (``--ranks-per-node`` of them) in
    its own cgroup with its own cache folder; their reports."""
    stage_dir = work / f"exchange-{name}-{world}"
    shutil.rmtree(stage_dir, ignore_errors=True)
    per_node = args.ranks_per_node
    with contextlib.ExitStack() as stack:
        procs = []
        for rank in range(world):
            node = rank // per_node
            if rank % per_node == 0:
                group = stack.enter_context(memory_cgroup(f"{name}-{world}-{node}"))
            cache_dir = work / f"node{node}"
            if name == "staged" and rank % per_node == 0:
                shutil.rmtree(cache_dir / "staged", ignore_errors=True)
            command = [sys.executable, __file__, "--step-ms", str(args.step_ms), "--data",
                       str(args.data), "--memory",
                       str(args.memory), "--epochs", str(args.epochs), "--seconds",
                       str(args.seconds), "--group", str(args.group), "--ranks-per-node",
                       str(per_node), "--reader", name, str(rank), str(world), str(group),
                       str(cache_dir), str(stage_dir)]  # fmt: skip
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        results = []
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate()
            if proc.returncode != 0:
                code = proc.returncode
                results.append({"reader": name, "rank": rank, "world_size": world,
                                "failed": code, "oom_killed": code == -9})  # fmt: skip
            else:
                results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=600.0, help="data size, MB")
    parser.add_argument(
        "--memory",
        type=float,
        default=None,
        help="MB each cgroup may hold after the imports (default: mb / 2)",
    )
    parser.add_argument("--group", type=int, default=500, help="rows per row group")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0, help="per reader, at most")
    parser.add_argument("--readers", default="node,none,staged")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="a training step per batch (sleep), ms")  # fmt: skip
    parser.add_argument("--worlds", default="1,2")
    parser.add_argument("--ranks-per-node", type=int, default=1,
                        help="ranks sharing a node (its cgroup, its cache folder)")  # fmt: skip
    parser.add_argument("--work", default="/tmp/bench/staged_shuffle")
    parser.add_argument("--data", default=None)
    parser.add_argument("--reader", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        name, rank, world, group, cache_dir, stage_dir = args.reader
        print(json.dumps(reader(args, name, int(rank), int(world), group, cache_dir,
                                stage_dir)), flush=True)  # fmt: skip
        return
    import feedline as fl

    work = Path(args.work)
    data = work / f"data-{args.mb:g}mb-{args.group}-random"
    args.data = str(data)
    if args.memory is None:
        args.memory = args.mb / 2
    started = time.perf_counter()
    rows = make_data(data, args.mb, args.group)
    print(f"data: {rows:,} rows, {rows * ROW_BYTES / 1e6:.0f} MB in "
          f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    worlds = [int(w) for w in args.worlds.split(",")]
    if "node" in args.readers:  # filled outside the cgroups, one copy per simulated node
        first = work / "node0"
        fl.open(data).loader(cache="node", cache_dir=first, batch_size=BATCH).stats()
        for node in range(1, max(worlds) // args.ranks_per_node):
            if not (work / f"node{node}" / "node").exists():
                shutil.copytree(first / "node", work / f"node{node}" / "node")
    results: dict[str, Any] = {"rows": rows, "data_bytes": rows * ROW_BYTES,
                               "memory_mb": args.memory, "runs": []}  # fmt: skip
    for world in worlds:
        for name in args.readers.split(","):
            got = run_setup(args, name, world, work)
            results["runs"].extend(got)
            for r in got:
                brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                         if k not in ("staging",)}  # fmt: skip
                print(json.dumps(brief), flush=True)
                if "staging" in r:
                    print("   staging:", json.dumps(r["staging"]), flush=True)
    OUT.parent.mkdir(exist_ok=True)
    out = OUT.with_name(f"staged_shuffle{'-step' if args.step_ms else ''}.json")
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
