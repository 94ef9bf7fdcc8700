"""Shuffled training-loader throughput: feedline vs its peers, same data, one run.

Usage::

    bash bench/setup_peers.sh        # once: peer venvs under bench/.venvs/ (git-ignored)
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py [--quick]

Two datasets are written once by feedline (4 Parquet shards each, zstd) and every loader
reads those same shards:

* **A** (tabular): 1M rows, ``x`` = one ``arrow.fixed_shape_tensor`` column of 32 float32
  features per row (a batch is a ``(256, 32)`` float32 tensor) and ``label`` int64.
* **B** (images): 100k rows, ``image`` = ``fixed_shape_tensor`` uint8 ``[3, 64, 64]`` and
  ``label`` int64.

Batch size 256, shuffled, batches as torch tensors. Every loader runs in its own subprocess
(its own venv when its pins need one) so its peak RSS is its own. Per loader: time to the first
batch (from building the loader, after imports, to the first batch in hand: it includes any
load or conversion), samples/s after the first batch over whole epochs (at least one, more
until ``--min-seconds``; a loader still short of one epoch after ``--cap-seconds`` is stopped
and its rate taken over the part it did), rows received per complete epoch (Petastorm is known
to drop row groups), the process's peak RSS and its RSS right after imports, and for
multi-process loaders the sampled peak of the whole process tree's RSS (shared pages counted
once per process).

The raw-gather ceiling runs in feedline's process after it: ``torch.from_numpy(np.take(a,
idx, axis=0))`` per column over the loader's own cached arrays and the very same per-epoch
index arrays (``feedline.loader.order.global_order``), one batch at a time.

Prints a rich table and a markdown section for BENCHMARKS.md; writes ``bench/out/loader.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venvs"
OUT = HERE / "out" / "loader.json"
BATCH = 256
SEED = 0
SHARDS = 4
#: Ray Data and Petastorm shuffle through a buffer of this fraction of the dataset's rows
SHUFFLE_BUFFER_FRACTION = 0.1

DATA: dict[str, dict[str, Any]] = {
    "A": {
        "title": "A: tabular, 32 float32 features + int64 label",
        "rows": 1_000_000,
        "quick_rows": 100_000,
        "feature": "x",
        "shape": [32],
        "dtype": "float32",
    },
    "B": {
        "title": "B: images 3x64x64 uint8 + int64 label",
        "rows": 100_000,
        "quick_rows": 10_000,
        "feature": "image",
        "shape": [3, 64, 64],
        "dtype": "uint8",
    },
}

# name, venv ("" = the interpreter running this script), description, multi-process
RUNNERS: list[tuple[str, str, str]] = [
    ("feedline", "", "feedline Loader(cache='auto', shuffle=True, format='torch')"),
    ("torch-dl-w0", "", "torch DataLoader, pandas map-style Dataset, RandomSampler, workers=0"),
    ("torch-dl-w2", "", "torch DataLoader, pandas map-style Dataset, RandomSampler, workers=2"),
    ("hf-datasets", "peers", "HF datasets from_parquet -> shuffle -> with_format('torch').iter"),
    ("tf-data", "", "tf.data from_tensor_slices(pyarrow arrays) -> shuffle(all rows) -> batch"),
    ("ray-data", "peers", "Ray Data read_parquet -> iter_torch_batches(local shuffle buffer)"),
    ("petastorm", "petastorm", "Petastorm make_batch_reader -> BatchedDataLoader(shuffle queue)"),
    ("mosaic-w0", "peers", "Mosaic StreamingDataset (MDS) -> torch DataLoader, workers=0"),
    ("mosaic-w2", "peers", "Mosaic StreamingDataset (MDS) -> torch DataLoader, workers=2"),
]
PEERS = [name for name, _, _ in RUNNERS if name != "feedline"]


# --------------------------------------------------------------------------- measuring


def rss_now() -> int:
    """This process's resident set size in bytes (from /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's peak resident set size in bytes (the kernel's high-water mark)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class TreeSampler:
    """Samples the summed RSS of this process and all its descendants every ``period`` s."""

    def __init__(self, period: float = 0.25) -> None:
        import psutil

        self._me = psutil.Process()
        self._period = period
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(self._period):
            total = 0
            for proc in [self._me, *self._me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def measure(
    make_epoch: Callable[[int], Iterator[dict[str, Any]]],
    spec: dict[str, Any],
    args: argparse.Namespace,
    multiprocess: bool,
) -> dict[str, Any]:
    """Time ``make_epoch(0)``'s first batch, then iterate epochs; see the module docstring.

    ``make_epoch(e)`` builds the loader (for e = 0) and returns epoch ``e``'s batches: dicts
    holding the feature tensor under ``spec["feature"]`` and ``label``.
    """
    import torch

    feature, shape = spec["feature"], tuple(spec["shape"])
    dtype = getattr(torch, spec["dtype"])
    expected = spec["n"] // BATCH * BATCH  # every loader is asked to drop the last batch

    def check(batch: dict[str, Any]) -> int:
        x, y = batch[feature], batch["label"]
        if tuple(x.shape[1:]) != shape or x.dtype != dtype or y.dtype != torch.int64:
            raise AssertionError(
                f"batch {feature} {tuple(x.shape)} {x.dtype}, label {y.dtype}: expected "
                f"(b, {shape}) {dtype} and int64"
            )
        return len(y)

    sampler = TreeSampler() if multiprocess else None
    base = rss_now()
    start = time.perf_counter()
    batches = make_epoch(0)
    rows = check(next(batches))
    first = time.perf_counter()
    first_rows, epoch, epoch_rows, complete = rows, 0, rows, []
    stopped = False
    while True:
        for batch in batches:
            n = check(batch)
            rows += n
            epoch_rows += n
            if time.perf_counter() - first > args.cap_seconds:
                stopped = True
                break
        end = time.perf_counter()
        if stopped:
            break
        complete.append(epoch_rows)
        if end - first >= args.min_seconds or epoch + 1 >= args.max_epochs:
            break
        epoch, epoch_rows = epoch + 1, 0
        batches = make_epoch(epoch)
    del batches
    return {
        "first_batch_s": first - start,
        "samples_per_s": (rows - first_rows) / (end - first) if end > first else None,
        "seconds": end - first,
        "rows": rows,
        "epochs_complete": len(complete),
        "epoch_fraction": (epoch_rows / expected) if stopped else None,
        "rows_per_epoch": complete,
        "expected_rows_per_epoch": expected,
        "rows_lost": [expected - r for r in complete],
        "rss_after_imports": base,
        "peak_rss": peak_rss(),
        "tree_peak_rss": sampler.stop() if sampler else None,
    }


# --------------------------------------------------------------------------- loaders


def shard_files(data_dir: str) -> list[str]:
    return sorted(str(p) for p in Path(data_dir).glob("part-*.parquet"))


def run_feedline(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    import feedline as fl
    from feedline.loader import Loader
    from feedline.loader.cache import file_layout
    from feedline.loader.order import global_order

    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            holder["loader"] = Loader(
                fl.open(spec["dir"]), batch_size=BATCH, shuffle=True, seed=SEED,
                cache="auto", format="torch",
            )  # fmt: skip
        holder["loader"].set_epoch(epoch)
        return iter(holder["loader"])

    result = measure(make_epoch, spec, args, multiprocess=False)
    loader = holder["loader"]
    stats = loader.stats()
    result["cache"], result["cache_bytes"] = stats["cache"], stats.get("cache_bytes")
    # the raw-gather ceiling: the loader's own arrays, the same index arrays, no prefetch
    arrays = loader._prepare().source.arrays  # the ColumnCache's dict of column -> array
    sizes = file_layout(loader.dataset).row_group_sizes
    epochs = max(1, result["epochs_complete"])
    orders = [
        global_order(sizes, shuffle=True, seed=SEED, epoch=e, window=None) for e in range(epochs)
    ]
    loader.set_epoch(0)
    if not np.array_equal(loader._plan().indices, orders[0][: len(loader) * BATCH]):
        raise AssertionError("the ceiling's index arrays differ from the loader's")
    loader.set_epoch(epochs)  # back to where it was; nothing of it is used below

    def gather_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        order = orders[epoch % len(orders)]
        for b in range(len(order) // BATCH):
            idx = order[b * BATCH : (b + 1) * BATCH]
            yield {k: torch.from_numpy(np.take(a, idx, axis=0)) for k, a in arrays.items()}

    ceiling = measure(gather_epoch, spec, args, multiprocess=False)
    result["ceiling"] = {k: ceiling[k] for k in ("samples_per_s", "seconds", "rows")}
    return result


def pandas_dataset(spec: dict[str, Any]) -> Any:
    """The map-style Dataset a PyTorch user writes over Parquet read with pandas."""
    import numpy as np
    import pandas as pd
    from torch.utils.data import Dataset

    class ParquetFrame(Dataset):
        def __init__(self, files: list[str], feature: str, shape: tuple[int, ...]) -> None:
            frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            # pandas holds a tensor column as an object column of per-row arrays
            self.x = np.stack(frame[feature].to_numpy()).reshape(len(frame), *shape)
            self.y = frame["label"].to_numpy()
            self.feature = feature

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {self.feature: self.x[i], "label": self.y[i]}

    return ParquetFrame(shard_files(spec["dir"]), spec["feature"], tuple(spec["shape"]))


def run_torch_dl(spec: dict[str, Any], args: argparse.Namespace, workers: int) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler, default_collate

    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            dataset = pandas_dataset(spec)
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
            holder["dl"] = DataLoader(
                dataset, batch_size=BATCH, sampler=sampler, num_workers=workers,
                collate_fn=default_collate, drop_last=True,
            )  # fmt: skip
        return iter(holder["dl"])

    return measure(make_epoch, spec, args, multiprocess=workers > 0)


def run_hf(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import shutil
    import tempfile

    import datasets
    import torch

    datasets.disable_progress_bars()
    dtype = getattr(torch, spec["dtype"])
    cache = tempfile.mkdtemp(prefix="hf-cache-", dir=args.work)  # fresh: no reused conversion
    holder: dict[str, Any] = {}
    shape = tuple(spec["shape"])

    # datasets has no dtype for arrow.fixed_shape_tensor: declare the column a fixed-length list
    size = 1
    for d in shape:
        size *= d
    features = datasets.Features({
        spec["feature"]: datasets.List(datasets.Value(spec["dtype"]), length=size),
        "label": datasets.Value("int64"),
    })  # fmt: skip

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            holder["ds"] = datasets.Dataset.from_parquet(
                shard_files(spec["dir"]), features=features, cache_dir=cache
            )
        ds = holder["ds"].shuffle(seed=SEED + epoch).with_format("torch")
        for batch in ds.iter(batch_size=BATCH, drop_last_batch=True):
            x = batch[spec["feature"]]
            if x.dtype != dtype:  # its torch format widens every integer column to int64
                x = x.to(dtype)
            yield {spec["feature"]: x.reshape(len(x), *shape), "label": batch["label"]}

    try:
        return measure(make_epoch, spec, args, multiprocess=False)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run_tf_data(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The tf.data idiom over Parquet: arrays read with pyarrow, an exact shuffle buffer.

    tf.data has no Parquet reader of its own (tensorflow-io's is unmaintained), so the columns
    are read with pyarrow into NumPy, sliced by ``from_tensor_slices`` and shuffled with a
    buffer as large as the dataset (an exact global shuffle, like feedline's). Batches come out
    as TF tensors; ``.numpy()`` + ``torch.from_numpy`` hand them over without a copy.
    """
    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf
    import torch

    holder: dict[str, Any] = {}
    shape = tuple(spec["shape"])

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            table = pq.read_table(shard_files(spec["dir"]), columns=[spec["feature"], "label"])
            column = table.column(spec["feature"]).combine_chunks()
            x = np.asarray(column.storage.flatten()).reshape(len(table), *shape)
            y = table.column("label").to_numpy()
            del table, column
            holder["ds"] = (
                tf.data.Dataset.from_tensor_slices({spec["feature"]: x, "label": y})
                .shuffle(len(y), seed=SEED, reshuffle_each_iteration=True)
                .batch(BATCH, drop_remainder=True)
                .prefetch(tf.data.AUTOTUNE)
            )
        for batch in holder["ds"]:
            yield {k: torch.from_numpy(v.numpy()) for k, v in batch.items()}

    return measure(make_epoch, spec, args, multiprocess=False)


def run_ray(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    buffer = int(spec["n"] * SHUFFLE_BUFFER_FRACTION)
    shape = tuple(spec["shape"])

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        ds = ray.data.read_parquet(shard_files(spec["dir"]))
        batches = ds.iter_torch_batches(
            batch_size=BATCH, local_shuffle_buffer_size=buffer, local_shuffle_seed=SEED + epoch,
            drop_last=True,
        )  # fmt: skip
        for batch in batches:
            x = batch[spec["feature"]]
            yield {spec["feature"]: x.reshape(len(x), *shape), "label": batch["label"]}

    try:
        result = measure(make_epoch, spec, args, multiprocess=True)
    finally:
        ray.shutdown()
    result["shuffle_buffer_rows"] = buffer
    return result


def petastorm_tensor_columns() -> None:
    """Let Petastorm's schema inference keep tensor columns instead of dropping them.

    ``make_batch_reader`` infers its schema from the Parquet footer and silently omits
    ``arrow.fixed_shape_tensor`` / fixed-size-list columns ("unsupported field"). Typed as
    their value type here, they are read and handed to the TransformSpec as pandas objects.
    """
    import pyarrow as pa
    from petastorm import unischema

    original = unischema._numpy_and_codec_from_arrow_type

    def numpy_type(field_type: Any) -> Any:
        if isinstance(field_type, pa.BaseExtensionType):
            field_type = field_type.storage_type
        if pa.types.is_fixed_size_list(field_type):
            field_type = field_type.value_type
        return original(field_type)

    unischema._numpy_and_codec_from_arrow_type = numpy_type


def run_petastorm(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader
    from petastorm.transform import TransformSpec

    petastorm_tensor_columns()
    buffer = int(spec["n"] * SHUFFLE_BUFFER_FRACTION)
    feature, shape = spec["feature"], tuple(spec["shape"])
    size = int(np.prod(shape))
    urls = ["file://" + f for f in shard_files(spec["dir"])]

    def stack(frame: Any) -> Any:  # the tensor column arrives as an object column of arrays
        frame[feature] = list(np.stack(frame[feature].to_numpy()).reshape(len(frame), size))
        return frame

    transform = TransformSpec(stack, edit_fields=[(feature, np.dtype(spec["dtype"]).type,
                                                   (size,), False)])  # fmt: skip

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        reader = make_batch_reader(
            urls, num_epochs=1, shuffle_row_groups=True, seed=SEED + epoch, workers_count=2,
            reader_pool_type="thread", transform_spec=transform,
        )  # fmt: skip
        with reader:
            for batch in BatchedDataLoader(
                reader, batch_size=BATCH, shuffling_queue_capacity=buffer
            ):
                x = batch[feature]
                if len(x) < BATCH:  # the last, partial batch: dropped like everyone else's
                    continue
                yield {feature: x.reshape(len(x), *shape), "label": batch["label"]}

    result = measure(make_epoch, spec, args, multiprocess=True)
    result["shuffle_buffer_rows"] = buffer
    return result


def torchvision_stand_in() -> None:
    """``streaming.vision`` imports torchvision at import time; PyPI's torchvision does not
    import beside torch 2.13 CPU and the benchmark uses none of it: a stand-in module."""
    import importlib.machinery
    import types

    import torch.utils.data

    # streaming's dataloader imports these; transformers probes for torchvision at import time,
    # so they are imported before the stand-in exists (transformers then sees no torchvision)
    import transformers.feature_extraction_utils
    import transformers.tokenization_utils_base  # noqa: F401

    names = ["torchvision", "torchvision.datasets", "torchvision.transforms"]
    names.append("torchvision.transforms.functional")
    modules = {name: types.ModuleType(name) for name in names}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["torchvision.datasets"].VisionDataset = torch.utils.data.Dataset
    modules["torchvision.datasets"].CIFAR10 = None
    modules["torchvision.transforms.functional"].to_tensor = None
    modules["torchvision"].datasets = modules["torchvision.datasets"]
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]
    sys.modules.update(modules)


def write_mds(spec: dict[str, Any], out: Path) -> float:
    """MDS shards with the same rows as the Parquet shards (skipped when already there)."""
    import shutil

    import numpy as np
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    if (out / "index.json").exists():
        return 0.0
    shutil.rmtree(out, ignore_errors=True)  # an interrupted write's leftovers
    start = time.perf_counter()
    feature, shape = spec["feature"], spec["shape"]
    columns = {feature: f"ndarray:{spec['dtype']}:{','.join(map(str, shape))}", "label": "int64"}
    with MDSWriter(out=str(out), columns=columns, compression=None, size_limit="64mb") as w:
        for f in shard_files(spec["dir"]):
            for batch in pq.ParquetFile(f).iter_batches(batch_size=8192):
                x = batch.column(feature).storage.flatten().to_numpy()
                x = x.reshape(batch.num_rows, *shape)
                y = batch.column("label").to_numpy()
                for i in range(batch.num_rows):
                    w.write({feature: np.ascontiguousarray(x[i]), "label": y[i]})
    return time.perf_counter() - start


def write_mds_worker(spec: dict[str, Any]) -> dict[str, Any]:
    torchvision_stand_in()
    return {"mds_write_s": write_mds(spec, Path(spec["dir"] + "-mds"))}


def run_mosaic(spec: dict[str, Any], args: argparse.Namespace, workers: int) -> dict[str, Any]:
    torchvision_stand_in()
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    mds = Path(spec["dir"] + "-mds")
    prep = 0.0
    if not (mds / "index.json").exists():  # written in another process: not in this one's RSS
        start = time.perf_counter()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "mds-write",
               "--spec", args.spec, "--result", str(mds) + ".json", "--work", args.work]
        subprocess.run(cmd, check=True)  # fmt: skip
        prep = time.perf_counter() - start
    record = Path(str(mds) + ".json")
    written = json.loads(record.read_text()) if record.exists() else {"status": "ok"}
    if written["status"] != "ok":
        raise RuntimeError(f"writing the MDS shards failed: {written['error']}")
    prep = prep or written.get("mds_write_s", 0.0)  # written by an earlier run: its figure
    clean_stale_shared_memory()
    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            ds = StreamingDataset(
                local=str(mds), shuffle=True, shuffle_seed=SEED, batch_size=BATCH,
            )  # fmt: skip
            holder["dl"] = DataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
        return iter(holder["dl"])

    result = measure(make_epoch, spec, args, multiprocess=workers > 0)
    result["mds_write_s"] = prep
    return result


def worker(args: argparse.Namespace) -> None:
    """Run one loader on one dataset; write its result (or its error) to ``args.result``."""
    spec = json.loads(args.spec)
    fns: dict[str, Callable[[], dict[str, Any]]] = {
        "feedline": lambda: run_feedline(spec, args),
        "torch-dl-w0": lambda: run_torch_dl(spec, args, 0),
        "torch-dl-w2": lambda: run_torch_dl(spec, args, 2),
        "hf-datasets": lambda: run_hf(spec, args),
        "tf-data": lambda: run_tf_data(spec, args),
        "ray-data": lambda: run_ray(spec, args),
        "petastorm": lambda: run_petastorm(spec, args),
        "mosaic-w0": lambda: run_mosaic(spec, args, 0),
        "mosaic-w2": lambda: run_mosaic(spec, args, 2),
        "mds-write": lambda: write_mds_worker(spec),
    }
    try:
        result = {"status": "ok", **fns[args.worker]()}
    except BaseException as exc:  # noqa: BLE001 - reported in the table, not fatal to the run
        detail = traceback.format_exc()
        sys.stderr.write(detail)
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # no waiting on third-party threads or atexit hooks of the peers


# --------------------------------------------------------------------------- orchestration


def make_data(work: Path, quick: bool) -> dict[str, dict[str, Any]]:
    """Write datasets A and B with feedline (reused when ``work`` already holds them)."""
    import numpy as np
    import pyarrow as pa

    import feedline as fl

    specs = {}
    for name, d in DATA.items():
        n = d["quick_rows"] if quick else d["rows"]
        out = work / f"{name}-{n}"
        spec = {**d, "name": name, "n": n, "dir": str(out)}
        specs[name] = spec
        if (out / "_feedline.json").exists():
            continue
        rng = np.random.default_rng(SEED)
        shape = (n, *d["shape"])
        if d["dtype"] == "uint8":
            values = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            values = rng.standard_normal(shape, dtype=np.float32)
        table = pa.table({
            d["feature"]: pa.FixedShapeTensorArray.from_numpy_ndarray(values),
            "label": rng.integers(0, 10, n),
        })  # fmt: skip
        del values
        start = time.perf_counter()
        fl.from_arrow(table).write(
            out, rows_per_shard=n // SHARDS, bytes_per_shard=None, row_group_rows=n // 16,
        )  # fmt: skip
        print(f"wrote {name}: {n} rows in {time.perf_counter() - start:.1f}s -> {out}", flush=True)
    return specs


def python_for(venv: str) -> Path:
    return Path(sys.executable) if not venv else VENVS / venv / "bin" / "python"


def run_one(name: str, venv: str, spec: dict[str, Any], args: argparse.Namespace) -> dict:
    python = python_for(venv)
    if not python.exists() or (venv and not (VENVS / venv / ".complete").exists()):
        return {"status": "not installed", "error": f"no {VENVS / venv}: run bench/setup_peers.sh"}
    result_file = Path(args.work) / f"result-{name}-{spec['name']}.json"
    result_file.unlink(missing_ok=True)
    cmd = [
        str(python), str(Path(__file__).resolve()), "--worker", name, "--spec", json.dumps(spec),
        "--result", str(result_file), "--work", str(args.work),
        "--min-seconds", str(args.min_seconds), "--cap-seconds", str(args.cap_seconds),
        "--max-epochs", str(args.max_epochs),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    env["RAY_DEDUP_LOGS"] = "0"
    timeout = args.cap_seconds + args.setup_seconds
    log = Path(args.work) / f"log-{name}-{spec['name']}.txt"
    try:
        with open(log, "w") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout, cwd=ROOT, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout:.0f}s (log: {log})"}
    if result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        tail = log.read_text().strip().splitlines()[-1:] or [""]
        result = {"status": "crashed", "error": f"exit {proc.returncode}: {tail[0][:300]}"}
    result["log"] = str(log)
    return result


def versions() -> dict[str, str]:
    """Package versions of each venv (one subprocess per venv)."""
    probe = (
        "import importlib.metadata as m, json\n"
        "names = ['torch', 'numpy', 'pyarrow', 'pandas', 'ray', 'datasets', 'petastorm',"
        " 'mosaicml-streaming', 'feedline']\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    found: dict[str, str] = {}
    for venv in ("", "peers", "petastorm"):
        python = python_for(venv)
        if not python.exists():
            continue
        res = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                             check=False, cwd="/")  # fmt: skip
        for pkg, ver in (json.loads(res.stdout) if res.returncode == 0 else {}).items():
            found[f"{venv or 'project'}:{pkg}"] = ver
    return found


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:,.0f}"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def rows_note(r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return r.get("error", r.get("status", "?"))
    notes = []
    lost = [x for x in r.get("rows_lost", []) if x]
    if lost:
        notes.append(f"LOST rows {lost} of {r['expected_rows_per_epoch']}/epoch")
    elif r.get("epochs_complete"):
        notes.append(f"{r['epochs_complete']} epoch(s), all rows")
    if r.get("epoch_fraction") is not None:
        notes.append(f"stopped at {r['epoch_fraction']:.0%} of an epoch")
    if r.get("shuffle_buffer_rows"):
        notes.append(f"buffer {r['shuffle_buffer_rows']:,} rows")
    if r.get("mds_write_s"):
        notes.append(f"MDS write {r['mds_write_s']:.0f}s (untimed)")
    return "; ".join(notes)


def table_rows(results: dict[str, dict[str, dict]]) -> list[list[str]]:
    rows = []
    for data, per in results.items():
        for name, r in per.items():
            ok = r.get("status") == "ok"
            rss = (r["peak_rss"] - r["rss_after_imports"]) if ok else None
            rows.append([
                data, name, rate(r.get("samples_per_s")),
                f"{r['first_batch_s']:.2f}" if ok else "-",
                mb(r.get("peak_rss")), mb(rss), mb(r.get("tree_peak_rss")), rows_note(r),
            ])  # fmt: skip
            if name == "feedline" and ok:
                ceiling = r["ceiling"]["samples_per_s"]
                rows.append([data, "raw np.take + from_numpy (ceiling)", rate(ceiling), "-", "-",
                             "-", "-", "same arrays, same index arrays"])  # fmt: skip
    return rows


HEADER = ["data", "loader", "samples/s", "first batch s", "peak RSS MB", "RSS over imports MB",
          "tree peak RSS MB", "rows / notes"]  # fmt: skip


def summary(
    results: dict[str, dict[str, dict]], quick: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The issue's ratios and goals."""
    figures: dict[str, Any] = {}
    lines = []
    for data, per in results.items():
        fl_r = per.get("feedline", {})
        if fl_r.get("status") != "ok":
            lines.append(f"- {data}: feedline failed: {fl_r.get('error')}")
            continue
        peers = {k: v for k, v in per.items() if k != "feedline" and v.get("status") == "ok"}
        best = max(peers, key=lambda k: peers[k]["samples_per_s"] or 0, default=None)
        f = {
            "feedline_samples_per_s": fl_r["samples_per_s"],
            "best_peer": best,
            "vs_best_peer": fl_r["samples_per_s"] / peers[best]["samples_per_s"] if best else None,
            "vs_ceiling": fl_r["samples_per_s"] / fl_r["ceiling"]["samples_per_s"],
            "first_batch_s": fl_r["first_batch_s"],
            "rss_over_imports_per_cache_byte": (fl_r["peak_rss"] - fl_r["rss_after_imports"])
            / fl_r["cache_bytes"],
            "peak_rss_per_cache_byte": fl_r["peak_rss"] / fl_r["cache_bytes"],
            "cache_bytes": fl_r["cache_bytes"],
        }
        figures[data] = f
        vs = f"{f['vs_best_peer']:.1f}× {best}" if best else "no peer ran"
        lines.append(
            f"- **{data}**: feedline {f['feedline_samples_per_s']:,.0f} samples/s = {vs}; "
            f"{f['vs_ceiling']:.0%} of the raw-gather ceiling; first batch "
            f"{f['first_batch_s']:.2f} s; peak RSS − RSS after imports = "
            f"{f['rss_over_imports_per_cache_byte']:.2f} × cached column bytes "
            f"({f['cache_bytes'] / 1e6:,.0f} MB; whole peak RSS "
            f"{f['peak_rss_per_cache_byte']:.2f} ×)"
        )
    a = figures.get("A")
    if a:
        goals = [
            ("≥ 5× best peer, shuffled tabular (A)", a["vs_best_peer"] or 0, 5, True),
            ("≥ 60% of raw-gather ceiling (A)", a["vs_ceiling"], 0.6, True),
            ("time to first batch < 1 s, A", a["first_batch_s"], 1.0, False),
            ("peak RSS − RSS after imports ≤ 1.3 × cached bytes (A)",
             a["rss_over_imports_per_cache_byte"], 1.3, False),
        ]  # fmt: skip
        if "B" in figures:
            goals.append(("≥ 60% of raw-gather ceiling (B)", figures["B"]["vs_ceiling"], 0.6, True))
            goals.append(("peak RSS − RSS after imports ≤ 1.3 × cached bytes (B)",
                          figures["B"]["rss_over_imports_per_cache_byte"], 1.3, False))
        figures["goals"] = {}
        lines.append("")
        lines.append(
            "Goals (issue 3; judged on the full run: with --quick's 10× smaller data fixed "
            "overheads dominate the ratios):" if quick else "Goals (issue 3):"
        )
        for label, value, bound, higher in goals:
            met = value >= bound if higher else value < bound or (value == bound and not higher)
            figures["goals"][label] = {"value": value, "met": bool(met)}
            lines.append(f"- {label}: {value:.2f} → {'met' if met else 'NOT met'}")
    return figures, lines


def markdown(results, figures_lines, args, meta) -> str:
    _, lines = figures_lines
    out = ["## Training loader: feedline vs peers (bench/loader.py)", ""]
    out.append("```")
    out.append(meta["command"])
    out.append("```")
    out.append("")
    out.append(
        f"Machine: {meta['cpus']} CPUs, {meta['mem_gb']:.0f} GB RAM, Python {meta['python']}. "
        f"Batch size {BATCH}, shuffled, torch tensors out, every loader in its own process "
        f"(RSS is its own). Data written once by feedline ({SHARDS} zstd Parquet shards, 16 row "
        "groups, random values); every loader reads the same shards (Mosaic: MDS shards "
        "written from them, uncompressed):"
    )
    for spec in meta["data"].values():
        out.append(f"- {spec['title']}: {spec['n']:,} rows, feature column `{spec['feature']}` "
                   f"= one `arrow.fixed_shape_tensor` {spec['dtype']} {spec['shape']} column "
                   "(not one column per feature).")  # fmt: skip
    out.append(
        "Parquet stores a fixed-shape tensor as a list column (a repetition and a definition "
        "level per value) and uint8 values as INT32, so decoding B's images dominates every "
        "Parquet reader's load time (feedline's first batch on B included)."
    )
    out.append("")
    out.append("| " + " | ".join(HEADER) + " |")
    out.append("|" + "---|" * len(HEADER))
    for row in table_rows(results):
        out.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    out.append("")
    out.extend(lines)
    out.append("")
    out.append(
        "How: time to first batch runs from building the loader (after imports) to the first "
        "batch in hand, so it includes any load or conversion (feedline: opening the dataset and "
        "filling the cache; HF datasets: its Arrow conversion into a fresh cache dir; pandas: "
        "reading and stacking; Ray: excluding `ray.init`; Mosaic: excluding the MDS write). "
        "samples/s is measured after the first batch over whole epochs (more until "
        f"{args.min_seconds:g} s; a loader still short of one epoch at {args.cap_seconds:g} s is "
        "stopped). RSS over imports = the process's peak RSS minus its RSS right after imports "
        "(the figure the RSS goal is judged on); tree peak = sampled sum over the process and "
        "its children (workers, Ray's processes; shared pages counted per process). Shuffles: "
        "feedline, torch DataLoader, HF datasets and Mosaic shuffle globally; Ray Data and "
        f"Petastorm through a local buffer of {SHUFFLE_BUFFER_FRACTION:.0%} of the rows "
        "(Petastorm also permutes row groups). HF datasets iterates with "
        "`Dataset.iter(batch_size=256, drop_last_batch=True)` (no DataLoader). What the peers "
        "needed to read these shards at all: HF datasets has no dtype for "
        "`arrow.fixed_shape_tensor` (it gets `features=` declaring a fixed-length list, and its "
        "torch format widens uint8 to int64, converted back in the timed loop); Petastorm's "
        "schema inference drops the tensor column (a shim types it by its value type and a "
        "TransformSpec stacks the rows); pandas and Petastorm see per-row arrays (np.stack). "
        "Petastorm's rows are counted every epoch (it is known to drop row groups); a loss "
        "is reported."
    )
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    out.append("")
    out.append(f"Versions: {versions}.")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k / 10k rows, shorter caps")
    parser.add_argument("--data", nargs="*", default=list(DATA), choices=list(DATA))
    parser.add_argument("--only", nargs="*", default=None, help="loaders to run (default all)")
    parser.add_argument("--work", default="/tmp/feedline-bench-loader",
                        help="data and logs (datasets are reused across runs)")  # fmt: skip
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--cap-seconds", type=float, default=None)
    parser.add_argument("--max-epochs", type=int, default=5)
    parser.add_argument("--setup-seconds", type=float, default=240.0)
    parser.add_argument("--report", action="store_true",
                        help="print the table and markdown of the last run again")  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.min_seconds is None:
        args.min_seconds = 2.0 if args.quick else 5.0
    if args.cap_seconds is None:
        args.cap_seconds = 8.0 if args.quick else 25.0
    if args.worker:
        worker(args)
        return
    if args.report:  # print the table and markdown of the last run again
        saved = json.loads(OUT.read_text())
        args.quick = saved["meta"]["command"].endswith("--quick")
        args.min_seconds = saved["meta"]["min_seconds"]
        args.cap_seconds = saved["meta"]["cap_seconds"]
        report(saved["results"], saved["meta"], args)
        return

    from rich.console import Console

    console = Console(stderr=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    specs = make_data(work, args.quick)
    only = set(args.only) if args.only else None
    results: dict[str, dict[str, dict]] = {}
    started = time.perf_counter()
    for data in args.data:
        spec = {k: v for k, v in specs[data].items()}
        results[data] = {}
        for name, venv, _ in RUNNERS:
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            r = run_one(name, venv, spec, args)
            results[data][name] = r
            console.print(
                f"[{data}] {name}: {r.get('status')} {rate(r.get('samples_per_s'))} samples/s "
                f"({time.perf_counter() - t0:.0f}s) {'' if r.get('status') == 'ok' else r}"
            )
    meta = {
        "command": "flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py"
        + (" --quick" if args.quick else ""),
        "cpus": os.cpu_count(),
        "mem_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
        "python": platform.python_version(),
        "data": {k: specs[k] for k in args.data},
        "versions": versions(),
        "runners": {name: desc for name, _, desc in RUNNERS},
        "seconds": time.perf_counter() - started,
        "min_seconds": args.min_seconds,
        "cap_seconds": args.cap_seconds,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    report(results, meta, args)
    print(f"\n(wrote {OUT.relative_to(ROOT)}; total {meta['seconds']:.0f}s)", file=sys.stderr)


def report(results: dict[str, dict[str, dict]], meta: dict[str, Any], args) -> None:
    """Print the rich table and the markdown section; add the figures to ``OUT``."""
    from rich.console import Console
    from rich.table import Table

    figures_lines = summary(results, args.quick)
    table = Table(title=f"Shuffled loader throughput, batch {BATCH} (bench/loader.py)")
    for h in HEADER:
        table.add_column(h, justify="left" if h in ("data", "loader", "rows / notes") else "right")
    for row in table_rows(results):
        table.add_row(*row)
    Console(width=max(160, Console().width)).print(table)
    saved = json.loads(OUT.read_text()) if OUT.exists() else {"meta": meta, "results": results}
    saved["figures"] = figures_lines[0]
    OUT.write_text(json.dumps(saved, indent=2, default=str))
    print()
    print(markdown(results, figures_lines, args, meta))

if __name__ == "__main__":
    main()
