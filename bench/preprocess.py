"""Preprocessing throughput: feedline (local engine) vs pandas, Hugging Face datasets and Spark.

Three jobs, each run by four tools that compute the same result:

(a) text:    tokenize generated product descriptions (~15 words) to 77 ids + mask with one
             WordPiece ``tokenizer.json`` (trained here on the generated text);
(b) images:  decode generated photo-like JPEGs (~500x400) and resize them to 224x224 RGB
             (shorter side to 224, centre crop, antialiased bilinear; Pillow for everybody);
(c) tabular: StandardScaler + StringIndexer (frequency order) fitted and applied on
             1M rows of (float64, string with ~1000 categories).

Tools: feedline ``Dataset.transform`` on the local engine; pandas row-wise
``Series.apply`` (one Python call per row and column: the common baseline);
``datasets.Dataset.map(batched=True, num_proc=2)``; Spark ``mapInPandas`` on a real
``local[2]`` session (session start is timed separately and excluded from rows/s).

Usage (a full run takes ~10 minutes on 2 cores; set up the peers once)::

    bash bench/setup_preprocess.sh
    flock /tmp/feedline-bench.lock bench/.venvs/preprocess/bin/python bench/preprocess.py
    ... bench/preprocess.py --quick          # small sizes, 1-2 repeats

Prints a table, a check that every tool's output equals feedline's on a sample, the
speed-ups, and a markdown section for BENCHMARKS.md; writes ``bench/out/preprocess.json``.
Generated inputs are cached under ``bench/out/preprocess-data/`` (generation is never timed).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw, ImageFilter
from rich.console import Console
from rich.table import Table

import feedline as fl

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
DATA = OUT / "preprocess-data"
SIZE = 224  # images: output side
MAX_LENGTH = 77  # text: ids per row
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
console = Console()

# ---------------------------------------------------------------------------- data (untimed)

ADJ = [
    "soft",
    "durable",
    "lightweight",
    "premium",
    "classic",
    "slim",
    "waterproof",
    "compact",
    "ergonomic",
    "vintage",
    "modern",
    "breathable",
    "heavy-duty",
    "wireless",
    "portable",
    "stainless",
    "organic",
    "handmade",
    "adjustable",
    "foldable",
    "non-slip",
    "rechargeable",
    "insulated",
    "scratch-resistant",
    "eco-friendly",
    "quick-dry",
    "stretchy",
    "padded",
]
COLOR = [
    "black",
    "white",
    "navy",
    "red",
    "forest green",
    "charcoal",
    "beige",
    "sky blue",
    "burgundy",
    "olive",
    "silver",
    "rose gold",
    "matte grey",
    "ivory",
    "mustard",
]
MATERIAL = [
    "cotton",
    "merino wool",
    "leather",
    "stainless steel",
    "bamboo",
    "aluminium",
    "silicone",
    "polyester",
    "linen",
    "oak",
    "ceramic",
    "recycled plastic",
    "canvas",
]
NOUN = [
    "t-shirt",
    "hoodie",
    "backpack",
    "water bottle",
    "desk lamp",
    "phone case",
    "sneakers",
    "wallet",
    "headphones",
    "cutting board",
    "yoga mat",
    "travel mug",
    "jacket",
    "blanket",
    "keyboard",
    "sunglasses",
    "watch strap",
    "tote bag",
    "pillow",
    "frying pan",
    "charger",
]
FOR = [
    "for men",
    "for women",
    "for kids",
    "for travel",
    "for the office",
    "for hiking",
    "for everyday use",
    "for the kitchen",
    "for gaming",
    "for runners",
]
FEATURE = [
    "with zip pocket",
    "with USB-C port",
    "with 2-year warranty",
    "machine washable",
    "dishwasher safe",
    "BPA free",
    "with magnetic closure",
    "gift boxed",
    "with reinforced stitching",
    "with 30h battery life",
    "keeps drinks cold 24h",
    'fits 15" laptops',
    "includes carry pouch",
    "with anti-slip base",
]
BRAND = [
    "Northwind",
    "Acme",
    "Lumen & Co.",
    "Kestrel",
    "Bluebird",
    "Orca",
    "Fjord",
    "Tundra",
    "Sable",
    "Mosaic",
    "Quill",
    "Harbor",
    "Nimbus",
]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Product descriptions of ~15 words; ~1/3 carry a unique-ish model code (SKU)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [
            rng.choice(ADJ).capitalize(),
            rng.choice(COLOR),
            rng.choice(MATERIAL),
            rng.choice(NOUN),
            rng.choice(FOR) + ",",
            rng.choice(FEATURE) + ",",
        ]
        if rng.random() < 0.5:
            words.insert(1, rng.choice(ADJ))
        tail = rng.random()
        if tail < 0.35:
            code = "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZ", k=2))
            words.append(f"model {code}-{rng.randint(100, 9999)}.")
        elif tail < 0.7:
            words.append(f"size {rng.choice(['XS', 'S', 'M', 'L', 'XL', '42', '10.5'])},")
            words.append(f"{rng.randint(1, 6)} pack.")
        else:
            words.append(f"{rng.choice(['250 ml', '1.5 L', '500 g', '30 cm', '2 m'])}.")
        words.append(f"By {rng.choice(BRAND)}.")
        out.append(" ".join(words))
    return out


def train_tokenizer(texts: list[str], path: Path) -> None:
    """A BERT-style WordPiece (lower-casing normalizer, [CLS] ... [SEP]) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, WordPieceTrainer(vocab_size=8000, special_tokens=SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(path))


