"""Shuffled training-loader throughput: feedline vs its peers, same data, one run.

Usage::

    bash bench/setup_peers.sh        # once: peer venvs under bench/.venvs/ (git-ignored)
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py [--quick]
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case W  # windows case
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case J  # JPEG decode+augment
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case A-wide  # 33 columns
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case B  # tensor storage
    flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case L  # list<uint8>

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
index arrays (``feedline.loader.order.sample_order.global_order``), one batch at a time.

Prints a rich table and a markdown section for BENCHMARKS.md; writes ``bench/out/loader.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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


# feedline stores a tensor column as fixed-size binary (the tensor type in the field's
# ``feedline.tensor`` metadata; see feedline/arrow/tensor_codec.py), older datasets as lists:
# what another reader does with either, written the way its users would.


def stored_as_binary(spec: dict[str, Any]) -> bool:
    """Whether the shards hold the feature column as fixed-size binary (else as lists)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.types.is_fixed_size_binary(pq.read_schema(shard_files(spec["dir"])[0])
                                         .field(spec["feature"]).type)  # fmt: skip


def tensor_array(column: Any, shape: Any, dtype: str) -> Any:
    """An Arrow tensor column (binary-stored or list-encoded) as a ``(rows, *shape)`` array."""
    import numpy as np
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_binary(column.type):
        n = column.type.byte_width // np.dtype(dtype).itemsize
        flat = np.frombuffer(column.buffers()[1], dtype)[column.offset * n :]
        return flat[: len(column) * n].reshape(len(column), *shape)
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    return np.asarray(storage.flatten()).reshape(len(column), *shape)


def stacked_rows(values: Any, shape: Any, dtype: str) -> Any:
    """A pandas column of per-row arrays (lists) or ``bytes`` (binary) as one array."""
    import numpy as np

    if len(values) and isinstance(values[0], bytes):
        return np.frombuffer(b"".join(values), dtype).reshape(len(values), *shape)
    return np.stack(values).reshape(len(values), *shape)


