"""Load-time image decode and augmentation: encoded JPEG bytes in a written dataset, decoded
by ``fl.ImageTransform`` in the loader's workers; bad images skipped, counted and reported."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import feedline as fl
from feedline.errors import DataError

N, BAD = 40, (5, 17, 18)


def jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=80)
    return buf.getvalue()


@pytest.fixture
def images(write) -> fl.Dataset:
    data = [b"not a jpeg" if i in BAD else jpeg(i) for i in range(N)]
    table = pa.table({"image": pa.array(data, pa.binary()), "label": np.arange(N) % 3,
                      "id": np.arange(N)})  # fmt: skip
    return write(table=table, rows_per_shard=20, row_group_rows=10)


def test_training_augmentation_differs_per_epoch_and_repeats_per_seed(images) -> None:
    train = fl.ImageTransform("image", size=32, on_error="skip")
    kwargs = {"batch_size": 8, "seed": 1, "transform": train, "num_workers": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with images.loader(**kwargs) as a, images.loader(**kwargs, worker_type="process") as b:
            first = list(a)
            again = list(b)
            second = list(a)  # the next epoch
    assert all(x["image"].shape[1:] == (3, 32, 32) for x in first)
    assert str(first[0]["image"].dtype) == "torch.float32"
    for x, y in zip(first, again, strict=True):  # threads and processes: the same samples
        assert (x["image"] == y["image"]).all() and (x["id"] == y["id"]).all()
    by_id = [{int(i): img for b in e for i, img in zip(b["id"], b["image"], strict=True)}
             for e in (first, second)]  # fmt: skip
    assert not any((by_id[0][i] == by_id[1][i]).all() for i in by_id[0].keys() & by_id[1].keys())


def test_bad_images_are_dropped_from_their_batch_counted_and_reported(images) -> None:
    transform = fl.ImageTransform("image", train=False, size=32, normalize=False,
                                  on_error="skip")  # fmt: skip
    loader = images.loader(batch_size=8, shuffle=False, transform=transform, num_workers=2,
                           worker_type="process", format="numpy")  # fmt: skip
    with loader, pytest.warns(UserWarning, match="skipped a sample"):
        batches = list(loader)
    assert [len(b["id"]) for b in batches] == [7, 8, 6, 8, 8]  # rows 5, 17 and 18 dropped
    kept = np.concatenate([b["id"] for b in batches])
    assert sorted(set(range(N)) - set(kept.tolist())) == list(BAD)
    assert batches[0]["image"].dtype == np.uint8 and batches[0]["image"].shape == (7, 3, 32, 32)
    stats = loader.stats()
    assert stats["skipped"] == 3 and len(stats["skipped_examples"]) == 3
    assert "sample 17" in stats["skipped_examples"][1]
    assert "Pillow cannot identify" in stats["skipped_examples"][0]
    metrics = loader.metrics()[0]
    assert metrics["skipped"] == 3 and metrics["samples"] == N - 3 and metrics["batches"] == 5
    strict = images.loader(batch_size=8, shuffle=False, format="numpy",
                           transform=fl.ImageTransform("image", size=32))  # fmt: skip
    with pytest.raises(DataError, match="sample 5"):
        list(strict)


def test_resume_with_skipped_samples_is_exact(images) -> None:
    transform = fl.ImageTransform("image", size=24, on_error="skip")
    kwargs = {"batch_size": 6, "seed": 3, "transform": transform, "format": "numpy",
              "drop_last": False}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = list(images.loader(**kwargs))
        first = images.loader(**kwargs, num_workers=2)
        iterator = iter(first)
        head = [next(iterator) for _ in range(3)]
        resumed = images.loader(**{**kwargs, "seed": None}, num_workers=2, worker_type="process")
        resumed.load_state_dict(first.state_dict())
        with first, resumed:
            tail = list(resumed)
    assert len(head) + len(tail) == len(whole) == 7
    for got, want in zip(head + tail, whole, strict=True):
        np.testing.assert_array_equal(got["id"], want["id"])
        np.testing.assert_array_equal(got["image"], want["image"])
