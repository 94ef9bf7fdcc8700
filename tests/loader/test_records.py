"""Serving: ``fl.open(path).preprocessor`` + ``fl.record_to_tensors`` give the loader's row.

One written dataset with every kind of loader column a pipeline makes: scaled floats, indexed
strings, tokenized text (fixed-length ids and mask), a decoded image tensor, a fixed-size list
passed through, a uint16 column (widened for torch) and an untouched label. Each raw record,
transformed by the stored preprocessor and converted by the helper, must equal the loader's
batch row for it: same dtype, same shape, same values.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import DataError, SchemaError

Image = pytest.importorskip("PIL.Image")
tokenizers = pytest.importorskip("tokenizers")

N = 12
WORDS = ["soft", "cotton", "shirt", "blue", "steel", "bottle"]


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (6 + seed % 3, 9, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def _tokenizer(folder: Path) -> str:
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _raw(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "price": pa.array(rng.normal(50, 10, n).astype(np.float32)),
            "category": [["shoes", "bags", "hats"][i % 3] for i in range(n)],
            "text": [" ".join(rng.choice(WORDS, 1 + i % 7)) for i in range(n)],
            "image": [_png(i) for i in range(n)],
            "size": pa.array(np.arange(n, dtype=np.uint16) * 1000),
            "emb": pa.array(
                rng.normal(0, 1, (n, 3)).astype(np.float32).tolist(), pa.list_(pa.float32(), 3)
            ),
            "label": pa.array(np.arange(n) % 2, pa.int64()),
        }
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[fl.Dataset, pa.Table]:
    folder = tmp_path_factory.mktemp("serving")
    raw = _raw(N)
    pipeline = fl.Chain([
        fl.StandardScaler("price"),
        fl.StringIndexer("category"),
        fl.Tokenize("text", _tokenizer(folder), max_length=5, mask_output="mask"),
        fl.DecodeImages("image", size=(4, 6), path_column=None),
    ])  # fmt: skip
    fl.from_arrow(raw).transform(pipeline).write(folder / "ds", rows_per_shard=5)
    return fl.open(folder / "ds"), raw


def test_the_dataset_has_every_kind_of_column(served) -> None:
    ds, _ = served
    types = {f.name: f.type for f in ds.schema()}
    assert pa.types.is_floating(types["price"]) and pa.types.is_integer(types["category"])
    assert isinstance(types["image"], pa.FixedShapeTensorType)
    assert isinstance(types["text"], pa.FixedShapeTensorType)
    assert pa.types.is_fixed_size_list(types["emb"]) and types["size"] == pa.uint16()


@pytest.mark.parametrize("fmt", ["torch", "numpy"])
def test_a_served_record_equals_the_loaders_row(served, fmt: str) -> None:
    ds, raw = served
    loader = ds.loader(batch_size=N, shuffle=False, format=fmt, columns=None, prefetch=0)
    batch = next(iter(loader))
    preprocessor = ds.preprocessor
    schema = ds.schema()
    assert set(batch) == {"price", "category", "text", "mask", "image", "size", "emb", "label"}
    for i, record in enumerate(raw.to_pylist()):
        got = fl.record_to_tensors(preprocessor.transform_record(record), schema, format=fmt)
        assert set(got) == set(batch)
        for name, value in got.items():
            want = batch[name][i : i + 1]
            assert value.dtype == want.dtype, name
            assert tuple(value.shape) == tuple(want.shape), name
            assert (value == want).all(), name
    if fmt == "torch":  # uint16 is widened for torch, as the loader does
        import torch

        assert got["size"].dtype == torch.int32 and got["image"].dtype == torch.uint8


def test_several_records_make_a_batch_and_the_label_may_be_missing(served) -> None:
    ds, raw = served
    pre, schema = ds.preprocessor, ds.schema()
    records = [pre.transform_record({k: v for k, v in r.items() if k != "label"})
               for r in raw.to_pylist()[:3]]  # fmt: skip
    out = fl.record_to_tensors(records, schema, format="numpy")
    assert "label" not in out and out["image"].shape == (3, 4, 6, 3)
    assert out["text"].shape == (3, 5)


def test_a_record_that_does_not_fit_the_dataset_is_refused(served) -> None:
    ds, raw = served
    record = ds.preprocessor.transform_record(raw.to_pylist()[0])
    schema = ds.schema()
    with pytest.raises(SchemaError, match="'image' holds 3 values"):
        fl.record_to_tensors({**record, "image": [1, 2, 3]}, schema)
    with pytest.raises(SchemaError, match=r"\['extra'\] are not columns"):
        fl.record_to_tensors({**record, "extra": 1}, schema)
    with pytest.raises(DataError, match="null"):
        fl.record_to_tensors({**record, "price": None}, schema)
    with pytest.raises(DataError, match="'category' does not fit"):
        fl.record_to_tensors({**record, "category": "shoes"}, schema)