def run_feedline(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    import feedline as fl
    from feedline.loader import Loader
    from feedline.loader.data.memory_cache import file_layout
    from feedline.loader.order.sample_order import global_order

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
    sizes = file_layout(loader._source()).row_group_sizes
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
    import pandas as pd
    from torch.utils.data import Dataset

    class ParquetFrame(Dataset):
        def __init__(self, files: list[str], feature: str, shape: tuple[int, ...]) -> None:
            frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            # pandas holds a tensor column as an object column of per-row arrays
            self.x = stacked_rows(frame[feature].to_numpy(), shape, spec["dtype"])
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
    binary = stored_as_binary(spec)  # then declared bytes and decoded per batch below
    features = datasets.Features({
        spec["feature"]: datasets.Value("binary") if binary
        else datasets.List(datasets.Value(spec["dtype"]), length=size),
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
            if binary:  # a list of bytes
                x = torch.from_numpy(stacked_rows(x, shape, spec["dtype"]).copy())
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
    import pyarrow.parquet as pq
    import tensorflow as tf
    import torch

    holder: dict[str, Any] = {}
    shape = tuple(spec["shape"])

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            table = pq.read_table(shard_files(spec["dir"]), columns=[spec["feature"], "label"])
            column = table.column(spec["feature"]).combine_chunks()
            x = tensor_array(column, shape, spec["dtype"])
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

    def decode(table: Any) -> Any:  # binary-stored tensors: typed back, without a copy
        import pyarrow as pa

        column = table.column(spec["feature"])
        values = tensor_array(column, shape, spec["dtype"])
        tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(values)
        return table.set_column(table.schema.get_field_index(spec["feature"]), spec["feature"],
                                tensor)  # fmt: skip

    binary = stored_as_binary(spec)

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        ds = ray.data.read_parquet(shard_files(spec["dir"]))
        if binary:
            ds = ds.map_batches(decode, batch_format="pyarrow")
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
        rows = stacked_rows(frame[feature].to_numpy(), (size,), spec["dtype"])
        frame[feature] = list(rows)
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
                x = tensor_array(batch.column(feature), shape, spec["dtype"])
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
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "mds-write",
            "--spec",
            args.spec,
            "--result",
            str(mds) + ".json",
            "--work",
            args.work,
        ]
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
            goals.append(
                (
                    "peak RSS − RSS after imports ≤ 1.3 × cached bytes (B)",
                    figures["B"]["rss_over_imports_per_cache_byte"],
                    1.3,
                    False,
                )
            )
        figures["goals"] = {}
        lines.append("")
        lines.append(
            "Goals (issue 3; judged on the full run: with --quick's 10× smaller data fixed "
            "overheads dominate the ratios):"
            if quick
            else "Goals (issue 3):"
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
        "feedline's writer stores a fixed-shape tensor column as fixed-size binary (PLAIN; the "
        "tensor type in the field metadata, see feedline/arrow/tensor_codec.py), where Parquet "
        "would store a list (a repetition and a definition level per value, uint8 as INT32); "
        "the peers decode those bytes with NumPy (`np.frombuffer`; Ray: a `map_batches`, HF "
        "datasets: the column declared binary). `--case B` compares the two storages."
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


# --------------------------------------------------------------------------- case W: windows
#
# Time-series windows (``--case W``): ``fl.Windows`` vs the ``torch.utils.data.Dataset`` a user
# writes by hand (``__getitem__`` slicing one window out of a NumPy array) under a
# ``DataLoader`` with 0 and 2 workers. Each loader runs in its own process (``--worker``), so
# its peak RSS is its own; results go to ``bench/out/loader_w.json``.

W_OUT = HERE / "out" / "loader_w.json"
W_SIZE, W_HORIZON, W_FEATURES = 96, 8, 8
#: case W: interleaved rounds of (loader batches, the same batches gathered raw) in one process
W_ROUNDS, W_ROUND_BATCHES = 10, 300
W_DATA: dict[str, dict[str, Any]] = {
    "W": {"series": 2000, "steps": 5000},
    "W-small": {"series": 100, "steps": 5000},
}
W_RUNNERS: dict[str, str] = {
    "feedline": "feedline Loader(windows=fl.Windows(96, 8, by='series', order_by='t', "
    "features=[f0..f7])), shuffle=True, format='torch', prefetch=2",
    "feedline-p0": "the same with prefetch=0: gathered in the loop's own thread (like torch "
    "with 0 workers), by torch.index_select into reused buffers (torch's intra-op threads)",
    "torch-dl-w0": "torch DataLoader(shuffle=True, workers=0) over a map-style Dataset whose "
    "__getitem__ slices one window of a (series, steps, 8) NumPy array",
    "torch-dl-w2": "the same with num_workers=2",
}


def w_spec(name: str, work: Path) -> dict[str, Any]:
    d = W_DATA[name]
    windows = d["series"] * (d["steps"] - W_SIZE - W_HORIZON + 1)
    data_bytes = d["series"] * d["steps"] * W_FEATURES * 4
    out = work / f"{name}-{d['series']}x{d['steps']}x{W_FEATURES}"
    return {**d, "name": name, "dir": str(out), "windows": windows, "data_bytes": data_bytes}


def w_make_data(spec: dict[str, Any]) -> None:
    """Write ``series`` (int32), ``t`` (int64) and ``f0..f7`` (float32), sorted, 4 shards."""
    import numpy as np
    import pyarrow as pa

    import feedline as fl

    out = Path(spec["dir"])
    if (out / "_feedline.json").exists():
        return
    s, t, rng = spec["series"], spec["steps"], np.random.default_rng(SEED)
    columns: dict[str, Any] = {
        "series": np.repeat(np.arange(s, dtype=np.int32), t),
        "t": np.tile(np.arange(t, dtype=np.int64) * 60, s),  # one step a minute, in seconds
    }
    for j in range(W_FEATURES):
        columns[f"f{j}"] = rng.standard_normal(s * t, dtype=np.float32)
    start, n = time.perf_counter(), s * t
    fl.from_arrow(pa.table(columns)).write(
        out, rows_per_shard=n // SHARDS, bytes_per_shard=None, row_group_rows=n // 16,
    )  # fmt: skip
    print(f"wrote {spec['name']}: {n:,} rows in {time.perf_counter() - start:.1f}s", flush=True)


def w_peak_rss() -> int:
    """This process's peak RSS since its exec (``VmHWM``).

    ``ru_maxrss`` is no use in a child: Linux carries the parent's high-water mark over the
    fork and exec (a parent that wrote the data makes every child look as large).
    """
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def w_check(batch: dict[str, Any]) -> int:
    """A window batch's size, after checking its keys' shapes and dtypes (torch float32)."""
    import torch

    for key, shape in {"inputs": (W_SIZE, W_FEATURES), "targets": (W_HORIZON, W_FEATURES)}.items():
        x = batch[key]
        if tuple(x.shape) != (BATCH, *shape) or x.dtype != torch.float32:
            raise AssertionError(f"{key} {tuple(x.shape)} {x.dtype}: want {shape} float32")
    return BATCH


def w_measure(make: Callable[[], Iterator[Any]], spec: dict[str, Any], batches: int,
              multiprocess: bool) -> dict[str, Any]:  # fmt: skip
    """Time to the first batch (building included), then samples/s over ``batches - 1``."""
    check = w_check
    sampler = TreeSampler() if multiprocess else None
    base = rss_now()
    start = time.perf_counter()
    it = make()
    check(next(it))
    first = time.perf_counter()
    samples = 0
    for _, batch in zip(range(batches - 1), it, strict=False):
        samples += check(batch)
    end = time.perf_counter()
    del it
    return {
        "first_batch_s": first - start,
        "samples_per_s": samples / (end - first),
        "seconds": end - first,
        "samples": samples,
        "rss_after_imports": base,
        "peak_rss": w_peak_rss(),
        "tree_peak_rss": sampler.stop() if sampler else None,
        "data_bytes": spec["data_bytes"],
        "load_1min": os.getloadavg()[0],  # the machine is shared: the load it ran under
    }


def w_run_feedline(spec: dict[str, Any], batches: int, prefetch: int = 2) -> dict[str, Any]:
    import numpy as np
    import torch

    import feedline as fl
    from feedline.loader.data.window_gather import gather_windows, strided_windows, window_blocks
    from feedline.loader.nodes.gather_threads import GatherThreads, batch_cuts, gather_threads
    from feedline.loader.pipeline import group_size

    holder: dict[str, Any] = {}
    windows = fl.Windows(W_SIZE, W_HORIZON, by="series", order_by="t",
                         features=[f"f{j}" for j in range(W_FEATURES)])  # fmt: skip

    def make() -> Iterator[Any]:
        holder["loader"] = fl.open(spec["dir"]).loader(
            windows=windows,
            batch_size=BATCH,
            shuffle=True,
            seed=SEED,
            format="torch",
            prefetch=prefetch,
        )
        return iter(holder["loader"])

    result = w_measure(make, spec, batches, multiprocess=False)
    loader = holder["loader"]
    result["cache_bytes"] = loader.stats()["cache_bytes"]
    if prefetch != 2:  # the ceilings, once, with the default loader
        return result
    if loader.num_samples != spec["windows"]:
        raise AssertionError(f"{loader.num_samples} windows, expected {spec['windows']}")
    # raw-gather ceilings: the loader's own packed arrays and index arrays, one batch at a
    # time in this thread, torch tensors out, no loader around it; (1) "fresh": the strided
    # window views (made once) indexed by the start rows into fresh arrays, as the loader
    # does; (2) "reused buffers": a row-by-row take straight into two reused buffers; (3)
    # "fresh, N threads": N batches at a time, one per thread into fresh arrays (the loader's
    # most threads, so its "% of ceiling" compares like with like; the loader splits only
    # while a CPU is idle: see feedline.loader.nodes.gather_threads)
    sampler, plan = loader._prepare().source, loader._plan()
    values = sampler.arrays["inputs"]
    inputs, targets = strided_windows(values, W_SIZE), strided_windows(values, W_HORIZON)
    out_x = np.empty((BATCH, W_SIZE, W_FEATURES), dtype=np.float32)
    out_y = np.empty((BATCH, W_HORIZON, W_FEATURES), dtype=np.float32)
    count = min(batches, plan.num_batches)
    threads = result["gather_threads"] = gather_threads()

    blocks_x, blocks_y = window_blocks(values, W_SIZE), window_blocks(values, W_HORIZON)
    shape_x, shape_y = (BATCH, W_SIZE, W_FEATURES), (BATCH, W_HORIZON, W_FEATURES)

    def fresh(k: int) -> tuple[Any, Any]:  # one memcpy per window, as the loader gathers
        first = sampler.window_starts(plan.batch(k))
        x = blocks_x[first].view(np.float32).reshape(shape_x)
        y = blocks_y[first + W_SIZE].view(np.float32).reshape(shape_y)
        return torch.from_numpy(x), torch.from_numpy(y)

    if threads > 1:  # the loader's way: groups of batches, whole batches per thread
        group = result["gather_group"] = group_size(loader._prepare(), loader._shapes(), BATCH, 2)
        cuts = batch_cuts([BATCH] * group, threads, W_FEATURES * 4 * (W_SIZE + W_HORIZON))

        def part(k: int, a: int, b: int) -> tuple[Any, Any]:
            ids = np.concatenate([plan.batch(j) for j in range(k + a, k + b)])
            first = sampler.window_starts(ids)  # as the loader's gather: per part
            x = blocks_x[first].view(np.float32).reshape(len(ids), W_SIZE, W_FEATURES)
            y = blocks_y[first + W_SIZE].view(np.float32).reshape(len(ids), W_HORIZON, W_FEATURES)
            return torch.from_numpy(x), torch.from_numpy(y)

        spans = list(itertools.pairwise(cuts))
        with GatherThreads(threads) as pool:
            start = time.perf_counter()
            done = 0
            for k in range(0, count - count % group, group):
                for x, y in pool.map(lambda i, k=k: part(k, *spans[i]), range(len(spans))):
                    for xs, ys in zip(x.split(BATCH), y.split(BATCH), strict=True):
                        done += w_check({"inputs": xs, "targets": ys})
            result["ceiling_threads_samples_per_s"] = done / (time.perf_counter() - start)
    for name in ("ceiling_samples_per_s", "ceiling_blocks_samples_per_s",
                 "ceiling_reused_samples_per_s"):  # fmt: skip
        start = time.perf_counter()
        for k in range(count):
            first = sampler.window_starts(plan.batch(k))
            if name == "ceiling_samples_per_s":
                x, y = inputs[first], targets[first + W_SIZE]
            elif name == "ceiling_blocks_samples_per_s":  # one memcpy per window
                x = blocks_x[first].view(np.float32).reshape(shape_x)
                y = blocks_y[first + W_SIZE].view(np.float32).reshape(shape_y)
            else:
                x = gather_windows(values, first, W_SIZE, out_x)
                y = gather_windows(values, first + W_SIZE, W_HORIZON, out_y)
            w_check({"inputs": torch.from_numpy(x), "targets": torch.from_numpy(y)})
        result[name] = count * BATCH / (time.perf_counter() - start)
    result.update(w_interleaved(loader, batches))
    result.update(w_memory_figures())
    return result


def w_interleaved(loader: Any, batches: int) -> dict[str, Any]:
    """Loader vs raw gather in one process: ``W_ROUNDS`` x (``W_ROUND_BATCHES`` loader
    batches, then as many batches of the same epoch gathered raw, one memcpy per window,
    into fresh tensors). Alternating cancels the load swings of a shared machine that hit
    whichever of two separate runs is running; also each side's CPU per batch. The raw
    rounds take their batches from the epoch's end, which the loader never reaches here (no
    batch is gathered twice, so neither side finds the other's windows in the CPU cache).
    """
    import numpy as np
    import torch

    from feedline.loader.data.window_gather import window_blocks

    sampler, plan = loader._prepare().source, loader._plan()
    values = sampler.arrays["inputs"]
    blocks_x, blocks_y = window_blocks(values, W_SIZE), window_blocks(values, W_HORIZON)
    shape_x, shape_y = (BATCH, W_SIZE, W_FEATURES), (BATCH, W_HORIZON, W_FEATURES)
    rounds = min(W_ROUNDS, plan.num_batches // (2 * W_ROUND_BATCHES + 8))
    it = iter(loader)
    w_check(next(it))  # the epoch's order drawn, the prefetch thread started
    out: list[dict[str, float]] = []
    for r in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _, batch in zip(range(W_ROUND_BATCHES), it, strict=False):
            w_check(batch)
        fl = (time.perf_counter() - wall, time.process_time() - cpu)
        end = plan.num_batches - r * W_ROUND_BATCHES
        wall, cpu = time.perf_counter(), time.process_time()
        for b in range(end - W_ROUND_BATCHES, end):
            first = sampler.window_starts(plan.batch(b))
            x = blocks_x[first].view(np.float32).reshape(shape_x)
            y = blocks_y[first + W_SIZE].view(np.float32).reshape(shape_y)
            w_check({"inputs": torch.from_numpy(x), "targets": torch.from_numpy(y)})
        raw = (time.perf_counter() - wall, time.process_time() - cpu)
        out.append({"ratio": raw[0] / fl[0], "loader_cpu_us": fl[1] / W_ROUND_BATCHES * 1e6,
                    "raw_cpu_us": raw[1] / W_ROUND_BATCHES * 1e6,
                    "loader_samples_per_s": W_ROUND_BATCHES * BATCH / fl[0],
                    "raw_samples_per_s": W_ROUND_BATCHES * BATCH / raw[0]})  # fmt: skip
    del it
    return {"interleaved": out}


def w_memory_figures() -> dict[str, Any]:
    """What this machine's memory allows: memcpy bandwidth (256 MiB, 1 and 2 threads, best
    of 5) and the bytes a window sample moves; the raw window gather over 4,096 rows (cache
    resident) against the same over the benchmark's rows shows whether the gather is bound
    by memory access or by per-window work."""
    import numpy as np

    from feedline.loader.data.window_gather import window_blocks

    n = 256 << 20
    src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)

    def copy(dst: Any, src: Any, threads: int) -> None:
        parts = [
            (
                dst[i * n // threads : (i + 1) * n // threads],
                src[i * n // threads : (i + 1) * n // threads],
            )
            for i in range(threads)
        ]
        workers = [threading.Thread(target=np.copyto, args=p) for p in parts[1:]]
        for w in workers:
            w.start()
        np.copyto(*parts[0])
        for w in workers:
            w.join()

    out: dict[str, Any] = {"sample_bytes": (W_SIZE + W_HORIZON) * W_FEATURES * 4}
    for threads in (1, 2):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            copy(dst, src, threads)
            times.append(time.perf_counter() - start)
        out[f"memcpy_gb_per_s_{threads}"] = n / min(times) / 1e9
    del src, dst
    rng = np.random.default_rng(SEED)
    for name, rows in (("cached", 4096), ("dram", 10_000_000)):
        values = rng.standard_normal((rows, W_FEATURES), dtype=np.float32)
        bx, by = window_blocks(values, W_SIZE), window_blocks(values, W_HORIZON)
        starts = [rng.integers(0, rows - W_SIZE - W_HORIZON, BATCH) for _ in range(500)]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for s in starts:
                _ = bx[s], by[s + W_SIZE]  # the copies are the measurement
            best = min(best, time.perf_counter() - start)
        out[f"gather_{name}_samples_per_s"] = len(starts) * BATCH / best
    return out


def w_torch_dataset(spec: dict[str, Any]) -> Any:
    """The map-style Dataset a PyTorch user writes: one window sliced per ``__getitem__``."""
    import numpy as np
    import pandas as pd
    import torch
    from torch.utils.data import Dataset

    class SeriesWindows(Dataset):
        def __init__(self, data: np.ndarray, size: int, horizon: int) -> None:
            self.data, self.size, self.horizon = data, size, horizon  # (series, steps, features)
            self.per_series = data.shape[1] - size - horizon + 1

        def __len__(self) -> int:
            return self.data.shape[0] * self.per_series

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            s, t = divmod(i, self.per_series)
            x = self.data[s, t : t + self.size]
            y = self.data[s, t + self.size : t + self.size + self.horizon]
            return {"inputs": torch.from_numpy(x), "targets": torch.from_numpy(y)}

    frame = pd.concat([pd.read_parquet(f) for f in shard_files(spec["dir"])], ignore_index=True)
    frame = frame.sort_values(["series", "t"], kind="stable")
    features = frame[[f"f{j}" for j in range(W_FEATURES)]].to_numpy(dtype=np.float32)
    del frame
    data = features.reshape(spec["series"], spec["steps"], W_FEATURES)
    return SeriesWindows(data, W_SIZE, W_HORIZON)


def w_run_torch(spec: dict[str, Any], batches: int, workers: int) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    def make() -> Iterator[Any]:
        dataset = w_torch_dataset(spec)
        generator = torch.Generator().manual_seed(SEED)
        loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                            drop_last=True, generator=generator)  # fmt: skip
        return iter(loader)

    return w_measure(make, spec, batches, multiprocess=workers > 0)


def w_worker(args: argparse.Namespace) -> None:
    """Child process: run one loader on one dataset; write its result to ``args.result``."""
    spec = json.loads(args.spec)
    fns = {
        "feedline": lambda: w_run_feedline(spec, args.w_batches),
        "feedline-p0": lambda: w_run_feedline(spec, args.w_batches, prefetch=0),
        "torch-dl-w0": lambda: w_run_torch(spec, args.w_batches, 0),
        "torch-dl-w2": lambda: w_run_torch(spec, args.w_batches, 2),
    }
    try:
        result = {"status": "ok", **fns[args.worker]()}
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        sys.stderr.write(traceback.format_exc())
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def w_markdown(results: dict[str, dict[str, dict]], specs: dict[str, dict], command: str) -> str:
    gib = 2**30
    out = ["## Time-series windows: feedline vs a hand-written torch Dataset (bench/loader.py "
           "--case W)", "", "```", command, "```", ""]  # fmt: skip
    out.append(
        f"Window {W_SIZE} steps of {W_FEATURES} float32 features -> target the next "
        f"{W_HORIZON} steps (both `(256, steps, {W_FEATURES})` float32 tensors), batch {BATCH}, "
        "shuffled over all windows, torch tensors out; each loader in its own process. Data: "
        "`series` int32, `t` int64 and `f0..f7` float32 columns, written sorted by feedline "
        f"({SHARDS} zstd Parquet shards); data size = the float32 features. samples/s after "
        "the first batch; first batch includes reading the data (torch: pandas read, sort, "
        "reshape); the median of the round-robin runs (their range in brackets), the other "
        "columns from that run. Peak RSS = the process's `VmHWM`; RSS over imports = peak RSS "
        "minus the RSS right after imports; tree peak = sampled sum over the process and its "
        "workers (shared pages counted per process)."
    )
    out.append("")
    head = ["data", "loader", "samples/s", "vs torch w0", "vs torch w2", "first batch s",
            "peak RSS GiB", "RSS over imports GiB", "over imports / data",
            "tree peak GiB"]  # fmt: skip
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for data, runs in results.items():
        spec = specs[data]
        for name, r in runs.items():
            if r.get("status") != "ok":
                out.append(f"| {data} | {name} | {r.get('status')}: {r.get('error', '')} |")
                continue
            ratios = []
            for peer in ("torch-dl-w0", "torch-dl-w2"):
                p = runs.get(peer, {})
                ok = p.get("status") == "ok"
                ratios.append(f"{r['samples_per_s'] / p['samples_per_s']:.1f}x" if ok else "-")
            over = r["peak_rss"] - r["rss_after_imports"]
            tree = r.get("tree_peak_rss")
            tree_gib = "-" if tree is None else f"{tree / gib:.2f}"
            all_runs = r.get("samples_per_s_runs", [])
            spread = f" ({min(all_runs):,.0f}-{max(all_runs):,.0f})" if len(all_runs) > 1 else ""
            if "load_1min" in r:
                spread += f" [load {r['load_1min']:.1f}]"
            out.append(
                f"| {data} ({spec['series']:,} x {spec['steps']:,} x {W_FEATURES}, "
                f"{spec['data_bytes'] / gib:.2f} GiB) | {name} | "
                f"{r['samples_per_s']:,.0f}{spread} | "
                f"{ratios[0]} | {ratios[1]} | {r['first_batch_s']:.1f} | "
                f"{r['peak_rss'] / gib:.2f} | {over / gib:.2f} | "
                f"{over / spec['data_bytes']:.2f}x | {tree_gib} |"
            )
        fl_run = runs.get("feedline", {})
        if fl_run.get("status") == "ok":
            out.append(f"| {data} | raw gather ceiling, fresh arrays (no loader, 1 thread) | "
                       f"{fl_run['ceiling_samples_per_s']:,.0f} | | | | | | | |")  # fmt: skip
            if "ceiling_blocks_samples_per_s" in fl_run:
                out.append(
                    f"| {data} | raw gather ceiling, one memcpy per window (no loader, "
                    f"1 thread; the loader's way) | "
                    f"{fl_run['ceiling_blocks_samples_per_s']:,.0f} | | | | | | | |"
                )
            if "ceiling_reused_samples_per_s" in fl_run:
                out.append(f"| {data} | raw gather ceiling, into reused buffers (no loader, 1 "
                           f"thread) | {fl_run['ceiling_reused_samples_per_s']:,.0f} | | | | | "
                           "| | |")  # fmt: skip
            if "ceiling_threads_samples_per_s" in fl_run:
                threads, rate_n = fl_run["gather_threads"], fl_run["ceiling_threads_samples_per_s"]
                group = fl_run.get("gather_group", "?")
                out.append(f"| {data} | raw gather ceiling, into fresh arrays, {threads} threads "
                           f"(no loader; groups of {group} batches cut into whole-batch parts, "
                           f"as the loader splits them) | {rate_n:,.0f} | | | | | | | "
                           "|")  # fmt: skip
    out.append("")
    for data, runs in results.items():
        fl_run = runs.get("feedline", {})
        peers = [r["samples_per_s"] for n, r in runs.items()
                 if n.startswith("torch") and r.get("status") == "ok"]  # fmt: skip
        if fl_run.get("status") != "ok" or not peers:
            continue
        speed = fl_run["samples_per_s"] / max(peers)
        memory = (fl_run["peak_rss"] - fl_run["rss_after_imports"]) / specs[data]["data_bytes"]
        out.append(
            f"- {data}: feedline = {speed:.1f}x the faster torch DataLoader (goal >= 10x: "
            f"{'met' if speed >= 10 else 'missed'}); RSS over imports = {memory:.2f}x the data "
            f"(goal <= 1.5x: {'met' if memory <= 1.5 else 'missed'})."
        )
        p0 = runs.get("feedline-p0", {})
        if p0.get("status") == "ok":
            out.append(f"  - feedline with prefetch=0 = {p0['samples_per_s'] / max(peers):.1f}x "
                       "the faster torch DataLoader.")  # fmt: skip
        out.extend(w_ceiling_lines(fl_run, max(peers)))
    return "\n".join(out)


def w_ceiling_lines(r: dict[str, Any], peer: float) -> list[str]:
    """What the machine allows (see w_memory_figures) and feedline's share of it."""
    keys = ("ceiling_samples_per_s", "ceiling_blocks_samples_per_s")
    best = max(r.get(k, 0.0) for k in keys)
    if not best:
        return []
    lines = [f"  - feedline = {r['samples_per_s'] / best:.0%} of the best 1-thread raw gather "
             f"({best:,.0f}/s; process against process); 10x the torch peer needs "
             f"{10 * peer:,.0f}/s = {10 * peer / best:.0%} of it."]  # fmt: skip
    rounds = r.get("interleaved") or []
    if rounds:
        ratios = sorted(x["ratio"] for x in rounds)
        cpu = sorted(x["loader_cpu_us"] / x["raw_cpu_us"] for x in rounds)
        lines.append(
            f"  - interleaved in one process ({len(rounds)} x {W_ROUND_BATCHES} batches each): "
            f"feedline = median {ratios[len(ratios) // 2]:.0%} of the raw gather (range "
            f"{ratios[0]:.0%}-{ratios[-1]:.0%}); CPU per batch {cpu[len(cpu) // 2]:.2f}x the "
            "raw gather's (median; the loader's includes its prefetch thread)."
        )
    if "memcpy_gb_per_s_1" in r:
        size = r["sample_bytes"]
        lines.append(
            f"  - memory: memcpy {r['memcpy_gb_per_s_1']:.1f} GB/s on 1 thread, "
            f"{r['memcpy_gb_per_s_2']:.1f} GB/s on 2; a sample moves {size:,} B (read and "
            f"written), so bandwidth alone would allow {r['memcpy_gb_per_s_1'] * 1e9 / size:,.0f}"
            f"/s on 1 thread. The raw gather reaches {r['gather_dram_samples_per_s']:,.0f}/s "
            f"over 10M rows but {r['gather_cached_samples_per_s']:,.0f}/s over 4,096 "
            "(cache-resident) rows: random window reads from DRAM, not per-window work, bound it."
        )
    return lines


def w_run_child(runner: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    result_file = work / f"result-w-{runner}-{spec['name']}.json"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", "W", "--worker", runner,
           "--spec", json.dumps(spec), "--result", str(result_file),
           "--w-batches", str(args.w_batches)]  # fmt: skip
    log = work / f"log-w-{runner}-{spec['name']}.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                       timeout=args.setup_seconds + 600, check=False)  # fmt: skip
    if result_file.exists():
        return json.loads(result_file.read_text())
    return {"status": "crashed", "error": f"no result (log: {log})"}


def save_case(path: Path, command: str, results: Any, **meta: Any) -> None:
    """Write a named case's results to ``path`` as JSON, with the command and the machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": command, "cpus": os.cpu_count(), "python": platform.python_version(),
            **meta}  # fmt: skip
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))


def w_median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median samples/s (the others' rates kept in ``samples_per_s_runs``)."""
    ok = sorted((r for r in runs if r.get("status") == "ok"), key=lambda r: r["samples_per_s"])
    if not ok:
        return runs[-1]
    return {
        **ok[(len(ok) - 1) // 2],
        "samples_per_s_runs": [r["samples_per_s"] for r in runs if r.get("status") == "ok"],
    }


def case_w(args: argparse.Namespace) -> None:
    """``--case W``: write the window datasets, run each loader in a child, report.

    With ``--w-repeat N`` the loaders run round-robin N times and each reports its median run
    (a busy machine slows whichever loader runs at the time).
    """
    if args.worker:
        w_worker(args)
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    names = ["W-small"] if args.quick else list(W_DATA)
    specs = {name: w_spec(name, Path(args.work)) for name in names}
    runners = [r for r in W_RUNNERS if not args.only or r in args.only]
    results: dict[str, dict[str, dict]] = {}
    for name, spec in specs.items():
        w_make_data(spec)
        runs: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
        for _ in range(args.w_repeat):
            for runner in runners:
                r = w_run_child(runner, spec, args)
                runs[runner].append(r)
                print(f"[{name}] {runner}: {r.get('status')} {rate(r.get('samples_per_s'))} "
                      "samples/s", file=sys.stderr, flush=True)  # fmt: skip
        results[name] = {runner: w_median(rs) for runner, rs in runs.items()}
    command = "flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case W" + (
        " --quick" if args.quick else "") + f" --w-batches {args.w_batches} --w-repeat " + (
        f"{args.w_repeat}")  # fmt: skip
    save_case(W_OUT, command, results, runners=W_RUNNERS, specs=specs)
    print(w_markdown(results, specs, command))


# --------------------------------------------------------------------------- case J: JPEGs
#
# Load-time image decode + augmentation (``--case J``): 5k real-size JPEGs (about 500x400,
# quality 90, cut at random from real photos: scikit-image's and scikit-learn's sample images)
# stored by feedline as encoded bytes + int64 label. Every runner decodes each image, takes a
# RandomResizedCrop(224) and a random horizontal flip, and yields shuffled uint8 batches
# ``(256, 3, 224, 224)`` + labels as torch tensors, with 2 workers on this 2-core machine:
#
# * ceiling-threads / ceiling-processes: the 2-core decode ceiling:
#   feedline.preprocess.vision.augment's pipeline (JPEG draft, one resize) over a plain
#   ThreadPoolExecutor(2) / ProcessPoolExecutor(2)
# * torch-dl-w2: torch DataLoader(num_workers=2) over the map-style Dataset a user writes with
#   Pillow and torchvision's transforms (torchvision itself does not install beside torch 2.13
#   CPU, so its RandomResizedCrop / RandomHorizontalFlip / PILToTensor are written out on
#   Pillow with torch's RNG, as torchvision does them)
# * torch-dl-w2-vision: the same DataLoader calling feedline.preprocess.vision.augment's pipeline
# * feedline-w2-thread / feedline-w2-process: feedline's loader, ``transform=`` the same
#   pipeline, ``num_workers=2`` thread / process workers (see j_run_feedline)
# * decoders: one thread, no loader: Pillow vs simplejpeg decode, and the pipeline with and
#   without draft (the measurement behind using Pillow only)
#
# Every runner runs in its own child process, ``--j-repeat`` times round-robin (a busy machine
# slows whichever runs at the time); the table shows each one's median. Extra packages:
# bench/requirements-loader-images.txt (into the project .venv).

J_OUT = HERE / "out" / "loader_j.json"
J_CROP = 224
J_RUNNERS: dict[str, str] = {
    "ceiling-threads": "feedline.preprocess.vision.augment pipeline over ThreadPoolExecutor(2)",
    "ceiling-processes": (
        "feedline.preprocess.vision.augment pipeline over ProcessPoolExecutor(2), fork"
    ),
    "torch-dl-w2": "torch DataLoader(num_workers=2), Pillow + torchvision's transforms on Pillow",
    "torch-dl-w2-vision": (
        "torch DataLoader(num_workers=2), feedline.preprocess.vision.augment pipeline"
    ),
    "feedline-w2-thread": "feedline loader, transform=pipeline, num_workers=2, thread workers",
    "feedline-w2-process": "feedline loader, transform=pipeline, num_workers=2, process workers",
    "decoders": "one thread: Pillow vs simplejpeg decode; the pipeline with and without draft",
}


def j_photos() -> list[tuple[str, Any]]:
    """Real photos shipped inside wheels: scikit-image's ``skimage.data`` (if installed) and
    scikit-learn's two sample images."""
    from sklearn.datasets import load_sample_images

    photos = []
    try:
        import skimage.data as sk

        for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                     "hubble_deep_field", "retina"):  # fmt: skip
            photos.append((name, getattr(sk, name)()))
    except ImportError:
        print("scikit-image is not installed: only scikit-learn's 2 photos (pip install -r "
              "bench/requirements-loader-images.txt)", file=sys.stderr)  # fmt: skip
    sample = load_sample_images()
    photos += [(Path(f).stem, img) for f, img in zip(sample.filenames, sample.images, strict=True)]
    return photos


def j_spec(work: Path, n: int) -> dict[str, Any]:
    return {"name": "J", "n": n, "dir": str(work / f"J-{n}-jpeg"), "crop": J_CROP}


def j_make_data(spec: dict[str, Any]) -> None:
    """``n`` JPEGs, each a random crop (30-100% of the area, aspect 1.0-1.5) of a real photo,
    flipped at random, resized to 460-540 x 360-440, quality 90; label = the photo's number."""
    import io

    import numpy as np
    import pyarrow as pa
    from PIL import Image

    import feedline as fl

    out = Path(spec["dir"])
    if (out / "_feedline.json").exists():
        return
    start = time.perf_counter()
    photos = [Image.fromarray(a).convert("RGB") for _, a in j_photos()]
    rng = np.random.default_rng(SEED)
    blobs, labels, sizes = [], [], []
    for i in range(spec["n"]):
        label = i % len(photos)
        im = photos[label]
        W, H = im.size
        area, aspect = rng.uniform(0.3, 1.0) * W * H, rng.uniform(1.0, 1.5)
        w, h = min(W, int((area * aspect) ** 0.5)), min(H, int((area / aspect) ** 0.5))
        left, top = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
        size = (int(rng.integers(460, 541)), int(rng.integers(360, 441)))
        picture = im.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            picture = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        picture.save(buf, "JPEG", quality=90)
        blobs.append(buf.getvalue())
        labels.append(label)
        sizes.append(size)
    table = pa.table({"bytes": pa.array(blobs, pa.binary()), "label": pa.array(labels, pa.int64())})
    n = spec["n"]
    fl.from_arrow(table).write(out, rows_per_shard=-(-n // SHARDS), bytes_per_shard=None,
                               row_group_rows=BATCH, compression=None)  # fmt: skip
    mean = np.mean(sizes, axis=0)
    print(f"wrote J: {n} JPEGs, mean {mean[0]:.0f}x{mean[1]:.0f}, "
          f"{sum(map(len, blobs)) / n / 1e3:.0f} kB each, from {len(photos)} photos, in "
          f"{time.perf_counter() - start:.1f}s -> {out}", flush=True)  # fmt: skip


def j_load(spec: dict[str, Any]) -> tuple[list[bytes], Any]:
    """The encoded images (in memory) and labels, read from the dataset's shards."""
    import pyarrow.parquet as pq

    table = pq.read_table(shard_files(spec["dir"]), columns=["bytes", "label"])
    return table.column("bytes").to_pylist(), table.column("label").to_numpy()


def j_pipeline() -> Any:
    """The per-sample function every feedline-side runner uses: decode (JPEG draft where the
    crop allows), RandomResizedCrop(224), flip, uint8 CHW."""
    from feedline.preprocess.vision import augment as v

    return v.Compose([v.RandomResizedCrop(J_CROP), v.RandomHorizontalFlip(), v.ToArray("CHW")])


def j_measure(make_epoch: Callable[[int], Iterator[dict[str, Any]]], spec: dict[str, Any],
              args: argparse.Namespace, multiprocess: bool) -> dict[str, Any]:  # fmt: skip
    """First batch (building included), then samples/s over the rest of ``--j-epochs``."""
    import torch

    def check(batch: dict[str, Any]) -> int:
        x, y = batch["image"], batch["label"]
        if tuple(x.shape) != (BATCH, 3, J_CROP, J_CROP) or x.dtype != torch.uint8 or (
                y.dtype != torch.int64 or len(y) != BATCH):  # fmt: skip
            raise AssertionError(
                f"image {tuple(x.shape)} {x.dtype}, label {y.dtype}: expected "
                f"({BATCH}, 3, {J_CROP}, {J_CROP}) uint8 and int64"
            )
        return BATCH

    sampler = TreeSampler() if multiprocess else None
    start, cpu = time.perf_counter(), j_tree_cpu()
    batches = make_epoch(0)
    check(next(batches))
    first = time.perf_counter()
    samples = 0
    for epoch in range(args.j_epochs):
        if epoch:
            batches = make_epoch(epoch)
        for batch in batches:
            samples += check(batch)
    end, cpu = time.perf_counter(), j_tree_cpu() - cpu
    del batches
    return {"first_batch_s": first - start, "samples_per_s": samples / (end - first),
            "seconds": end - first, "samples": samples, "cpu_s": cpu,
            "samples_per_cpu_s": (samples + BATCH) / cpu if cpu > 0 else None,
            "tree_peak_rss": sampler.stop() if sampler else None}  # fmt: skip


def j_tree_cpu() -> float:
    """CPU seconds (user + system) used so far by this process, its threads and its children:
    live ones read with psutil, exited ones from ``os.times`` once reaped. A difference of two
    readings is the CPU the whole tree spent in between."""
    import psutil

    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def j_epoch_order(n: int, epoch: int) -> Any:
    import numpy as np

    return np.random.default_rng([SEED, epoch]).permutation(n)[: n // BATCH * BATCH]


_J_STATE: dict[str, Any] = {}  # what forked pool processes inherit: blobs and the pipeline


def _j_work(key: tuple[int, int]) -> Any:
    """One sample in a pool process: ``(epoch, index)`` -> uint8 CHW array."""
    from feedline.loader.order.rng import sample_rng

    epoch, i = key
    return _J_STATE["fn"](_J_STATE["blobs"][i], sample_rng(SEED, epoch, i), index=i)


def j_run_pool(spec: dict[str, Any], args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The 2-core ceiling: the pipeline over a plain executor, stacked into batches."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    import numpy as np
    import torch

    blobs, labels = j_load(spec)
    _J_STATE.update(blobs=blobs, fn=j_pipeline())
    if kind == "threads":
        pool: Any = ThreadPoolExecutor(2)
    else:  # forked after _J_STATE is set: the children inherit the blobs, nothing is pickled
        pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    chunk = 1 if kind == "threads" else 8

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        order = j_epoch_order(len(blobs), epoch)
        results = pool.map(_j_work, [(epoch, int(i)) for i in order], chunksize=chunk)
        for b in range(len(order) // BATCH):
            images = np.stack([next(results) for _ in range(BATCH)])
            yield {"image": torch.from_numpy(images),
                   "label": torch.from_numpy(labels[order[b * BATCH:(b + 1) * BATCH]])}  # fmt: skip

    try:
        return j_measure(make_epoch, spec, args, multiprocess=kind == "processes")
    finally:
        pool.shutdown(cancel_futures=True)


def j_torch_dataset(blobs: list[bytes], labels: Any, vision: bool) -> Any:
    """The map-style Dataset a PyTorch user writes (``vision``: feedline's pipeline inside)."""
    import io
    import math

    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import Dataset

    class Jpegs(Dataset):
        def __init__(self) -> None:
            self.epoch = 0
            self.fn = j_pipeline() if vision else None

        def __len__(self) -> int:
            return len(blobs)

        def __getitem__(self, i: int) -> dict[str, Any]:
            if self.fn is not None:
                from feedline.loader.order.rng import sample_rng

                x = torch.from_numpy(self.fn(blobs[i], sample_rng(SEED, self.epoch, i), index=i))
                return {"image": x, "label": labels[i]}
            # torchvision: pil_loader, RandomResizedCrop(224), RandomHorizontalFlip, PILToTensor
            img = Image.open(io.BytesIO(blobs[i])).convert("RGB")
            width, height = img.size
            top, left, h, w = self.get_params(width, height)
            img = img.crop((left, top, left + w, top + h)).resize(
                (J_CROP, J_CROP), Image.Resampling.BILINEAR
            )
            if torch.rand(1) < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            x = torch.as_tensor(np.array(img, copy=True)).view(J_CROP, J_CROP, 3).permute(2, 0, 1)
            return {"image": x, "label": labels[i]}

        @staticmethod
        def get_params(width: int, height: int) -> tuple[int, int, int, int]:
            """torchvision's RandomResizedCrop.get_params, scale (0.08, 1), ratio (3/4, 4/3)."""
            area = height * width
            log_ratio = torch.log(torch.tensor((3 / 4, 4 / 3)))
            for _ in range(10):
                target_area = area * torch.empty(1).uniform_(0.08, 1.0).item()
                aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
                w = round(math.sqrt(target_area * aspect))
                h = round(math.sqrt(target_area / aspect))
                if 0 < w <= width and 0 < h <= height:
                    i = int(torch.randint(0, height - h + 1, size=(1,)).item())
                    j = int(torch.randint(0, width - w + 1, size=(1,)).item())
                    return i, j, h, w
            in_ratio = width / height
            if in_ratio < 3 / 4:
                w, h = width, round(width / (3 / 4))
            elif in_ratio > 4 / 3:
                w, h = round(height * (4 / 3)), height
            else:
                w, h = width, height
            return (height - h) // 2, (width - w) // 2, h, w

    return Jpegs()


def j_run_torch(spec: dict[str, Any], args: argparse.Namespace, vision: bool) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    blobs, labels = j_load(spec)
    dataset = j_torch_dataset(blobs, labels, vision)
    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
            holder["dl"] = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2,
                                      drop_last=True)  # fmt: skip
        dataset.epoch = epoch  # workers are forked per epoch: they see it
        return iter(holder["dl"])

    return j_measure(make_epoch, spec, args, multiprocess=True)


def j_run_feedline(spec: dict[str, Any], args: argparse.Namespace, worker_type: str) -> dict:
    """Feedline's own loader (Loader v2) with ``num_workers=2`` thread or process workers.

    ``transform=j_pipeline()`` runs per sample in the workers (each batch split in 2
    chunks) with the generator of ``(SEED, epoch, index)``; the stacked uint8 batches come
    back in order (process workers: through shared memory). The loader reads the encoded
    bytes from its cache; the pipeline writes the decoded image over ``bytes``.
    """
    import feedline as fl

    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            holder["loader"] = fl.open(spec["dir"]).loader(
                batch_size=BATCH, shuffle=True, seed=SEED, drop_last=True, format="torch",
                transform=j_pipeline(), num_workers=2, worker_type=worker_type,
            )  # fmt: skip
        holder["loader"].set_epoch(epoch)
        return ({"image": b["bytes"], "label": b["label"]} for b in holder["loader"])

    return j_measure(make_epoch, spec, args, multiprocess=worker_type == "process")


def j_run_decoders(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One thread, ``--j-decode-images`` images, 5 interleaved rounds: the best round's
    images per second of this thread's CPU time (``time.thread_time``: what other processes
    on a busy machine take does not count)."""
    import io

    import numpy as np
    from PIL import Image

    from feedline.loader.order.rng import sample_rng
    from feedline.preprocess.vision.decode import draft_scale, open_image

    blobs = j_load(spec)[0][: args.j_decode_images]
    fn, nodraft = j_pipeline(), j_pipeline()
    nodraft.draft = False

    def torchvision_way(i: int, b: bytes) -> Any:  # decode all, crop, resize (same geometry)
        img = Image.open(io.BytesIO(b)).convert("RGB")
        view = fn.plan(img.size, sample_rng(SEED, 0, i))
        x0, y0, x1, y1 = (int(v) for v in view.box)
        out = img.crop((x0, y0, x1, y1)).resize(view.size, Image.Resampling.BILINEAR)
        return np.asarray(out)

    variants: dict[str, Callable[[int, bytes], Any]] = {
        "Pillow decode to an RGB array": lambda i, b: np.asarray(Image.open(io.BytesIO(b))),
        "pipeline: decode + crop + flip, uint8 CHW (draft)": lambda i, b: fn(
            b, sample_rng(SEED, 0, i)
        ),
        "pipeline without draft": lambda i, b: nodraft(b, sample_rng(SEED, 0, i)),
        "Pillow decode all, crop, resize (torchvision's way)": torchvision_way,
    }
    try:
        import simplejpeg

        variants["simplejpeg decode to an RGB array"] = lambda i, b: simplejpeg.decode_jpeg(b)

        def sj_pipeline(i: int, b: bytes) -> Any:  # the pipeline with simplejpeg decoding
            im, _ = open_image(b)  # header: size (and orientation)
            view = fn.plan(im.size, sample_rng(SEED, 0, i))
            (x0, y0, x1, y1), (w, h) = view.box, im.size
            s = draft_scale((x1 - x0, y1 - y0), view.size)  # simplejpeg's DCT scaling
            pixels = simplejpeg.decode_jpeg(b, min_width=-(-w // s), min_height=-(-h // s))
            out = np.asarray(
                Image.fromarray(pixels).resize(
                    view.size, Image.Resampling.BILINEAR, box=(x0 / s, y0 / s, x1 / s, y1 / s)
                )
            )
            return np.ascontiguousarray((out[:, ::-1] if view.flip else out).transpose(2, 0, 1))

        variants["the pipeline with simplejpeg decoding (+ Image.fromarray)"] = sj_pipeline
    except ImportError:
        print("simplejpeg is not installed: pip install -r bench/requirements-loader-images.txt",
              file=sys.stderr)  # fmt: skip
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(5):
        for name, fn_ in variants.items():
            t = time.thread_time()
            for i, b in enumerate(blobs):
                fn_(i, b)
            best[name] = min(best[name], time.thread_time() - t)
    return {"images": len(blobs), "images_per_cpu_s": {k: len(blobs) / v for k, v in best.items()}}


def j_worker(args: argparse.Namespace) -> None:
    """Child process: run one J runner; write its result (or error) to ``args.result``."""
    spec = json.loads(args.spec)
    fns: dict[str, Callable[[], dict[str, Any]]] = {
        "ceiling-threads": lambda: j_run_pool(spec, args, "threads"),
        "ceiling-processes": lambda: j_run_pool(spec, args, "processes"),
        "torch-dl-w2": lambda: j_run_torch(spec, args, vision=False),
        "torch-dl-w2-vision": lambda: j_run_torch(spec, args, vision=True),
        "feedline-w2-thread": lambda: j_run_feedline(spec, args, "thread"),
        "feedline-w2-process": lambda: j_run_feedline(spec, args, "process"),
        "decoders": lambda: j_run_decoders(spec, args),
    }
    try:
        result = {"status": "ok", **fns[args.worker]()}
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        sys.stderr.write(traceback.format_exc())
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def j_run_child(name: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    result_file = Path(args.work) / f"result-J-{name}.json"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", "J", "--worker", name,
           "--spec", json.dumps(spec), "--result", str(result_file), "--work", str(args.work),
           "--j-epochs", str(args.j_epochs),
           "--j-decode-images", str(args.j_decode_images)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = Path(args.work) / f"log-J-{name}.txt"
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                              timeout=args.setup_seconds + 600, check=False)  # fmt: skip
    if result_file.exists():
        return json.loads(result_file.read_text())
    tail = log.read_text().strip().splitlines()[-1:] or [""]
    return {"status": "crashed", "error": f"exit {proc.returncode}: {tail[0][:300]} (log: {log})"}


def j_median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("status") == "ok" and "samples_per_s" in r]
    if not ok:
        return runs[-1]
    ok.sort(key=lambda r: r["samples_per_s"])
    mid = dict(ok[len(ok) // 2])
    mid["runs_samples_per_s"] = [r["samples_per_s"] for r in runs if r.get("status") == "ok"]
    return mid


def j_markdown(results: dict[str, dict[str, Any]], spec: dict[str, Any], command: str) -> str:
    ok = {k: v for k, v in results.items() if v.get("status") == "ok" and "samples_per_s" in v}
    ceiling = max((ok[k]["samples_per_s"] for k in ("ceiling-threads", "ceiling-processes")
                   if k in ok), default=None)  # fmt: skip
    out = ["## Load-time JPEG decode + RandomResizedCrop(224) + flip, 2 workers (bench/loader.py "
           "--case J)", "", "```", command, "```", "",
           f"{spec['n']:,} real-size JPEGs (about 500x400, quality 90, random crops of real "
           "photos) stored by feedline as encoded bytes + label; shuffled batches of "
           f"{BATCH} uint8 (3, {J_CROP}, {J_CROP}) torch tensors; samples/s after the first "
           "batch, median of the runs; ceiling = the better of the two plain pools.", "",
           "Samples per CPU-second: all samples (first batch included) over the CPU time of "
           "the runner's whole process tree from building it to the end (what a sample costs, "
           "whatever else runs on the machine; 2 idle cores give at most twice that per "
           "second).", "",
           "| runner | samples/s | vs ceiling | samples per CPU-s | first batch s | runs | what |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        if name == "decoders":
            continue
        if name not in ok:
            out.append(f"| {name} | - | - | - | - | - | {r.get('status')}: "
                       f"{r.get('error', '')} |")  # fmt: skip
            continue
        vs = f"{r['samples_per_s'] / ceiling:.0%}" if ceiling else "-"
        runs = ", ".join(f"{x:,.0f}" for x in r.get("runs_samples_per_s", []))
        out.append(f"| {name} | {r['samples_per_s']:,.0f} | {vs} | "
                   f"{rate(r.get('samples_per_cpu_s'))} | {r['first_batch_s']:.2f} | {runs} | "
                   f"{J_RUNNERS[name]} |")  # fmt: skip
    dec = results.get("decoders", {})
    if dec.get("status") == "ok":
        out += ["", f"One thread, {dec['images']} of the images, best of 5 rounds, images per "
                "CPU second of the thread:", ""]  # fmt: skip
        out += [f"- {k}: {v:,.0f}" for k, v in dec["images_per_cpu_s"].items()]
    for name in ("feedline-w2-thread", "feedline-w2-process"):
        torch_dl = ok.get("torch-dl-w2", {}).get("samples_per_s")
        if name in ok and ceiling and torch_dl:
            rate_ = ok[name]["samples_per_s"]
            out.append(f"- goal {name}: {rate_ / ceiling:.0%} of the ceiling (goal ≥ 90%), "
                       f"{rate_ / torch_dl:.2f}× torch DataLoader w2 (goal ≥ 1)")  # fmt: skip
    return "\n".join(out)


def case_j(args: argparse.Namespace) -> None:
    """``--case J``: write the JPEG dataset, run each runner in a child, report."""
    if args.worker:
        j_worker(args)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spec = j_spec(work, 1000 if args.quick else args.j_images)
    j_make_data(spec)
    runners = [r for r in J_RUNNERS if not args.only or r in args.only]
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
    for _ in range(args.j_repeat):
        for runner in runners:
            if runs[runner] and runner == "decoders":
                continue  # once: best of 5 rounds inside already
            r = j_run_child(runner, spec, args)
            runs[runner].append(r)
            print(f"[J] {runner}: {r.get('status')} {rate(r.get('samples_per_s'))} samples/s "
                  f"{'' if r.get('status') == 'ok' else r.get('error')}", file=sys.stderr,
                  flush=True)  # fmt: skip
    results = {runner: j_median(rs) for runner, rs in runs.items()}
    command = ("flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case J"
               + (" --quick" if args.quick else "") + f" --j-repeat {args.j_repeat}"
               + f" --j-epochs {args.j_epochs}")  # fmt: skip
    save_case(J_OUT, command, results, runners=J_RUNNERS, spec=spec)
    print(j_markdown(results, spec, command))


# --------------------------------------------------------------------------- case A-wide, B
#
# Wide tables (``--case A-wide``): 1M rows of 32 separate float32 columns + an int64 label
# (the shape a CSV, a pandas frame or a Spark table gives), feedline with ``stack=`` and with
# the per-column dict vs the peers this file runs in the project venv (torch DataLoader over
# pandas, tf.data, Ray Data) vs the packed row-major ``np.take`` ceiling. Images
# (``--case B``): 100k 3x64x64 uint8 written with ``ds.write``, ``fl.open(...).loader(...)``:
# time to the first batch, samples/s, and the cache fill's bytes/s next to the same data
# stored as before (tensors as Parquet lists), also for 1M x float32[32]. Each loader runs in
# its own process; results go to ``bench/out/loader_awide.json`` / ``loader_b.json``.

AW_OUT = HERE / "out" / "loader_awide.json"
#: case A-wide: interleaved (loader epoch, ceiling epoch) rounds after the timed runs
AW_ROUNDS = 25
B_OUT = HERE / "out" / "loader_b.json"
AW_COLUMNS = [f"f{i}" for i in range(32)]
AW_RUNNERS: dict[str, str] = {
    "feedline-stack": "feedline fl.open(path).loader(stack={'features': f0..f31}, shuffle=True, "
    "format='torch'): one (256, 32) float32 tensor + label",
    "feedline-dict": "feedline fl.open(path).loader(shuffle=True, format='torch'): the per-column "
    "dict, 32 float32 tensors (views of the gathered block) + label",
    "torch-dl-w0": "torch DataLoader(RandomSampler, workers=0) over a map-style Dataset of the "
    "pandas frame's features stacked once (frame[f0..f31].to_numpy())",
    "torch-dl-w2": "the same with num_workers=2",
    "tf-data": "tf.data from_tensor_slices(stacked features, label) -> shuffle(all rows) -> batch",
    "ray-data": "Ray Data read_parquet -> iter_torch_batches(local shuffle buffer 10%) -> "
    "torch.stack of the 32 columns",
}
#: peers of the packed case this file runs that need their own venv (bench/.venvs)
AW_SKIPPED = {
    "hf-datasets": "peers venv (bench/setup_peers.sh) not set up here",
    "petastorm": "petastorm venv not set up here; also drops row groups (see case A)",
    "mosaic": "needs an MDS conversion and the peers venv",
}
B_RUNNERS = {
    "feedline": "fl.open(path).loader(batch_size=256, shuffle=True, format='torch'), dataset "
    "written by ds.write (tensors stored as fixed-size binary)",
    "feedline-lists": "the same loader over the same rows stored as before: tensors as Parquet "
    "lists (a repetition and a definition level per value, uint8 as INT32)",
}


def aw_spec(work: Path, quick: bool) -> dict[str, Any]:
    n = 100_000 if quick else 1_000_000
    return {"name": "A-wide", "n": n, "dir": str(work / f"A-wide-{n}"), "feature": "features",
            "shape": [32], "dtype": "float32"}  # fmt: skip


def aw_make_data(spec: dict[str, Any]) -> None:
    """32 float32 columns ``f0..f31`` + ``label`` int64, written by feedline (4 shards)."""
    import numpy as np
    import pyarrow as pa

    import feedline as fl

    out = Path(spec["dir"])
    if (out / "_feedline.json").exists():
        return
    n, rng = spec["n"], np.random.default_rng(SEED)
    columns = {name: rng.standard_normal(n, dtype=np.float32) for name in AW_COLUMNS}
    table = pa.table(columns | {"label": rng.integers(0, 10, n)})
    start = time.perf_counter()
    fl.from_arrow(table).write(out, rows_per_shard=n // SHARDS, bytes_per_shard=None,
                               row_group_rows=n // 16)  # fmt: skip
    print(f"wrote A-wide: {n:,} rows in {time.perf_counter() - start:.1f}s", flush=True)


def aw_feedline(spec: dict[str, Any], args: argparse.Namespace, stack: bool) -> dict[str, Any]:
    import numpy as np
    import torch

    import feedline as fl

    holder: dict[str, Any] = {}
    kwargs = {"stack": {"features": AW_COLUMNS}} if stack else {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            holder["loader"] = fl.open(spec["dir"]).loader(
                batch_size=BATCH, shuffle=True, seed=SEED, format="torch", **kwargs
            )
        holder["loader"].set_epoch(epoch)
        return iter(holder["loader"])

    checked = spec if stack else {**spec, "feature": "f31", "shape": []}
    result = measure(make_epoch, checked, args, multiprocess=False)
    loader = holder["loader"]
    result["cache_bytes"] = loader.stats()["cache_bytes"]
    result["peak_rss"] = w_peak_rss()
    if not stack:
        return result
    # the packed row-major ceiling: the loader's own (rows, 32) block and label, the very same
    # index arrays, one np.take per array and batch, no loader around it
    cache = loader._prepare().source
    x, y = cache.storage["features"], cache.storage["label"][:, 0]
    orders = []
    for e in range(max(1, result["epochs_complete"])):
        loader.set_epoch(e)
        orders.append(loader._plan().indices)

    def gather_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        order = orders[epoch % len(orders)]
        for b in range(len(order) // BATCH):
            idx = order[b * BATCH : (b + 1) * BATCH]
            yield {"features": torch.from_numpy(np.take(x, idx, axis=0)),
                   "label": torch.from_numpy(np.take(y, idx))}  # fmt: skip

    ceiling = measure(gather_epoch, spec, args, multiprocess=False)
    result["ceiling"] = {k: ceiling[k] for k in ("samples_per_s", "seconds", "rows")}
    # interleaved: one loader epoch, then the ceiling over that epoch's order, AW_ROUNDS
    # times; the median ratio holds up on a busy machine, whose swings hit whichever of the
    # two separate runs above happens to be running
    # CPU per sample of each side too (the loader's includes its prefetch thread and the
    # next epoch's order drawn on a background thread; the ceiling's indices are given)
    ratios, cpu = [], []
    for r in range(AW_ROUNDS):
        epoch = result["epochs_complete"] + 1 + r
        loader.set_epoch(epoch)
        start, rows, used = time.perf_counter(), 0, time.process_time()
        for batch in loader:
            rows += len(batch["label"])
        rate = rows / (time.perf_counter() - start)
        loader_cpu = (time.process_time() - used) / rows
        orders = [np.array(loader._plan(epoch).indices)]
        start, used = time.perf_counter(), time.process_time()
        ceiling_rows = sum(len(b["label"]) for b in gather_epoch(0))
        ratios.append(rate / (ceiling_rows / (time.perf_counter() - start)))
        cpu.append((loader_cpu * 1e9, (time.process_time() - used) / ceiling_rows * 1e9))
    result["interleaved_ratios"], result["interleaved_cpu_ns"] = ratios, cpu
    from feedline.loader.order.sample_order import epoch_permutation

    used = time.process_time()  # what an epoch's order costs (drawn ahead by the loader)
    epoch_permutation(spec["n"], SEED, 10**6)
    result["order_cpu_ms"] = (time.process_time() - used) * 1e3
    return result


def aw_frame(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The features stacked once into a (rows, 32) float32 array and the labels (pandas)."""
    import numpy as np
    import pandas as pd

    frame = pd.concat([pd.read_parquet(f) for f in shard_files(spec["dir"])], ignore_index=True)
    return frame[AW_COLUMNS].to_numpy(dtype=np.float32), frame["label"].to_numpy()


def aw_torch(spec: dict[str, Any], args: argparse.Namespace, workers: int) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, Dataset, RandomSampler

    class Rows(Dataset):
        def __init__(self) -> None:
            self.x, self.y = aw_frame(spec)

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"features": self.x[i], "label": self.y[i]}

    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            data = Rows()
            sampler = RandomSampler(data, generator=torch.Generator().manual_seed(SEED))
            holder["dl"] = DataLoader(data, batch_size=BATCH, sampler=sampler,
                                      num_workers=workers, drop_last=True)  # fmt: skip
        return iter(holder["dl"])

    result = measure(make_epoch, spec, args, multiprocess=workers > 0)
    result["peak_rss"] = w_peak_rss()
    return result


def aw_tf(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf
    import torch

    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            table = pq.read_table(shard_files(spec["dir"]))
            x = np.stack([table[c].to_numpy() for c in AW_COLUMNS], axis=1)
            y = table["label"].to_numpy()
            holder["ds"] = (
                tf.data.Dataset.from_tensor_slices({"features": x, "label": y})
                .shuffle(len(y), seed=SEED, reshuffle_each_iteration=True)
                .batch(BATCH, drop_remainder=True)
                .prefetch(tf.data.AUTOTUNE)
            )
        for batch in holder["ds"]:
            yield {k: torch.from_numpy(v.numpy()) for k, v in batch.items()}

    result = measure(make_epoch, spec, args, multiprocess=False)
    result["peak_rss"] = w_peak_rss()
    return result


def aw_ray(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import ray
    import torch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    buffer = int(spec["n"] * SHUFFLE_BUFFER_FRACTION)

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        ds = ray.data.read_parquet(shard_files(spec["dir"]))
        for batch in ds.iter_torch_batches(
            batch_size=BATCH,
            local_shuffle_buffer_size=buffer,
            local_shuffle_seed=SEED + epoch,
            drop_last=True,
        ):
            yield {"features": torch.stack([batch[c] for c in AW_COLUMNS], dim=1),
                   "label": batch["label"]}  # fmt: skip

    try:
        result = measure(make_epoch, spec, args, multiprocess=True)
    finally:
        ray.shutdown()
    result["peak_rss"] = w_peak_rss()
    result["shuffle_buffer_rows"] = buffer
    return result


B_DATA: dict[str, dict[str, Any]] = {
    "B": {"rows": 100_000, "quick_rows": 10_000, "feature": "image", "shape": [3, 64, 64],
          "dtype": "uint8"},
    "A32": {"rows": 1_000_000, "quick_rows": 100_000, "feature": "x", "shape": [32],
            "dtype": "float32"},
}  # fmt: skip


def b_specs(work: Path, quick: bool) -> dict[str, dict[str, Any]]:
    specs = {}
    for name, d in B_DATA.items():
        n = d["quick_rows"] if quick else d["rows"]
        for encoding in ("binary", "lists"):
            key = f"{name}-{encoding}"
            # "-p1m": written with pages of about 1 MiB (feedline/store/shards.py PAGE_BYTES);
            # data written before that has 12.6 MB pages and is written again
            folder = f"{name}-{n}-{encoding}" + ("-p1m" if encoding == "binary" else "")
            specs[key] = {**d, "name": key, "data": name, "encoding": encoding, "n": n,
                          "dir": str(work / folder)}  # fmt: skip
    return specs


def b_table(spec: dict[str, Any]) -> Any:
    import numpy as np
    import pyarrow as pa

    rng, n, shape = np.random.default_rng(SEED), spec["n"], (spec["n"], *spec["shape"])
    if spec["dtype"] == "uint8":
        values = rng.integers(0, 256, shape, dtype=np.uint8)
    else:
        values = rng.standard_normal(shape, dtype=np.float32)
    tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(values)
    return pa.table({spec["feature"]: tensor, "label": rng.integers(0, 10, n)})


def b_write_lists(table: Any, out: Path) -> None:
    """``table`` as feedline wrote it before tensors were stored as binary: list-encoded
    tensor columns (dictionary tried as ``dictionary_columns`` says, zstd, page checksums),
    4 shards of 4 row groups, a manifest with sizes, sha256 and footer digests."""
    import pyarrow.parquet as pq

    from feedline.io.storage.paths import resolve
    from feedline.store.footers import footer_of
    from feedline.store.manifest import MANIFEST_NAME, Manifest, ShardInfo
    from feedline.store.shards import dictionary_columns, file_checksum

    out.mkdir(parents=True, exist_ok=True)
    n, shards = table.num_rows, []
    for i in range(SHARDS):
        part, name = table.slice(i * n // SHARDS, n // SHARDS), f"part-{i:05d}.parquet"
        pq.write_table(
            part,
            out / name,
            row_group_size=n // 16,
            compression="zstd",
            use_dictionary=dictionary_columns(table.schema),
            write_page_checksum=True,
        )
        loc = resolve(out / name)
        size, checksum = file_checksum(loc)
        footer = footer_of(loc)
        shards.append(ShardInfo(name, part.num_rows, size, footer.row_groups, checksum,
                                footer.digest, True))  # fmt: skip
    (out / MANIFEST_NAME).write_text(Manifest(table.schema, shards).to_json())


def b_make_data(spec: dict[str, Any]) -> None:
    import feedline as fl

    out = Path(spec["dir"])
    if (out / "_feedline.json").exists():
        return
    table, start = b_table(spec), time.perf_counter()
    if spec["encoding"] == "binary":
        fl.from_arrow(table).write(out, rows_per_shard=spec["n"] // SHARDS, bytes_per_shard=None,
                                   row_group_rows=spec["n"] // 16)  # fmt: skip
    else:
        b_write_lists(table, out)
    print(f"wrote {spec['name']}: {spec['n']:,} rows in {time.perf_counter() - start:.1f}s",
          flush=True)  # fmt: skip


def b_feedline(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """First batch and samples/s of ``fl.open(path).loader``; then the cache fill alone."""
    import torch  # noqa: F401  (imported before the clock starts, as a training script has it)

    import feedline as fl

    holder: dict[str, Any] = {}

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            holder["loader"] = fl.open(spec["dir"]).loader(batch_size=BATCH, shuffle=True,
                                                           seed=SEED, format="torch")  # fmt: skip
        holder["loader"].set_epoch(epoch)
        return iter(holder["loader"])

    result = measure(make_epoch, spec, args, multiprocess=False)
    result["cache_bytes"] = holder.pop("loader").stats()["cache_bytes"]
    result["peak_rss"] = w_peak_rss()
    fills, firsts = [], []
    for _ in range(args.b_fills):  # opened afresh each time (page cache warm): the first
        start = time.perf_counter()  # batch, then the rest of the fill (a memory cache of
        loader = fl.open(spec["dir"]).loader(batch_size=BATCH, shuffle=True, seed=SEED,
                                             format="torch")  # fmt: skip
        next(iter(loader))  # >= 64 MB copies its data pages in the background: page_tasks.py)
        firsts.append(time.perf_counter() - start)
        cache = loader._prepare().source
        if hasattr(cache, "wait"):
            cache.wait()
        fills.append(time.perf_counter() - start)  # the whole fill, first batch included
        loader.close()
        del loader, cache
    result["fill_s"] = sorted(fills)[len(fills) // 2]
    result["first_batch_median_s"] = sorted(firsts)[len(firsts) // 2]
    result["first_batch_runs_s"] = firsts
    result["fill_bytes_per_s"] = result["cache_bytes"] / result["fill_s"]
    result.update(b_node_first_batches(spec, args))
    return result


def b_node_first_batches(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """First batch with ``cache="node"`` (median of ``--b-fills``): cold = the node cache file
    is built (what the first rank of a fresh node waits for), warm = it exists (what the
    other ranks and a restarted job wait for). Loader creation + first batch, page cache warm
    for the shards; the file lives under ``--work`` (a local disk)."""
    import shutil

    import feedline as fl

    folder = Path(spec["dir"]).parent / f"node-cache-{spec['name']}"
    cold, warm = [], []

    def first_batch() -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        options = {"shuffle": True, "seed": SEED, "format": "torch", "cache_dir": folder}
        loader = fl.open(spec["dir"]).loader(batch_size=BATCH, cache="node", **options)
        next(iter(loader))
        took = time.perf_counter() - start
        stats = loader.stats()
        loader.close()
        return took, stats

    for _ in range(args.b_fills):
        shutil.rmtree(folder, ignore_errors=True)  # unflushed pages of the old file go with it
        took, stats = first_batch()
        assert stats["node_cache_built"], stats
        cold.append(took)
        took, stats = first_batch()
        assert not stats["node_cache_built"], stats
        warm.append(took)
    shutil.rmtree(folder, ignore_errors=True)
    return {"node_cold_first_batch_s": sorted(cold)[len(cold) // 2],
            "node_warm_first_batch_s": sorted(warm)[len(warm) // 2],
            "node_cold_runs_s": cold, "node_warm_runs_s": warm,
            "load_avg_1m": os.getloadavg()[0]}  # fmt: skip


def awb_worker(args: argparse.Namespace) -> None:
    """Child process of cases A-wide and B: one runner; its result to ``args.result``."""
    spec = json.loads(args.spec)
    fns: dict[str, Callable[[], dict[str, Any]]] = {
        "feedline-stack": lambda: aw_feedline(spec, args, stack=True),
        "feedline-dict": lambda: aw_feedline(spec, args, stack=False),
        "torch-dl-w0": lambda: aw_torch(spec, args, 0),
        "torch-dl-w2": lambda: aw_torch(spec, args, 2),
        "tf-data": lambda: aw_tf(spec, args),
        "ray-data": lambda: aw_ray(spec, args),
        "feedline": lambda: b_feedline(spec, args),
        "feedline-lists": lambda: b_feedline(spec, args),
    }
    try:
        result = {"status": "ok", **fns[args.worker]()}
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        sys.stderr.write(traceback.format_exc())
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def awb_run_child(runner: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    result_file = work / f"result-{spec['name']}-{runner}.json"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", args.case, "--worker",
           runner, "--spec", json.dumps(spec), "--result", str(result_file),
           "--min-seconds", str(args.min_seconds), "--cap-seconds", str(args.cap_seconds),
           "--max-epochs", str(args.max_epochs), "--b-fills", str(args.b_fills)]  # fmt: skip
    log = work / f"log-{spec['name']}-{runner}.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}
    try:
        with open(log, "w") as out:
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                           timeout=args.cap_seconds + args.setup_seconds, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result in time (log: {log})"}
    if result_file.exists():
        return json.loads(result_file.read_text())
    return {"status": "crashed", "error": f"no result (log: {log})"}


def awb_defaults(args: argparse.Namespace) -> None:
    if args.min_seconds is None:
        args.min_seconds = 2.0 if args.quick else 5.0
    if args.cap_seconds is None:
        args.cap_seconds = 8.0 if args.quick else 25.0


def aw_markdown(results: dict[str, dict], spec: dict[str, Any], command: str) -> str:
    out = ["## Wide table: 32 float32 columns + int64 label (bench/loader.py --case A-wide)",
           "", "```", command, "```", ""]  # fmt: skip
    out.append(
        f"{spec['n']:,} rows, `f0..f31` float32 and `label` int64 as 33 separate columns "
        f"({SHARDS} zstd Parquet shards written by feedline), batch {BATCH}, shuffled, torch "
        "tensors out, each loader in its own process. samples/s after the first batch over "
        "whole epochs; first batch includes reading the data. Not run here: "
        + "; ".join(f"{k} ({v})" for k, v in AW_SKIPPED.items())
        + "."
    )
    out += ["", "| loader | samples/s | vs best peer | first batch s | peak RSS MB | notes |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    peers = {k: r for k, r in results.items() if not k.startswith("feedline")
             and r.get("status") == "ok"}  # fmt: skip
    best = max(peers, key=lambda k: peers[k]["samples_per_s"] or 0, default=None)
    for name, r in results.items():
        if r.get("status") != "ok":
            out.append(f"| {name} | {r.get('status')}: {r.get('error', '')} | | | | |")
            continue
        vs = f"{r['samples_per_s'] / peers[best]['samples_per_s']:.1f}x" if best else "-"
        out.append(f"| {name} | {r['samples_per_s']:,.0f} | {vs} | {r['first_batch_s']:.2f} | "
                   f"{r['peak_rss'] / 1e6:,.0f} | {rows_note(r)} |")  # fmt: skip
    stack = results.get("feedline-stack", {})
    if stack.get("status") == "ok":
        ceiling = stack["ceiling"]["samples_per_s"]
        out.append(f"| packed np.take + from_numpy (ceiling) | {ceiling:,.0f} | | | | same "
                   "(rows, 32) block, same index arrays |")  # fmt: skip
        out.append("")
        for name in ("feedline-stack", "feedline-dict"):
            r = results.get(name, {})
            if r.get("status") != "ok":
                continue
            ratio = r["samples_per_s"] / peers[best]["samples_per_s"] if best else 0
            share = r["samples_per_s"] / ceiling
            out.append(f"- {name}: {ratio:.1f}x the best peer ({best}; goal >= 10x: "
                       f"{'met' if ratio >= 10 else 'missed'}), {share:.0%} of the packed ceiling "
                       f"(goal >= 80%: {'met' if share >= 0.8 else 'missed'}).")  # fmt: skip
        rounds = sorted(stack.get("interleaved_ratios") or [])
        if rounds:
            median = rounds[len(rounds) // 2]
            out.append(f"- feedline-stack interleaved with the ceiling epoch by epoch "
                       f"({len(rounds)} rounds): median {median:.0%} of the ceiling (range "
                       f"{rounds[0]:.0%}-{rounds[-1]:.0%}; goal >= 80%: "
                       f"{'met' if median >= 0.8 else 'missed'}).")  # fmt: skip
        cpu = stack.get("interleaved_cpu_ns") or []
        if cpu:
            fl_ns = sorted(c[0] for c in cpu)[len(cpu) // 2]
            raw_ns = sorted(c[1] for c in cpu)[len(cpu) // 2]
            order = stack.get("order_cpu_ms", 0.0) * 1e6 / spec["n"]
            out.append(
                f"- CPU per sample (median of the rounds): feedline-stack {fl_ns:.0f} ns, "
                f"the ceiling {raw_ns:.0f} ns ({raw_ns / fl_ns:.0%}); of feedline's, "
                f"{order:.0f} ns is drawing the epoch's permutation (on a background "
                "thread, ahead of the epoch; the ceiling is given its indices)."
            )
    return "\n".join(out)


def case_aw(args: argparse.Namespace) -> None:
    """``--case A-wide``: write the wide table, run each loader in a child, report."""
    awb_defaults(args)
    if args.worker:
        awb_worker(args)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spec = aw_spec(work, args.quick)
    aw_make_data(spec)
    results = {}
    for runner in [r for r in AW_RUNNERS if not args.only or r in args.only]:
        results[runner] = awb_run_child(runner, spec, args)
        print(f"[A-wide] {runner}: {results[runner].get('status')} "
              f"{rate(results[runner].get('samples_per_s'))} samples/s", file=sys.stderr,
              flush=True)  # fmt: skip
    command = ("flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case A-wide"
               + (" --quick" if args.quick else ""))  # fmt: skip
    save_case(AW_OUT, command, results, runners=AW_RUNNERS, skipped=AW_SKIPPED, spec=spec)
    print(aw_markdown(results, spec, command))


def b_markdown(results: dict[str, dict], specs: dict[str, dict], command: str) -> str:
    out = ["## Tensor columns: stored as binary vs as lists (bench/loader.py --case B)", "",
           "```", command, "```", ""]  # fmt: skip
    out.append(
        "`fl.open(path).loader(batch_size=256, shuffle=True, format='torch')` over the same "
        f"rows stored two ways ({SHARDS} shards, 16 row groups, zstd where it pays, page "
        "checksums verified): as `ds.write` stores tensors now (fixed-size binary, PLAIN) and "
        "as before (Parquet lists). First batch = open + cache fill + first gather (the "
        "runner's first loader; median = of `--b-fills` fresh loaders after it, page cache "
        "warm); fill = open until the whole cache is filled (median of those repeats; a "
        "memory cache of >= 64 MB serves its first batch before its data pages are all in, "
        "so the fill includes the first batch). Node cold / warm: "
        "the first batch with `cache='node'` when the node cache file is built (the first "
        "rank on a fresh node) / already exists (the other ranks, a restarted job); load = "
        "the 1-minute load average at the end of the runner."
    )
    out += ["", "| data | stored as | first batch s | median s | fill s | fill GB/s | "
            "samples/s | peak RSS MB | node cold first batch s | node warm first batch s | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, r in results.items():
        spec = specs[key]
        what = f"{spec['data']} ({spec['n']:,} x {spec['dtype']}{spec['shape']})"
        if r.get("status") != "ok":
            out.append(f"| {what} | {spec['encoding']} | {r.get('status')}: {r.get('error')} |")
            continue
        out.append(f"| {what} | {spec['encoding']} | {r['first_batch_s']:.2f} | "
                   f"{r.get('first_batch_median_s', float('nan')):.2f} | "
                   f"{r['fill_s']:.2f} | {r['fill_bytes_per_s'] / 1e9:.2f} | "
                   f"{r['samples_per_s']:,.0f} | {r['peak_rss'] / 1e6:,.0f} | "
                   f"{r.get('node_cold_first_batch_s', float('nan')):.2f} | "
                   f"{r.get('node_warm_first_batch_s', float('nan')):.3f} | "
                   f"{r.get('load_avg_1m', float('nan')):.1f} |")  # fmt: skip
    out.append("")
    for data in B_DATA:
        new, old = results.get(f"{data}-binary", {}), results.get(f"{data}-lists", {})
        if new.get("status") == "ok" and old.get("status") == "ok":
            out.append(f"- {data}: the fill reads {new['fill_bytes_per_s'] / 1e9:.2f} GB/s "
                       f"stored as binary vs {old['fill_bytes_per_s'] / 1e9:.2f} GB/s as lists "
                       f"({new['fill_bytes_per_s'] / old['fill_bytes_per_s']:.1f}x); first "
                       f"batch {new['first_batch_s']:.2f} s (median "
                       f"{new.get('first_batch_median_s', float('nan')):.2f} s) vs "
                       f"{old['first_batch_s']:.2f} s"
                       + (" (goal < 1 s: " + ("met" if new["first_batch_s"] < 1 else "missed")
                          + ")" if data == "B" else "") + "; with cache='node' "
                       f"{new['node_cold_first_batch_s']:.2f} s cold (file built), "
                       f"{new['node_warm_first_batch_s']:.3f} s warm (file exists).")  # fmt: skip
    return "\n".join(out)


def case_b(args: argparse.Namespace) -> None:
    """``--case B``: 100k images (and 1M x float32[32]) stored as binary and as lists."""
    awb_defaults(args)
    if args.worker:
        awb_worker(args)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    specs = b_specs(work, args.quick)
    results = {}
    for key, spec in specs.items():
        b_make_data(spec)
        runner = "feedline" if spec["encoding"] == "binary" else "feedline-lists"
        results[key] = awb_run_child(runner, spec, args)
        print(f"[B] {key}: {results[key].get('status')} first batch "
              f"{results[key].get('first_batch_s')}", file=sys.stderr, flush=True)  # fmt: skip
    command = ("flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case B"
               + (" --quick" if args.quick else ""))  # fmt: skip
    save_case(B_OUT, command, results, runners=B_RUNNERS, specs=specs)
    print(b_markdown(results, specs, command))


# List columns as written by Spark / pyarrow (``--case L``, issue 16): 100k 3x64x64 uint8
# images stored as a plain ``list<uint8>`` column (how pyarrow and Spark's ``ArrayType``
# write arrays), written once by ``pq.write_table`` with pyarrow's default writer settings,
# read by feedline (``fl.read_parquet(path).loader(shapes=...)``, cache auto and none), Ray
# Data and Petastorm (its own venv) from the same files, one run; each in its own process.

L_OUT = HERE / "out" / "loader_l.json"
L_FILES = 10
L_DATA: dict[str, Any] = {
    "title": "L: images 3x64x64 uint8 as Parquet list<uint8> + int64 label",
    "rows": 100_000,
    "quick_rows": 10_000,
    "feature": "image",
    "shape": [3, 64, 64],
    "dtype": "uint8",
}
#: runner -> (venv, description); "" = the interpreter running this script
L_RUNNERS: dict[str, tuple[str, str]] = {
    "feedline-auto": (
        "",
        "fl.read_parquet(path).loader(batch_size=256, shuffle=True, "
        "format='torch', shapes={'image': (3, 64, 64)}) (cache='auto': memory)",
    ),
    "feedline-none": ("", "the same with cache='none' (streams pools of row groups)"),
    "feedline-none-w1": (
        "",
        "cache='none', shuffle_window=1: pools of one row group (10% of "
        "the rows here, as the peers' 10% shuffle buffers)",
    ),
    "ray-data": ("", "Ray Data read_parquet -> iter_torch_batches(local shuffle buffer 10%)"),
    "petastorm": (
        "petastorm",
        "Petastorm make_batch_reader(workers_count=2, thread pool, "
        "shuffle_row_groups) -> BatchedDataLoader(shuffle queue 10%)",
    ),
    "pyarrow-decode": (
        "",
        "floor: pyarrow decoding every row group once (iter_batches in "
        "feedline's piece size, feedline's thread count), nothing kept",
    ),
}
#: what Spark 4 writes by default, for the same column (not run here: see the report)
L_SPARK_DEFAULTS = (
    "Spark's Parquet writer defaults: snappy, dictionary encoding on, "
    "parquet.block.size 128 MB row groups, 1 MB pages, one file per task; "
    "an ArrayType column is a 3-level list of INT32 (Spark has no uint8)"
)


def l_spec(work: Path, quick: bool) -> dict[str, Any]:
    n = L_DATA["quick_rows"] if quick else L_DATA["rows"]
    return {**L_DATA, "name": "L", "n": n, "dir": str(work / f"L-{n}-list-uint8")}


def l_make_data(spec: dict[str, Any]) -> dict[str, Any]:
    """``L_FILES`` files of random images as ``list<uint8>`` with ``pq.write_table``'s
    defaults (so one row group per file); reused when already written."""
    import shutil

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(spec["dir"])
    done = out / "_written.json"
    if done.exists():
        return json.loads(done.read_text())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng, n, width = np.random.default_rng(SEED), spec["n"], int(np.prod(spec["shape"]))
    per, start = n // L_FILES, time.perf_counter()
    for f in range(L_FILES):
        flat = pa.array(rng.integers(0, 256, per * width, dtype=np.uint8))
        offsets = pa.array(np.arange(0, per * width + 1, width, dtype=np.int32))
        table = pa.table({spec["feature"]: pa.ListArray.from_arrays(offsets, flat),
                          "label": rng.integers(0, 10, per)})  # fmt: skip
        pq.write_table(table, out / f"part-{f:05d}.parquet")  # pyarrow's default settings
    meta = pq.ParquetFile(shard_files(str(out))[0]).metadata
    column = meta.row_group(0).column(0)
    info = {
        "write_s": round(time.perf_counter() - start, 1), "files": L_FILES,
        "row_groups_per_file": meta.num_row_groups,
        "rows_per_row_group": meta.row_group(0).num_rows,
        "compression": column.compression, "encodings": list(column.encodings),
        "physical_type": column.physical_type, "logical_type": str(column.statistics.logical_type),
        "bytes": sum(Path(p).stat().st_size for p in shard_files(str(out))),
        "writer": f"pyarrow {pa.__version__} pq.write_table defaults",
    }  # fmt: skip
    done.write_text(json.dumps(info))
    print(f"wrote L: {n:,} rows in {info['write_s']}s -> {out}", flush=True)
    return info


def l_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def l_feedline(
    spec: dict[str, Any], args: argparse.Namespace, cache: str, window: int | None = None
) -> dict[str, Any]:
    """``measure`` of the feedline loader over the list files; also the first batch's CPU s."""
    import torch  # noqa: F401  (imported before the clock starts, as a training script has it)

    import feedline as fl

    holder: dict[str, Any] = {}
    shape = tuple(spec["shape"])

    def make_epoch(epoch: int) -> Iterator[dict[str, Any]]:
        if epoch == 0:
            holder["cpu0"] = l_cpu_s()
            holder["loader"] = fl.read_parquet(spec["dir"]).loader(
                batch_size=BATCH, shuffle=True, seed=SEED, format="torch", cache=cache,
                shapes={spec["feature"]: shape}, shuffle_window=window,
            )  # fmt: skip
        holder["loader"].set_epoch(epoch)
        batches = iter(holder["loader"])
        if epoch == 0:
            yield next(batches)
            holder["first_cpu_s"] = l_cpu_s() - holder["cpu0"]
        yield from batches

    load = os.getloadavg()
    result = measure(make_epoch, spec, args, multiprocess=False)
    stats = holder["loader"].stats()
    result |= {k: stats.get(k) for k in ("cache", "shuffle_window", "cache_bytes",
                                         "pools_loaded", "max_pool_rows")}  # fmt: skip
    return result | {"first_batch_cpu_s": holder.get("first_cpu_s"), "load_before": load,
                     "load_after": os.getloadavg()}  # fmt: skip


def l_decode_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """Every row group decoded once by pyarrow, as feedline's loaders read it: the same piece
    size and thread count, the arrays dropped. The least a cache fill of this data costs."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    import feedline as fl
    from feedline.loader.data.backend import as_source
    from feedline.loader.data.columns import column_specs
    from feedline.loader.data.memory_cache import MAX_READ_THREADS, read_rows
    from feedline.loader.data.packed_columns import plan_packing

    source = as_source(fl.read_parquet(spec["dir"]))
    specs = column_specs(source.schema(), [spec["feature"], "label"],
                         shapes={spec["feature"]: tuple(spec["shape"])})  # fmt: skip
    piece = read_rows(plan_packing(specs), source.schema())
    threads = min(MAX_READ_THREADS, os.cpu_count() or 1)
    groups = [(f, g) for f in shard_files(spec["dir"])
              for g in range(pq.ParquetFile(f).metadata.num_row_groups)]  # fmt: skip

    def decode(task: tuple[str, int]) -> int:
        batches = pq.ParquetFile(task[0]).iter_batches(
            batch_size=piece, row_groups=[task[1]], columns=[spec["feature"], "label"],
            use_threads=False)  # fmt: skip
        return sum(b.num_rows for b in batches)

    load, cpu, start = os.getloadavg(), l_cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        rows = sum(pool.map(decode, groups))
    wall = time.perf_counter() - start
    return {"decode_s": wall, "decode_cpu_s": l_cpu_s() - cpu, "rows": rows, "piece_rows": piece,
            "threads": threads, "rows_per_s": rows / wall, "load_before": load,
            "load_after": os.getloadavg()}  # fmt: skip


def l_worker(args: argparse.Namespace) -> None:
    """Child process of case L: one runner; its result (or error) to ``args.result``."""
    spec = json.loads(args.spec)
    fns: dict[str, Callable[[], dict[str, Any]]] = {
        "feedline-auto": lambda: l_feedline(spec, args, "auto"),
        "feedline-none": lambda: l_feedline(spec, args, "none"),
        "feedline-none-w1": lambda: l_feedline(spec, args, "none", window=1),
        "ray-data": lambda: run_ray(spec, args),
        "petastorm": lambda: run_petastorm(spec, args),
        "pyarrow-decode": lambda: l_decode_floor(spec),
    }
    try:
        load = os.getloadavg()
        result = {"status": "ok", **fns[args.worker]()}
        result.setdefault("load_before", load)
        result.setdefault("load_after", os.getloadavg())
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        sys.stderr.write(traceback.format_exc())
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def l_run_child(runner: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    venv = L_RUNNERS[runner][0]
    python = python_for(venv)
    if not python.exists() or (venv and not (VENVS / venv / ".complete").exists()):
        return {"status": "not installed", "error": f"no {VENVS / venv}: run bench/setup_peers.sh"}
    work = Path(args.work)
    result_file, log = work / f"result-L-{runner}.json", work / f"log-L-{runner}.txt"
    result_file.unlink(missing_ok=True)
    cmd = [str(python), str(Path(__file__).resolve()), "--case", "L", "--worker", runner,
           "--spec", json.dumps(spec), "--result", str(result_file), "--work", str(work),
           "--min-seconds", str(args.min_seconds), "--cap-seconds", str(args.cap_seconds),
           "--max-epochs", str(args.max_epochs)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}
    try:
        with open(log, "w") as out:
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                           timeout=args.cap_seconds + args.setup_seconds, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result in time (log: {log})"}
    if result_file.exists():
        return json.loads(result_file.read_text()) | {"log": str(log)}
    return {"status": "crashed", "error": f"no result (log: {log})"}


def l_markdown(results: dict[str, dict], spec: dict[str, Any], data: dict[str, Any],
               command: str) -> str:  # fmt: skip
    out = ["## Spark/pyarrow list<uint8> images (bench/loader.py --case L)", "", "```", command,
           "```", "",
           f"{spec['n']:,} x uint8{spec['shape']} as a plain `list<uint8>` column + int64 label, "
           f"{data['files']} files written by {data['writer']}: {data['row_groups_per_file']} row "
           f"group(s) of {data['rows_per_row_group']:,} rows per file, {data['compression']}, "
           f"encodings {data['encodings']}, {data['physical_type']} ({data['logical_type']}), "
           f"{data['bytes'] / 1e9:.2f} GB. {L_SPARK_DEFAULTS}. Batch 256, shuffled, torch "
           "tensors; first batch from building the loader; samples/s after it; load = "
           "1-minute load average before / after the runner (2 cores).", "",
           "Incl. first batch: every sample timed (first batch included) over the timed "
           "epochs.", "",
           "| loader | samples/s | incl. first batch | first batch s | first batch CPU s | "
           "rows per epoch | peak RSS MB | load |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        if name == "pyarrow-decode":
            continue
        if r.get("status") != "ok":
            out.append(f"| {name} | {r.get('status')}: {r.get('error')} | | | | | | |")
            continue
        cpu = r.get("first_batch_cpu_s")
        overall = r["rows"] / (r["first_batch_s"] + r["seconds"])
        out.append(f"| {name} | {rate(r['samples_per_s'])} | {rate(overall)} | "
                   f"{r['first_batch_s']:.2f} | "
                   f"{'-' if cpu is None else f'{cpu:.2f}'} | {rows_note(r)} | "
                   f"{mb(r['peak_rss'])} | {r['load_before'][0]:.1f} / "
                   f"{r['load_after'][0]:.1f} |")  # fmt: skip
    floor = results.get("pyarrow-decode", {})
    if floor.get("status") == "ok":
        out.append(f"\nFloor: pyarrow alone decodes all {floor['rows']:,} rows in "
                   f"{floor['decode_s']:.2f} s ({floor['decode_cpu_s']:.2f} CPU s, "
                   f"{floor['threads']} threads, pieces of {floor['piece_rows']} rows; load "
                   f"{floor['load_before'][0]:.1f} / {floor['load_after'][0]:.1f}).")  # fmt: skip
    peers = [r["samples_per_s"] for n, r in results.items()
             if n in ("ray-data", "petastorm") and r.get("status") == "ok"
             and r.get("samples_per_s")]  # fmt: skip
    for name in ("feedline-auto", "feedline-none", "feedline-none-w1"):
        r = results.get(name, {})
        if r.get("status") == "ok" and peers:
            ratio = r["samples_per_s"] / max(peers)
            out.append(f"- {name}: {ratio:.1f}x the best peer ({rate(max(peers))} samples/s; "
                       f"goal >= 10x: {'met' if ratio >= 10 else 'missed'}); first batch "
                       f"{r['first_batch_s']:.2f} s (goal < 2 s: "
                       f"{'met' if r['first_batch_s'] < 2 else 'missed'}).")  # fmt: skip
    return "\n".join(out)


def case_l(args: argparse.Namespace) -> None:
    """``--case L``: write the list<uint8> images once, run each runner in a child, report."""
    if args.min_seconds is None:
        args.min_seconds = 2.0 if args.quick else 5.0
    if args.cap_seconds is None:  # long enough for one whole epoch of the slow peers
        args.cap_seconds = 30.0 if args.quick else 150.0
    if args.worker:
        l_worker(args)
        return
    if args.report:  # print the last run's markdown again
        saved = json.loads(L_OUT.read_text())
        meta = saved["meta"]
        print(l_markdown(saved["results"], meta["spec"], meta["data"], meta["command"]))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spec = l_spec(work, args.quick)
    data = l_make_data(spec)
    results = {}
    for runner in [r for r in L_RUNNERS if not args.only or r in args.only]:
        for path in shard_files(spec["dir"]):  # every runner starts from the page cache
            path_bytes = Path(path).read_bytes()
            del path_bytes
        results[runner] = l_run_child(runner, spec, args)
        r = results[runner]
        print(f"[L] {runner}: {r.get('status')} {rate(r.get('samples_per_s'))} samples/s, "
              f"first batch {r.get('first_batch_s')}, load {os.getloadavg()[0]:.1f} "
              f"{'' if r.get('status') == 'ok' else r.get('error')}", file=sys.stderr,
              flush=True)  # fmt: skip
    command = ("flock /tmp/feedline-bench.lock .venv/bin/python bench/loader.py --case L"
               + (" --quick" if args.quick else ""))  # fmt: skip
    save_case(L_OUT, command, results, runners=L_RUNNERS, spec=spec, data=data,
              spark_defaults=L_SPARK_DEFAULTS)  # fmt: skip
    print(l_markdown(results, spec, data, command))


#: the cases run by ``--case NAME`` instead of the default tabular/image comparison
CASES: dict[str, Callable[[argparse.Namespace], None]] = {
    "W": case_w,
    "J": case_j,
    "A-wide": case_aw,
    "B": case_b,
    "L": case_l,
}


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
    parser.add_argument("--case", choices=sorted(CASES), default=None,
                        help="run one named case instead (W: time-series windows, J: JPEG "
                        "decode + augmentation, A-wide: 32 separate float32 columns, B: "
                        "tensors stored as binary vs lists)")  # fmt: skip
    parser.add_argument("--b-fills", type=int, default=3,
                        help="case B: cache fills timed after the run (median)")  # fmt: skip
    parser.add_argument("--w-batches", type=int, default=3000,
                        help="case W: batches timed per loader (first batch excluded)")  # fmt: skip
    parser.add_argument("--w-repeat", type=int, default=3,
                        help="case W: round-robin runs per loader (median reported)")  # fmt: skip
    parser.add_argument("--j-images", type=int, default=5000, help="case J: JPEGs (--quick: 1000)")
    parser.add_argument("--j-repeat", type=int, default=3,
                        help="case J: round-robin runs per runner (median reported)")  # fmt: skip
    parser.add_argument("--j-epochs", type=int, default=2, help="case J: epochs timed per run")
    parser.add_argument("--j-decode-images", type=int, default=300,
                        help="case J: images of the one-thread decoder comparison")  # fmt: skip
    args = parser.parse_args()
    if args.case:
        CASES[args.case](args)
        return
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
