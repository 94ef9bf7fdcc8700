"""``fl.ImageTransform`` over decoded ``uint8`` pixels (a tensor column): the same crop box
and flip per sample as for encoded bytes, per sample or vectorized per batch, exact on
resume; and a batch whose every sample is skipped is counted, never yielded empty."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader import nodes
from feedline.preprocess.vision.pixels import resample

N = 24


def pixels(n: int = N, shape: tuple[int, int, int] = (3, 40, 48)) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, (n, *shape), dtype=np.uint8)


def tensor_ds(images: np.ndarray) -> fl.Dataset:
    table = pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
                      "id": np.arange(len(images))})  # fmt: skip
    return fl.from_arrow(table)


def png(image_chw: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image_chw.transpose(1, 2, 0)).save(buf, "PNG")
    return buf.getvalue()


def test_decoded_pixels_are_augmented_not_refused_as_undecodable() -> None:
    images = pixels()
    loader = tensor_ds(images).loader(batch_size=8, seed=1, format="numpy",
                                      transform=fl.ImageTransform("image", size=32))  # fmt: skip
    batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        assert b["image"].shape == (8, 3, 32, 32) and b["image"].dtype == np.float32
    transform = fl.ImageTransform("image", size=32)
    again = list(tensor_ds(images).loader(batch_size=8, seed=1, format="numpy",
                                          transform=transform))  # fmt: skip
    for a, b in zip(batches, again, strict=True):  # seeded per (seed, epoch, index)
        np.testing.assert_array_equal(a["image"], b["image"])


@pytest.mark.parametrize("size", [64, 16])  # crops upscaled; crops shrunk (antialiased)
def test_pixels_get_the_same_crop_and_flip_as_the_same_image_encoded(size: int) -> None:
    """The pixel path matches Pillow's bilinear resize of the PNG to within rounding,
    sample by sample, flips included."""
    images = pixels()
    encoded = fl.from_arrow(pa.table({"image": [png(im) for im in images],
                                      "id": np.arange(N)}))  # fmt: skip
    transform = fl.ImageTransform("image", size=size, scale=(0.2, 1.0), normalize=False)
    kwargs = {"batch_size": 6, "seed": 5, "format": "numpy", "transform": transform}
    for a, b in zip(tensor_ds(images).loader(**kwargs), encoded.loader(**kwargs), strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])
        diff = np.abs(a["image"].astype(int) - b["image"].astype(int))
        assert diff.max() <= 2, diff.max()  # Pillow rounds through 8 bits between passes


def test_batched_calls_vectorize_and_equal_the_per_sample_ones_in_any_layout() -> None:
    images = pixels()
    for train, normalize in ((True, True), (False, False)):
        transform = fl.ImageTransform("image", size=24, train=train, normalize=normalize)
        kwargs = {"batch_size": 8, "seed": 2, "format": "numpy", "transform": transform}
        per_sample = list(tensor_ds(images).loader(**kwargs))
        batched = list(tensor_ds(images).loader(**kwargs, batched=True, num_workers=2))
        hwc = list(tensor_ds(images.transpose(0, 2, 3, 1).copy()).loader(**kwargs, batched=True))
        for a, b, c in zip(per_sample, batched, hwc, strict=True):
            np.testing.assert_array_equal(a["image"], b["image"])
            np.testing.assert_array_equal(a["image"], c["image"])
            assert a["image"].dtype == (np.float32 if normalize else np.uint8)


def test_the_pixel_grid_is_pillows_for_a_crop_a_resize_and_a_flip() -> None:
    image = np.arange(64, dtype=np.uint8).reshape(1, 8, 8, 1) * 3
    crop = resample(image, [(2, 1, 6, 5)], (4, 4))[0, :, :, 0]
    np.testing.assert_array_equal(crop, image[0, 1:5, 2:6, 0])  # whole pixels: exact
    flipped = resample(image, [(2, 1, 6, 5)], (4, 4), flips=[True])[0, :, :, 0]
    np.testing.assert_array_equal(flipped, crop[:, ::-1])
    for box, size in (((1, 2, 7, 8), (16, 12)), ((0.5, 0, 8, 7.5), (3, 2))):  # up, down
        pil = Image.fromarray(image[0, :, :, 0]).resize(size, Image.BILINEAR, box=box)
        ours = resample(image, [box], size)[0, :, :, 0]
        assert np.abs(np.asarray(pil, dtype=float) - ours).max() <= 1.0
    padded = resample(image, [(-2, 0, 10, 8)], (12, 8))[0, :, :, 0]  # outside: zeros
    assert (padded[:, :2] == 0).all() and (padded[:, -2:] == 0).all()


def test_pixels_of_a_list_column_of_several_sizes() -> None:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (3, 30 + i, 40), dtype=np.uint8) for i in range(6)]
    transform = fl.ImageTransform("image", size=16)
    batch = {"image": images, "id": np.arange(6)}
    out = transform(batch, nodes.SampleRngs(0, 0, np.arange(6)))
    assert out["image"].shape == (6, 3, 16, 16)
    for i, image in enumerate(images):  # each one as it would be alone
        alone = transform({"image": image}, nodes.SampleRngs(0, 0, np.arange(6))[i], index=i)
        np.testing.assert_array_equal(out["image"][i], alone["image"])


def test_pixels_the_transform_cannot_take_are_a_configuration_error() -> None:
    floats = fl.from_arrow(pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(
        np.zeros((4, 3, 8, 8), np.float32))}))  # fmt: skip
    with pytest.raises(ConfigurationError, match="uint8"):
        list(floats.loader(batch_size=2, transform=fl.ImageTransform("image", size=4)))
    square = tensor_ds(pixels(4, (3, 8, 3)))  # channels first or last?
    with pytest.raises(ConfigurationError, match="input_layout"):
        list(square.loader(batch_size=2, transform=fl.ImageTransform("image", size=4)))
    chw = fl.ImageTransform("image", size=4, input_layout="CHW")
    assert next(iter(square.loader(batch_size=2, transform=chw, format="numpy")))[
        "image"].shape == (2, 3, 4, 4)  # fmt: skip
    grey = tensor_ds(pixels(4, (1, 8, 8)))
    with pytest.raises(ConfigurationError, match="mode"):
        list(grey.loader(batch_size=2, transform=fl.ImageTransform("image", size=4)))
    grey_out = fl.ImageTransform("image", size=4, mode="L", mean=0.5, std=0.5)
    assert next(iter(grey.loader(batch_size=2, transform=grey_out, format="numpy")))[
        "image"].shape == (2, 1, 4, 4)  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    batch=st.integers(1, 9),
    batched=st.booleans(),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
    data=st.data(),
)
def test_resume_of_pixel_augmentation_is_exact_at_any_batch(
    n: int, batch: int, batched: bool, seed: int, epoch: int, data: st.DataObject
) -> None:
    ds = tensor_ds(pixels(n, (3, 12, 10)))
    kwargs = {"batch_size": batch, "seed": seed, "format": "numpy", "batched": batched,
              "transform": fl.ImageTransform("image", size=8, scale=(0.3, 1.0))}  # fmt: skip
    full = ds.loader(**kwargs)
    full.set_epoch(epoch)
    expected = list(full)
    k = data.draw(st.integers(0, len(expected)))
    first = ds.loader(**kwargs, prefetch=data.draw(st.integers(0, 2)))
    first.set_epoch(epoch)
    iterator = iter(first)
    head = [next(iterator) for _ in range(k)]
    iterator.close()
    second = ds.loader(**kwargs)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    second.set_epoch(epoch)
    tail = list(second) if k < len(expected) else []
    assert len(head) + len(tail) == len(expected)
    for got, want in zip(head + tail, expected, strict=True):
        np.testing.assert_array_equal(got["id"], want["id"])
        np.testing.assert_array_equal(got["image"], want["image"])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_whose_every_sample_is_skipped_is_counted_not_yielded_empty(workers) -> None:
    good = png(pixels(1)[0])
    data = [b"broken" if 4 <= i < 8 else good for i in range(16)]  # batch 1: all bad
    ds = fl.from_arrow(pa.table({"image": pa.array(data, pa.binary()), "id": np.arange(16)}))
    loader = ds.loader(batch_size=4, shuffle=False, format="numpy", num_workers=workers,
                       transform=fl.ImageTransform("image", size=8, on_error="skip"))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(loader)
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [8, 9, 10, 11],
                                                   [12, 13, 14, 15]]  # fmt: skip
    assert all(b["image"].shape == (4, 3, 8, 8) for b in batches)
    assert loader.stats()["skipped"] == 4 and loader.metrics()[0]["skipped"] == 4
    assert loader.state_dict()["batches"] == 4  # the dropped batch counts as consumed
    loader.close()