def make_image(seed: int) -> bytes:
    """A ~500x400 JPEG (quality 90) of smooth gradients, blurred shapes and mild grain."""
    rng = np.random.default_rng(seed)
    w, h = int(rng.integers(480, 521)), int(rng.integers(380, 421))
    if rng.random() < 0.2:  # some portraits, so the centre crop runs along both axes
        w, h = h, w
    base = rng.integers(0, 256, (int(rng.integers(3, 7)), int(rng.integers(3, 7)), 3), np.uint8)
    im = Image.fromarray(base).resize((w, h), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(-50, w)), int(rng.integers(-50, h))
        box = (x0, y0, x0 + int(rng.integers(30, 250)), y0 + int(rng.integers(30, 250)))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
    im = im.filter(ImageFilter.GaussianBlur(float(rng.uniform(1.5, 4.0))))
    grain = rng.normal(0.0, 4.0, (h, w, 3))
    pixels = np.clip(np.asarray(im, np.float32) + grain, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_tabular(n: int, seed: int = 0) -> pa.Table:
    """``x`` float64 (log-normal prices) and ``cat``: ~1000 categories, Zipf-like frequencies."""
    rng = np.random.default_rng(seed)
    names = np.array([f"cat-{i:04d}" for i in range(1000)])
    weights = 1.0 / np.arange(1, 1001) ** 0.8
    cats = names[rng.choice(1000, n, p=weights / weights.sum())]
    return pa.table(
        {"rid": np.arange(n), "x": rng.lognormal(3.0, 1.0, n), "cat": pa.array(cats, pa.string())}
    )


def cached(name: str, build: Callable[[], pa.Table]) -> pa.Table:
    """The generated table ``name`` from the cache, built (untimed) the first time."""
    path = DATA / f"{name}.arrow"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        table = build()
        with pa.OSFile(str(path) + ".tmp", "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=64 * 1024)
        os.replace(str(path) + ".tmp", path)
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all().combine_chunks()


def make_inputs(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    inputs: dict[str, Any] = {}
    if "text" in args.jobs:
        texts = cached(
            f"text-{args.text_rows}",
            lambda: pa.table(
                {"rid": np.arange(args.text_rows), "text": make_texts(args.text_rows)}
            ),
        )
        tok_path = DATA / f"tokenizer-{args.text_rows}.json"
        if not tok_path.exists():
            train_tokenizer(texts["text"].to_pylist(), tok_path)
        inputs["text"] = (texts, tok_path)
    if "images" in args.jobs:

        def images() -> pa.Table:
            with Pool(os.cpu_count() or 2) as pool:
                blobs = pool.map(make_image, range(args.images), chunksize=64)
            return pa.table({"rid": np.arange(args.images), "bytes": pa.array(blobs, pa.binary())})

        inputs["images"] = cached(f"images-{args.images}", images)
    if "tabular" in args.jobs:
        inputs["tabular"] = cached(
            f"tabular-{args.tabular_rows}", lambda: make_tabular(args.tabular_rows)
        )
    console.print(
        f"inputs ready in {time.perf_counter() - t0:.1f} s (generated once, cached in "
        f"{DATA.relative_to(HERE.parent)}; never timed)"
    )
    return inputs


# ---------------------------------------------------------------------------- shared peer code


def peer_tokenizer(path: str) -> Any:
    """The same tokenizer.json, padded/truncated to 77 by the library itself."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(MAX_LENGTH)
    tok.enable_padding(length=MAX_LENGTH, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return tok


def pil_decode(data: bytes) -> np.ndarray:
    """Decode with Pillow; shorter side to 224 and centre crop as ONE antialiased bilinear
    resize of the centred square region (no rounding of an intermediate size)."""
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        w, h = im.size
        side = min(w, h)
        x0, y0 = (w - side) / 2, (h - side) / 2
        im = im.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(x0, y0, x0 + side, y0 + side))
        return np.asarray(im)


def pillow_ceiling(table: pa.Table, n: int = 1000) -> float:
    """Images/s that ANY tool doing this Pillow work could reach on all cores: cores / the
    single-thread time of ``pil_decode`` per image (best of 2 passes over ``n`` images)."""
    blobs = table["bytes"].slice(0, n).to_pylist()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        for blob in blobs:
            pil_decode(blob)
        best = min(best, (time.perf_counter() - start) / len(blobs))
    return (os.cpu_count() or 1) / best


def fit_labels(counts: dict[str, int]) -> dict[str, int]:
    """Frequency order, ties alphabetical (as StringIndexer / Spark's frequencyDesc)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {label: i for i, (label, _) in enumerate(ranked)}


def scale_of(var: float) -> float:
    return float(np.sqrt(var)) if var > 0 else 1.0


# ---------------------------------------------------------------------------- results


@dataclass
class Run:
    job: str
    tool: str
    rows: int
    times: list[float]
    what: str
    check: str = ""
    ok: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.best


def timed(
    fn: Callable[[], Any], repeat: int, budget_s: float = float("inf")
) -> tuple[list[float], Any]:
    """Wall times of up to ``repeat`` calls (fewer once ``budget_s`` is spent; at least one)
    and the last call's output (earlier outputs are dropped before the next call)."""
    times, out = [], None
    for _ in range(repeat):
        out = None
        gc.collect()
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        if sum(times) > budget_s:
            break
    return times, out


def tensor_rows(column: Any, positions: np.ndarray) -> np.ndarray:
    """Rows ``positions`` of a fixed-shape tensor column as one NumPy array."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return column.take(pa.array(positions)).to_numpy_ndarray()


# ---------------------------------------------------------------------------- (a) text


def text_feedline(table: pa.Table, tok_path: Path) -> pa.Table:
    tokenize = fl.Tokenize("text", str(tok_path), max_length=MAX_LENGTH)  # cache starts empty
    return fl.from_arrow(table).transform(tokenize).to_arrow()


def text_pandas(df: pd.DataFrame, tok_path: Path) -> pd.DataFrame:
    tok = peer_tokenizer(tok_path)

    def row(text: str) -> tuple[list[int], list[int]]:
        encoding = tok.encode(text)
        return encoding.ids, encoding.attention_mask

    pairs = df["text"].apply(row)
    return pd.DataFrame(pairs.tolist(), columns=["ids", "mask"], index=df.index).assign(
        rid=df["rid"]
    )


def _hf_tokenize(batch: dict[str, Any], tok_path: str) -> dict[str, np.ndarray]:
    tok = _HF_TOK.get(tok_path) or _HF_TOK.setdefault(tok_path, peer_tokenizer(tok_path))
    encodings = tok.encode_batch(batch["text"])
    return {
        "ids": np.array([e.ids for e in encodings], np.int32),
        "mask": np.array([e.attention_mask for e in encodings], np.int8),
    }


_HF_TOK: dict[str, Any] = {}


def text_datasets(dset: Any, tok_path: Path) -> Any:
    import datasets

    features = datasets.Features(
        {
            "rid": datasets.Value("int64"),
            "ids": datasets.List(datasets.Value("int32"), length=MAX_LENGTH),
            "mask": datasets.List(datasets.Value("int8"), length=MAX_LENGTH),
        }
    )
    return dset.map(
        _hf_tokenize,
        batched=True,
        num_proc=2,
        input_columns=None,
        fn_kwargs={"tok_path": str(tok_path)},
        remove_columns=["text"],
        features=features,
        load_from_cache_file=False,
    )


def text_spark_udf(tok_path: str) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    def tokenize(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        tok = peer_tokenizer(tok_path)
        for frame in frames:
            encodings = tok.encode_batch(frame["text"].tolist())
            yield pd.DataFrame(
                {
                    "rid": frame["rid"],
                    "ids": [np.asarray(e.ids, np.int32) for e in encodings],
                    "mask": [np.asarray(e.attention_mask, np.int8) for e in encodings],
                }
            )

    return tokenize


# ---------------------------------------------------------------------------- (b) images


def images_feedline(table: pa.Table) -> pa.Table:
    decode = fl.DecodeImages(
        "bytes", size=(SIZE, SIZE), resize="shorter+center_crop", resample="bilinear"
    )
    return fl.from_arrow(table).transform(decode).to_arrow()


def images_pandas(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"rid": df["rid"], "pixels": df["bytes"].apply(pil_decode)})


def _hf_decode(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {"pixels": np.stack([pil_decode(b) for b in batch["bytes"]])}


def images_datasets(dset: Any) -> Any:
    import datasets

    features = datasets.Features(
        {"rid": datasets.Value("int64"), "pixels": datasets.Array3D((SIZE, SIZE, 3), "uint8")}
    )
    return dset.map(
        _hf_decode,
        batched=True,
        batch_size=256,
        writer_batch_size=256,
        num_proc=2,
        remove_columns=["bytes"],
        features=features,
        load_from_cache_file=False,
    )


def images_spark_udf(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    for frame in frames:
        yield pd.DataFrame(
            {"rid": frame["rid"], "pixels": [pil_decode(b).tobytes() for b in frame["bytes"]]}
        )


# ---------------------------------------------------------------------------- (c) tabular


def tabular_feedline(table: pa.Table) -> pa.Table:
    chain = fl.Chain([fl.StandardScaler("x"), fl.StringIndexer("cat")])  # fitted when run
    return fl.from_arrow(table).transform(chain).to_arrow()


def tabular_pandas(df: pd.DataFrame) -> pd.DataFrame:
    mean, scale = float(df["x"].mean()), scale_of(float(df["x"].var(ddof=0)))
    index = fit_labels(df["cat"].value_counts().to_dict())
    return pd.DataFrame(
        {
            "rid": df["rid"],
            "x": df["x"].apply(lambda v: (v - mean) / scale),
            "cat": df["cat"].apply(index.__getitem__),
        }
    )


def _hf_scale(batch: pa.Table, mean: float, scale: float, labels: list[str]) -> dict:
    ids = pd.Index(labels).get_indexer(batch["cat"].to_numpy(zero_copy_only=False))
    return {
        "rid": batch["rid"].to_numpy(),
        "x": (batch["x"].to_numpy() - mean) / scale,
        "cat": ids.astype(np.int64),
    }


def tabular_datasets(dset: Any) -> Any:
    # Arrow-formatted batches: the NumPy format would hand over float32 (datasets' default)
    columns = dset.with_format("arrow")
    x = columns["x"].to_numpy()
    mean, scale = float(np.mean(x)), scale_of(float(np.var(x)))
    index = fit_labels(columns["cat"].to_pandas().value_counts().to_dict())
    return columns.map(
        _hf_scale,
        batched=True,
        num_proc=2,
        load_from_cache_file=False,
        fn_kwargs={"mean": mean, "scale": scale, "labels": list(index)},
    )


def tabular_spark_udf(mean: float, scale: float, index: dict[str, int]) -> Callable:
    def transform(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            yield pd.DataFrame(
                {
                    "rid": frame["rid"],
                    "x": (frame["x"] - mean) / scale,
                    "cat": frame["cat"].map(index).astype(np.int64),
                }
            )

    return transform


# ---------------------------------------------------------------------------- samples


def sample_of(job: str, tool: str, out: Any, rids: np.ndarray) -> dict[str, np.ndarray]:
    """The outputs of rows ``rids`` as NumPy arrays, whatever the tool returned."""
    if tool == "feedline":
        pos = np.searchsorted(out["rid"].to_numpy(), rids)
        if job == "text":
            return {
                "ids": tensor_rows(out["text"], pos),
                "mask": tensor_rows(out["text_mask"], pos),
            }
        if job == "images":
            return {"pixels": tensor_rows(out["bytes"], pos)}
        return {"x": out["x"].to_numpy()[pos], "cat": out["cat"].to_numpy()[pos]}
    if tool == "datasets":
        table = out.data.table
        pos = np.searchsorted(table["rid"].to_numpy(), rids)
        if job == "text":
            return {
                "ids": np.stack(table["ids"].take(pos).to_pylist()),
                "mask": np.stack(table["mask"].take(pos).to_pylist()),
            }
        if job == "images":
            return {
                "pixels": np.stack(
                    [np.asarray(v, np.uint8) for v in table["pixels"].take(pos).to_pylist()]
                )
            }
        return {"x": table["x"].to_numpy()[pos], "cat": table["cat"].to_numpy()[pos]}
    # pandas frames (also what Spark's sample comes back as)
    frame = out.set_index("rid").loc[rids]
    if job == "text":
        return {
            "ids": np.stack([np.asarray(v) for v in frame["ids"]]),
            "mask": np.stack([np.asarray(v) for v in frame["mask"]]),
        }
    if job == "images":
        pixels = [
            np.frombuffer(v, np.uint8).reshape(SIZE, SIZE, 3)
            if isinstance(v, bytes)
            else np.asarray(v)
            for v in frame["pixels"]
        ]
        return {"pixels": np.stack(pixels)}
    return {"x": frame["x"].to_numpy(np.float64), "cat": frame["cat"].to_numpy(np.int64)}


def compare(job: str, ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[bool, str]:
    n = len(next(iter(ref.values())))
    if job == "text":
        same = np.array_equal(ref["ids"], got["ids"].astype(np.int64)) and np.array_equal(
            ref["mask"], got["mask"].astype(np.int64)
        )
        bad = (
            int((ref["ids"] != got["ids"]).any(axis=1).sum())
            if ref["ids"].shape == got["ids"].shape
            else n
        )
        return same, f"{n} rows: ids and mask {'equal' if same else f'differ in {bad} rows'}"
    if job == "images":
        diff = np.abs(ref["pixels"].astype(np.int16) - got["pixels"].astype(np.int16))
        worst = int(diff.max())
        return worst <= 1, (
            f"{n} images: max |Δpixel| = {worst} (≤ 1 required), "
            f"{(diff > 0).mean():.2%} of values differ"
        )
    dx = float(np.max(np.abs(ref["x"] - got["x"])))
    same_ids = np.array_equal(ref["cat"], got["cat"])
    return dx <= 1e-6 and same_ids, (
        f"{n} rows: max |Δscaled| = {dx:.1e} (≤ 1e-6 required), "
        f"ids {'equal' if same_ids else 'DIFFER'}"
    )


# ---------------------------------------------------------------------------- Spark


def start_spark() -> tuple[Any, float]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    start = time.perf_counter()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("feedline-bench-preprocess")
        .config("spark.driver.memory", "6g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    seconds = time.perf_counter() - start
    spark.sparkContext.setLogLevel("ERROR")
    return spark, seconds


def spark_input(table: pa.Table, work: Path, name: str) -> str:
    """The table as 8 equal Parquet files (Spark packs them into 2 equal partitions)."""
    path = work / f"spark-{name}"
    path.mkdir()
    step = -(-table.num_rows // 8)
    for i, start in enumerate(range(0, table.num_rows, step)):
        pq.write_table(table.slice(start, step), path / f"part-{i}.parquet", compression="snappy")
    return str(path)


def spark_noop(df: Any) -> None:
    """Run the whole query and discard the rows (Spark's standard benchmark sink)."""
    df.write.format("noop").mode("overwrite").save()


# ---------------------------------------------------------------------------- driver


def run_local_tools(
    job: str, data: Any, args: argparse.Namespace, work: Path, rids: np.ndarray
) -> list[Run]:
    """feedline, pandas and datasets on one job; checks their outputs on ``rids``."""
    import datasets

    runs: list[Run] = []
    table, tok_path = data if job == "text" else (data, None)
    rows = table.num_rows
    df = table.to_pandas()  # pandas' native input (conversion untimed)
    dpath = work / f"hf-{job}"
    datasets.Dataset(table).save_to_disk(str(dpath))  # memory-mapped, as load_dataset gives
    dset = datasets.load_from_disk(str(dpath))
    jobs = {
        "text": (
            lambda: text_feedline(table, tok_path),
            lambda: text_pandas(df, tok_path),
            lambda: text_datasets(dset, tok_path),
        ),
        "images": (
            lambda: images_feedline(table),
            lambda: images_pandas(df),
            lambda: images_datasets(dset),
        ),
        "tabular": (
            lambda: tabular_feedline(table),
            lambda: tabular_pandas(df),
            lambda: tabular_datasets(dset),
        ),
    }[job]
    what = {
        "feedline": "fl.from_arrow(table).transform(p).to_arrow() on the local engine "
        "(p built inside the timing; fit included)",
        "pandas": "row-wise Series.apply over a DataFrame (one Python call per row and column)",
        "datasets": "Dataset.map(batched=True, num_proc=2) over a memory-mapped Dataset, "
        "writing its Arrow cache files (load_from_cache_file=False)",
    }
    budget = {"pandas": args.pandas_budget}
    ref = None
    for tool, fn in zip(("feedline", "pandas", "datasets"), jobs, strict=True):
        if tool not in args.tools:
            continue
        console.print(f"  [{job}] {tool} ...", end=" ")
        times, out = timed(fn, args.repeat, budget.get(tool, float("inf")))
        n_out = out.num_rows if hasattr(out, "num_rows") else len(out)
        run = Run(job, tool, rows, times, what[tool])
        sample = sample_of(job, tool, out, rids)
        if tool == "feedline":
            ref = sample
            run.ok, run.check = n_out == rows, f"reference ({n_out} rows out)"
        elif ref is not None:
            run.ok, run.check = compare(job, ref, sample)
            run.ok = run.ok and n_out == rows
            run.check += f"; {n_out} rows out"
        if tool == "datasets":
            for entry in out.cache_files:
                Path(entry["filename"]).unlink(missing_ok=True)
        del out
        console.print(
            f"best {run.best:.3f} s of {[round(t, 3) for t in times]} "
            f"-> {run.rows_per_s:,.0f} rows/s",
            highlight=False,
        )
        console.print(f"      check: {run.check}", highlight=False)
        runs.append(run)
        gc.collect()
    shutil.rmtree(dpath, ignore_errors=True)
    if ref is not None:
        REFERENCE[job] = ref
    return runs


#: feedline's output on the sampled rows, per job: what every peer is compared with
REFERENCE: dict[str, dict[str, np.ndarray]] = {}


def run_spark(
    inputs: dict[str, Any], args: argparse.Namespace, work: Path, rids: dict[str, np.ndarray]
) -> tuple[list[Run], float]:
    from pyspark.sql import functions as F

    spark, start_s = start_spark()
    console.print(f"  Spark local[2] session started in {start_s:.1f} s (not in rows/s)")
    runs = []
    try:
        for job in args.jobs:
            data = inputs[job]
            table, tok_path = data if job == "text" else (data, None)
            path = spark_input(table, work, job)
            batch = 256 if job == "images" else 10_000
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch))
            udf, schema = {
                "text": (
                    text_spark_udf(str(tok_path)),
                    "rid long, ids array<int>, mask array<tinyint>",
                ),
                "images": (images_spark_udf, "rid long, pixels binary"),
            }.get(job, (None, None))

            def query(
                job: str = job, path: str = path, udf: Any = udf, schema: Any = schema
            ) -> Any:
                df = spark.read.parquet(path)
                if job != "tabular":
                    return df.mapInPandas(udf, schema)
                stats = df.agg(F.avg("x").alias("mean"), F.var_pop("x").alias("var")).first()
                counts = {r["cat"]: r["count"] for r in df.groupBy("cat").count().collect()}
                transform = tabular_spark_udf(
                    float(stats["mean"]), scale_of(float(stats["var"])), fit_labels(counts)
                )
                return df.mapInPandas(transform, "rid long, x double, cat long")

            console.print(f"  [{job}] spark ...", end=" ")
            times, _ = timed(lambda q=query: spark_noop(q()), args.repeat)
            partitions = spark.read.parquet(path).rdd.getNumPartitions()
            what = (
                f"spark.read.parquet ({partitions} partitions) → mapInPandas → noop sink "
                "(the whole query runs; rows discarded)"
            )
            if job == "tabular":
                what += "; stats from Spark aggregates (avg, var_pop, groupBy count) included"
            run = Run(
                job,
                "spark",
                table.num_rows,
                times,
                what,
                extra={"partitions": partitions, "arrow_batch_rows": batch},
            )
            picked = query().where(F.col("rid").isin([int(r) for r in rids[job]])).toPandas()
            ref = REFERENCE.get(job)
            if ref is not None:
                run.ok, run.check = compare(job, ref, sample_of(job, "spark", picked, rids[job]))
            console.print(
                f"best {run.best:.3f} s of {[round(t, 3) for t in times]} "
                f"-> {run.rows_per_s:,.0f} rows/s",
                highlight=False,
            )
            console.print(f"      check: {run.check}", highlight=False)
            runs.append(run)
    finally:
        spark.stop()
    return runs, start_s


def report(
    runs: list[Run], spark_start: float | None, args: argparse.Namespace, command: str
) -> dict[str, Any]:
    table = Table(title="Preprocessing throughput (rows/s; best of N wall-clock runs)")
    for col in ("job", "tool", "best s", "runs", "rows/s", "feedline ×", "same result"):
        table.add_column(
            col, justify="right" if col in ("best s", "rows/s", "feedline ×") else "left"
        )
    summary: dict[str, Any] = {}
    for job in args.jobs:
        job_runs = [r for r in runs if r.job == job]
        mine = next((r for r in job_runs if r.tool == "feedline"), None)
        peers = [r for r in job_runs if r.tool != "feedline"]
        for r in job_runs:
            ratio = mine.rows_per_s / r.rows_per_s if mine else float("nan")
            table.add_row(
                job,
                r.tool,
                f"{r.best:.3f}",
                str(len(r.times)),
                f"{r.rows_per_s:,.0f}",
                "" if r is mine else f"{ratio:.1f}×",
                "ref" if r is mine else ("✓" if r.ok else "✗ (see above)"),
            )
        if mine and peers:
            best_peer = max(peers, key=lambda r: r.rows_per_s)
            ratio = mine.rows_per_s / best_peer.rows_per_s
            summary[job] = {
                "best_peer": best_peer.tool,
                "ratio_vs_best_peer": round(ratio, 2),
                "goal_2x_met": ratio >= 2.0,
            }
    console.print(table)
    for job, s in summary.items():
        flag = "[green]met[/]" if s["goal_2x_met"] else "[red]MISSED[/]"
        console.print(
            f"{job}: feedline is {s['ratio_vs_best_peer']:.2f}× the best peer "
            f"({s['best_peer']}); goal ≥ 2×: {flag}"
        )
    if spark_start is not None:
        console.print(f"Spark session start: {spark_start:.1f} s (excluded from rows/s)")
    import datasets
    import pyspark
    import tokenizers

    env = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "feedline": fl.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "datasets": datasets.__version__,
        "pyspark": pyspark.__version__,
        "tokenizers": tokenizers.__version__,
        "pillow": Image.__version__,
    }
    return {
        "command": command,
        "environment": env,
        "spark_session_start_s": spark_start,
        "pandas_budget_s": args.pandas_budget,
        "sizes": {
            "text_rows": args.text_rows,
            "images": args.images,
            "tabular_rows": args.tabular_rows,
        },
        "summary": summary,
        "runs": [
            asdict(r) | {"best_s": round(r.best, 4), "rows_per_s": round(r.rows_per_s)}
            for r in runs
        ],
    }


def markdown(result: dict[str, Any], runs: list[Run]) -> str:
    env = result["environment"]
    pandas_n = ", ".join(f"{r.job} {len(r.times)}" for r in runs if r.tool == "pandas")
    sizes = result["sizes"]
    lines = [
        "## Preprocessing: feedline vs pandas, Hugging Face datasets, Spark",
        "",
        f"`{result['command']}` (set-up: `bash bench/setup_preprocess.sh`) — {env['cpus']} "
        f"cores, Python {env['python']}, pyarrow "
        f"{env['pyarrow']}, pandas {env['pandas']}, datasets {env['datasets']}, pyspark "
        f"{env['pyspark']}, tokenizers {env['tokenizers']}, Pillow {env['pillow']}.",
        "",
        f"Jobs: (a) tokenize {sizes['text_rows']:,} generated product descriptions (~15 words) "
        f"to 77 ids + mask with one WordPiece `tokenizer.json`; (b) decode {sizes['images']:,} "
        "generated photo-like JPEGs (~500×400, q90) and resize to 224×224 (shorter side + centre "
        f"crop, antialiased bilinear, Pillow); (c) StandardScaler + StringIndexer fit + transform "
        f"on {sizes['tabular_rows']:,} rows (float64 + string with 1,000 categories). Rows/s = "
        "rows / best wall time; data generation excluded. Every peer's output equals feedline's "
        "on a random sample (ids and masks equal, pixels within 1 level, scaled values within "
        "1e-6): column *same*.",
        "",
        "| job | tool | best s | rows/s | feedline is | same |",
        "|---|---|---:|---:|---:|---|",
    ]
    for job in result["summary"]:
        job_runs = [r for r in runs if r.job == job]
        mine = next(r for r in job_runs if r.tool == "feedline")
        for r in job_runs:
            ratio = "" if r is mine else f"{mine.rows_per_s / r.rows_per_s:.1f}×"
            same = "ref" if r is mine else ("yes" if r.ok else "NO")
            lines.append(
                f"| {job} | {r.tool} | {r.best:.2f} | {r.rows_per_s:,.0f} | {ratio} | {same} |"
            )
    lines.append("")
    for job, s in result["summary"].items():
        lines.append(
            f"- **{job}**: feedline {s['ratio_vs_best_peer']:.1f}× the best peer "
            f"({s['best_peer']}); goal ≥ 2×: {'met' if s['goal_2x_met'] else 'missed'}."
        )
    ceiling = result.get("images_pillow_ceiling_per_s")
    if ceiling:
        shares = ", ".join(
            f"{r.tool} {r.rows_per_s / ceiling:.0%}" for r in runs if r.job == "images"
        )
        lines.append(
            f"- (b) is bound by Pillow itself: one core decodes and resizes "
            f"{ceiling / env['cpus']:,.0f} images/s, so no tool doing this work can pass "
            f"{ceiling:,.0f}/s on {env['cpus']} cores. Share of that ceiling: {shares}."
        )
    if result["spark_session_start_s"] is not None:
        lines.append(
            f"- Spark `local[2]` session start: {result['spark_session_start_s']:.1f} s, "
            "excluded from its rows/s."
        )
    lines += [
        "- feedline: `fl.from_arrow(table).transform(p).to_arrow()` (local engine, 2 threads); "
        "the preprocessor is built inside the timed call (tokenizer loaded, word cache empty; "
        "(c) is fitted in the timed call by `fl.Chain([StandardScaler, StringIndexer])`).",
        "- pandas: row-wise `Series.apply` (one Python call per row and column; (a) one "
        "`tokenizer.encode` per row; (c) mean/var/value_counts vectorized, then apply).",
        "- (b) for the peers: `Image.open(...).convert('RGB').resize((224, 224), BILINEAR, "
        "box=centred square)` — shorter side to 224 plus centre crop as one resample, the "
        "policy of `DecodeImages(resize='shorter+center_crop')`.",
        "- datasets: `map(batched=True, num_proc=2, load_from_cache_file=False)` on a "
        "memory-mapped `Dataset` (as `load_dataset` gives), writing its Arrow cache; (a) "
        "`encode_batch` per batch; (c) stats with NumPy/pandas on the columns, then map.",
        "- Spark: `spark.read.parquet` (8 files, 2 partitions) → `mapInPandas` → `noop` sink "
        "(runs the whole query, discards rows); (a) `encode_batch` per Arrow batch; (c) the "
        "stats are Spark aggregates (`avg`, `var_pop`, `groupBy().count()`) in the timed call.",
        "- Best of N: feedline/demo/synthetic/Spark N = "
        f"{max(len(r.times) for r in runs if r.tool != 'pandas')}; pandas stops repeating "
        f"after {result['pandas_budget_s']:g} s (N = {pandas_n}).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, 1-2 repeats")
    parser.add_argument("--text-rows", type=int, default=200_000)
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--tabular-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N")
    parser.add_argument(
        "--pandas-budget",
        type=float,
        default=5.0,
        help="pandas (slow): no further repeat once this many seconds are spent",
    )
    parser.add_argument("--jobs", default="text,images,tabular")
    parser.add_argument("--tools", default="feedline,pandas,datasets,spark")
    parser.add_argument("--sample", type=int, default=1000, help="rows checked per tool")
    args = parser.parse_args()
    command = (
        "flock /tmp/feedline-bench.lock bench/.venvs/preprocess/bin/python bench/preprocess.py"
    ) + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    if args.quick:
        args.text_rows, args.images, args.tabular_rows = 20_000, 500, 100_000
        args.repeat = 2
    args.jobs = [j for j in args.jobs.split(",") if j]
    args.tools = [t for t in args.tools.split(",") if t]
    import datasets

    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    inputs = make_inputs(args)
    rng = np.random.default_rng(1)
    sizes = {"text": args.text_rows, "images": args.images, "tabular": args.tabular_rows}
    rids = {
        job: np.sort(
            rng.choice(
                sizes[job],
                min(sizes[job], args.sample if job != "images" else args.sample // 5),
                replace=False,
            )
        )
        for job in args.jobs
    }
    work = Path(tempfile.mkdtemp(prefix="feedline-bench-preprocess-"))
    runs: list[Run] = []
    spark_start, ceiling = None, None
    try:
        if "images" in args.jobs:
            ceiling = pillow_ceiling(inputs["images"])
            console.print(
                f"  [images] Pillow ceiling: {ceiling:,.0f} images/s on "
                f"{os.cpu_count()} cores (single-thread decode+resize time x cores)"
            )
        for job in args.jobs:
            runs += run_local_tools(job, inputs[job], args, work, rids[job])
        if "spark" in args.tools:
            spark_runs, spark_start = run_spark(inputs, args, work, rids)
            runs += spark_runs
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = report(runs, spark_start, args, command)
    result["images_pillow_ceiling_per_s"] = None if ceiling is None else round(ceiling)
    OUT.mkdir(exist_ok=True)
    (OUT / "preprocess.json").write_text(json.dumps(result, indent=2))
    console.print(f"wrote {OUT / 'preprocess.json'}")
    print("\n<!-- markdown for BENCHMARKS.md -->\n" + markdown(result, runs))
    bad = [r for r in runs if r.ok is False]
    if bad:
        sys.exit(f"outputs differ from feedline's: {[(r.job, r.tool) for r in bad]}")


if __name__ == "__main__":
    main()
