"""DecodeImages and Normalize on real files written with Pillow (good, odd-mode and bad ones)."""

from __future__ import annotations

import functools
import io
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.source import ExecutionReport
from feedline.preprocess.preprocessor import from_state
from feedline.preprocess.vision.preprocessors import DecodeImages, Normalize, decode_pool

Image = pytest.importorskip("PIL.Image")
ImageFilter = pytest.importorskip("PIL.ImageFilter")
ImageFile = pytest.importorskip("PIL.ImageFile")

BAD = {"corrupt.png", "truncated.jpg", "empty.jpg", "notes.png", "bomb.png"}


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """A smooth, photo-like RGB image (so JPEG sizes and decode times are realistic)."""
    y, x = np.mgrid[0:h, 0:w]
    a = (np.sin(x / 37.0) + np.cos(y / 23.0) + np.sin((x + y) / 11.0 + seed)) * 40 + 128
    noise = np.random.default_rng(seed).normal(0, 6, (h, w, 3))
    rgb = np.stack([a, np.roll(a, 50, 1), 255 - a], -1) + noise
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).filter(ImageFilter.BoxBlur(1))


def encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of ``width x height`` zeros: tiny on disk, huge when decoded."""
    row = b"\x00" * (1 + (width + 7) // 8)
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", data)
        + png_chunk(b"IEND", b"")
    )


def lying_png(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims ``width x height`` (its pixel data cannot be decoded)."""
    raw = bytearray(encode(Image.new("L", (1, 1)), "PNG"))
    ihdr = bytes(raw[12:16]) + struct.pack(">II", width, height) + bytes(raw[24:29])
    raw[12:33] = ihdr + struct.pack(">I", zlib.crc32(ihdr))
    return bytes(raw)


def good_files() -> dict[str, bytes]:
    return dict(_good_files())


@functools.cache
def _good_files() -> dict[str, bytes]:
    rgba = Image.new("RGBA", (80, 80), (255, 0, 0, 255))
    rgba.paste((0, 0, 255, 0), (40, 0, 80, 80))  # right half fully transparent blue
    pal = Image.new("P", (60, 60), 1)
    pal.putpalette([0, 0, 0, 0, 200, 0] + [0] * 762)
    pal.paste(0, (0, 0, 30, 60))  # left half: index 0, declared transparent
    deep = Image.fromarray((np.arange(70 * 90).reshape(70, 90) % 256 * 257).astype(np.uint16))
    return {
        "rgb_small.jpg": encode(photo(64, 48), "JPEG"),
        "rgb_500x400.jpg": encode(photo(500, 400, 1), "JPEG", quality=90),
        "rgb_tall.jpg": encode(photo(120, 300, 2), "JPEG"),
        "rgb.png": encode(photo(100, 80, 3), "PNG"),
        "grey.png": encode(photo(90, 70, 4).convert("L"), "PNG"),
        "grey.jpg": encode(photo(90, 70, 5).convert("L"), "JPEG"),
        "rgba.png": encode(rgba, "PNG"),
        "palette.png": encode(pal, "PNG", transparency=0),
        "cmyk.jpg": encode(Image.new("CMYK", (50, 40), (0, 255, 255, 0)), "JPEG", quality=95),
        "deep16.png": encode(deep, "PNG"),
    }


def bad_files() -> dict[str, bytes]:
    return dict(_bad_files())


@functools.cache
def _bad_files() -> dict[str, bytes]:
    good = encode(photo(200, 150), "JPEG")
    corrupt = bytearray(encode(photo(50, 40), "PNG"))
    start = corrupt.find(b"IDAT") + 8
    corrupt[start : start + 32] = bytes(b ^ 0xFF for b in corrupt[start : start + 32])
    return {
        "corrupt.png": bytes(corrupt),
        "truncated.jpg": good[: len(good) // 2],
        "empty.jpg": b"",
        "notes.png": b"just some text, not an image\n",
        "bomb.png": bomb_png(20_000, 20_000),
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    for sub, files in (("good", good_files()), ("bad", bad_files())):
        (root / sub).mkdir()
        for name, data in files.items():
            (root / sub / name).write_bytes(data)
    return root


def batch_of(files: dict[str, bytes]) -> pa.RecordBatch:
    return pa.record_batch({"path": list(files), "bytes": pa.array(list(files.values()))})


def decoded(p: DecodeImages, files: dict[str, bytes]) -> np.ndarray:
    return p.transform_batch(batch_of(files)).column(p.output[0]).to_numpy_ndarray()


def pil_reference(im: Image.Image, size: tuple[int, int], crop: bool = True) -> np.ndarray:
    h, w = size
    sw, sh = im.size
    box = (0, 0, sw, sh)
    if crop:
        s = max(w / sw, h / sh)
        box = ((sw - w / s) / 2, (sh - h / s) / 2, (sw + w / s) / 2, (sh + h / s) / 2)
    return np.asarray(im.resize((w, h), Image.Resampling.BILINEAR, box=box))


# ---------------------------------------------------------------- good images, all modes


@pytest.mark.parametrize(
    "mode,layout,shape",
    [
        ("RGB", "HWC", (24, 32, 3)),
        ("RGB", "CHW", (3, 24, 32)),
        ("L", "HWC", (24, 32, 1)),
        ("L", "CHW", (1, 24, 32)),
        ("RGBA", "HWC", (24, 32, 4)),
    ],
)
def test_every_good_file_decodes_to_the_declared_shape(folder, mode, layout, shape):
    p = DecodeImages(size=(24, 32), mode=mode, layout=layout)
    out = fl.read_images(folder / "good").transform(p).to_arrow()
    assert out.num_rows == len(good_files())
    assert out.schema.field("bytes").type == pa.fixed_shape_tensor(pa.uint8(), list(shape))
    assert out.schema.field("bytes").type == p.output_type
    pixels = out.column("bytes").combine_chunks().to_numpy_ndarray()
    assert pixels.shape == (out.num_rows, *shape) and pixels.dtype == np.uint8
    assert out.column_names == ["path", "label", "bytes"]


def test_output_column_keeps_the_input(folder):
    p = DecodeImages(size=8, output="image")
    out = fl.read_images(folder / "good").transform(p).to_arrow()
    assert out.column_names == ["path", "label", "bytes", "image"]
    assert out.schema.field("bytes").type == pa.binary()


def test_solid_colour_is_exact_and_gradient_matches_pillow():
    solid = Image.new("RGB", (100, 60), (12, 200, 77))
    out = decoded(DecodeImages(size=(32, 32)), {"solid.png": encode(solid, "PNG")})
    assert (out == np.array([12, 200, 77], np.uint8)).all()

    y, x = np.mgrid[0:200, 0:300]
    grad = Image.fromarray(
        np.stack([x * 255 // 299, y * 255 // 199, (x + y) % 256], -1).astype(np.uint8)
    )
    for resize, crop in (("shorter+center_crop", True), ("stretch", False)):
        out = decoded(DecodeImages(size=(40, 48), resize=resize), {"g.png": encode(grad, "PNG")})
        diff = np.abs(out[0].astype(int) - pil_reference(grad, (40, 48), crop).astype(int))
        assert diff.mean() < 1.0 and diff.max() <= 3, resize
    chw = decoded(DecodeImages(size=(40, 48), layout="CHW"), {"g.png": encode(grad, "PNG")})
    hwc = decoded(DecodeImages(size=(40, 48)), {"g.png": encode(grad, "PNG")})
    assert np.array_equal(chw[0], hwc[0].transpose(2, 0, 1))


def test_center_crop_keeps_the_centre_and_stretch_keeps_everything():
    thirds = Image.new("RGB", (600, 200), (255, 0, 0))
    thirds.paste((0, 255, 0), (200, 0, 400, 200))
    thirds.paste((0, 0, 255), (400, 0, 600, 200))
    files = {"thirds.png": encode(thirds, "PNG")}
    crop = decoded(DecodeImages(size=(16, 16)), files)[0]
    assert (np.abs(crop[:, 1:-1].astype(int) - [0, 255, 0]) <= 2).all()
    stretch = decoded(DecodeImages(size=(16, 48), resize="stretch"), files)[0]
    assert (stretch[:, 2] == [255, 0, 0]).all() and (stretch[:, -3] == [0, 0, 255]).all()
    assert (stretch[:, 24] == [0, 255, 0]).all()


def test_center_crop_survives_rounding_and_matches_pillow():
    # 224 / (224 / 400) == 400.00000000000006 > 400: unclamped, the crop box started at
    # -3e-14 and Pillow refused it ("box offset can't be negative"), e.g. for 400x500 photos
    rng = np.random.default_rng(0)
    sizes = [(400, 500), (500, 400), (401, 500), (333, 517), (517, 333), (224, 300)]
    sizes += [tuple(int(v) for v in rng.integers(20, 700, 2)) for _ in range(60)]
    for w, h in sizes:
        im = photo(w, h) if (w, h) in sizes[:6] else Image.new("RGB", (w, h), (9, 99, 199))
        files = {"p.png": encode(im, "PNG", compress_level=1)}
        for size in ((224, 224), (32, 48), (77, 13)):
            out = decoded(DecodeImages(size=size), files)[0]
            H, W = size
            s = max(W / w, H / h)
            cw, ch = min(w, W / s), min(h, H / s)
            box = ((w - cw) / 2, (h - ch) / 2, (w + cw) / 2, (h + ch) / 2)
            ref = np.asarray(
                im.resize((W, H), Image.Resampling.BILINEAR, box=box, reducing_gap=3.0)
            )  # as DecodeImages
            assert np.abs(out.astype(int) - ref).max() <= 1, (w, h, size)


def test_odd_modes_are_converted_correctly():
    files = good_files()
    rgba = decoded(DecodeImages(size=(8, 8)), {"rgba.png": files["rgba.png"]})[0]
    assert (rgba[:, :3] == [255, 0, 0]).all() and (rgba[:, -3:] == 255).all()  # onto white
    keep = decoded(DecodeImages(size=(8, 8), mode="RGBA"), {"rgba.png": files["rgba.png"]})[0]
    assert (keep[:, -3:, 3] == 0).all() and (keep[:, :3, 3] == 255).all()
    pal = decoded(DecodeImages(size=(6, 6)), {"palette.png": files["palette.png"]})[0]
    assert (pal[:, :2] == 255).all() and (pal[:, -2:] == [0, 200, 0]).all()
    cmyk = decoded(DecodeImages(size=(8, 8)), {"cmyk.jpg": files["cmyk.jpg"]})[0]
    assert (np.abs(cmyk.astype(int) - [255, 0, 0]) <= 8).all()
    # 16-bit grey is scaled to 8 bits (value * 257 -> value), not clipped at 255
    deep = decoded(DecodeImages(size=(70, 90), mode="L"), {"d.png": files["deep16.png"]})[0]
    assert np.array_equal(deep[..., 0], (np.arange(70 * 90).reshape(70, 90) % 256))
    grey = decoded(DecodeImages(size=(70, 90)), {"grey.png": files["grey.png"]})[0]
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    # L from RGB is Pillow's own luma conversion
    rgb = Image.open(io.BytesIO(files["rgb.png"]))
    grey = decoded(DecodeImages(size=(80, 100), mode="L"), {"rgb.png": files["rgb.png"]})[0]
    assert np.array_equal(grey[..., 0], np.asarray(rgb.convert("L")))


def test_jpeg_draft_is_close_to_full_decoding_and_faster(capsys):
    data = encode(photo(2000, 1500, 7), "JPEG", quality=90)
    p = DecodeImages(size=(224, 224))
    out = decoded(p, {"big.jpg": data})[0]
    full = Image.open(io.BytesIO(data))
    reference = pil_reference(full, (224, 224))
    assert np.abs(out.astype(int) - reference.astype(int)).mean() < 2.0

    def best(fn, runs: int = 5) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    drafted = best(lambda: p.decode([data]))
    plain = best(lambda: pil_reference(Image.open(io.BytesIO(data)), (224, 224)))
    with capsys.disabled():
        print(
            f"\n2000x1500 JPEG -> 224x224: draft {drafted * 1e3:.1f} ms, full decode "
            f"{plain * 1e3:.1f} ms, speedup {plain / drafted:.1f}x"
        )


def test_grey_jpeg_with_draft_to_l():
    data = encode(photo(800, 600, 8), "JPEG", quality=92)
    out = decoded(DecodeImages(size=(64, 64), mode="L"), {"big.jpg": data})[0, ..., 0]
    reference = pil_reference(Image.open(io.BytesIO(data)).convert("L"), (64, 64))
    assert np.abs(out.astype(int) - reference.astype(int)).mean() < 2.0


# ---------------------------------------------------------------- EXIF orientation

# How a camera stores an upright picture for each EXIF orientation (the inverse of what a
# viewer applies): 6 = camera turned right, so the stored pixels are the picture turned left.
STORED = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def marked(w: int, h: int) -> Image.Image:
    """High-contrast and asymmetric: a red top-left quadrant, a green bar along the top right,
    a blue stripe down the left of the bottom half, on black."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 6, w // 2 :] = (0, 255, 0)
    a[h // 2 :, : w // 8] = (0, 0, 255)
    return Image.fromarray(a)


def as_taken(upright: Image.Image, orientation: int, fmt: str = "JPEG") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    options = {"quality": 100, "subsampling": 0} if fmt == "JPEG" else {}
    return encode(upright.transpose(STORED[orientation]), fmt, exif=exif, **options)


@pytest.mark.parametrize("orientation", [6, 3, 8, 2, 4, 5, 7])
def test_exif_orientation_is_applied(orientation):
    upright = marked(330, 210)  # drafted at 1/4: 82.5 x 52.5, a fractional region
    files = {
        "taken.jpg": as_taken(upright, orientation),
        "upright.jpg": encode(upright, "JPEG", quality=100, subsampling=0),
    }
    assert Image.open(io.BytesIO(files["taken.jpg"])).size != upright.size or orientation < 5
    for p in (
        DecodeImages(size=(42, 64)),
        DecodeImages(size=(21, 32)),
        DecodeImages(size=(60, 40), resize="stretch"),
    ):
        got, reference = decoded(p, files).astype(int)
        error = np.abs(got - reference)  # JPEG noise only; turned: ~100, half a pixel off: ~90
        assert error.mean() < 1.0 and error.max() < 40, (orientation, p.size)
        h, w = p.size
        red = got[: h // 2 - 2, 2 : w // 2 - 2]
        assert (red[..., 0] > 200).all() and (red[..., 1:] < 60).all()  # the marker quadrant
        assert (got[h // 2 + 2 :, w // 2 :] < 60).all()  # no marker in the bottom right
    stored = DecodeImages(size=(42, 64)).decode([files["taken.jpg"]])[0][0]  # 1/8 draft
    full = pil_reference(Image.open(io.BytesIO(files["upright.jpg"])), (42, 64))
    assert np.abs(stored.astype(int) - full).mean() < 3.0


@pytest.mark.parametrize("orientation", [6, 8])
def test_exif_orientation_of_png_without_resizing_is_exact(orientation):
    upright = marked(90, 60)
    data = as_taken(upright, orientation, "PNG")
    got = decoded(DecodeImages(size=(60, 90)), {"taken.png": data})[0]
    assert np.array_equal(got, np.asarray(upright))
    chw = decoded(DecodeImages(size=(60, 90), layout="CHW"), {"taken.png": data})[0]
    assert np.array_equal(chw, np.asarray(upright).transpose(2, 0, 1))


@pytest.mark.parametrize(
    "patch",
    [
        {18: b"\x00\x09"},
        {18: b"\x00\x00"},  # out of range
        {12: b"\x00\x02\x00\x00\x00\x04", 18: b"ab\x00\x00"},
    ],
)  # text
def test_odd_orientation_tags_keep_the_pixels_as_stored(patch):
    upright = marked(64, 48)
    data = bytearray(as_taken(upright, 6))
    tiff = data.index(b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12") + 6  # one tag
    for offset, value in patch.items():
        data[tiff + offset : tiff + offset + len(value)] = value
    got = decoded(DecodeImages(size=(64, 48)), {"odd.jpg": bytes(data)})[0]
    stored = np.asarray(upright.transpose(STORED[6]))
    assert np.abs(got.astype(int) - stored).mean() < 2.0


# ---------------------------------------------------------------- bad images


@pytest.mark.parametrize("name", sorted(BAD))
def test_raise_names_the_bad_file(name):
    files = {"ok.jpg": good_files()["rgb_small.jpg"], name: bad_files()[name]}
    with pytest.raises(DataError, match=rf"{name}.*Fix:") as err:
        DecodeImages(size=16).transform_batch(batch_of(files))
    if name == "bomb.png":
        assert "too large" in str(err.value)


def test_raise_through_the_engine(folder):
    ds = fl.read_images(folder / "bad").transform(DecodeImages(size=16))
    with pytest.raises(DataError, match=r"/bad/\w+\.(png|jpg)"):
        ds.to_arrow()


def test_header_size_is_checked_before_decoding():
    # the header claims 5000x5000 but the data is a 1x1 image: only a pre-decode check
    # reports "too large" (decoding would fail with a different reason)
    files = {"liar.png": lying_png(5000, 5000)}
    with pytest.raises(DataError, match=r"liar\.png.*25,000,000 pixels > max_pixels"):
        DecodeImages(size=16, max_pixels=10_000_000).transform_batch(batch_of(files))
    ok = {"ok.jpg": good_files()["rgb_500x400.jpg"]}
    with pytest.raises(DataError, match="max_pixels=100,000"):
        DecodeImages(size=16, max_pixels=100_000).transform_batch(batch_of(ok))
    assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's global setting is left alone


def test_skip_drops_exactly_the_bad_rows_and_reports_them(folder, tmp_path):
    p = DecodeImages(size=(16, 16), on_error="skip")
    info = fl.read_images(folder).transform(p).write(tmp_path / "out")
    report = info.report
    assert report["rows_read"] == len(good_files()) + len(BAD)
    assert info.rows == len(good_files())
    assert report["rows_read"] == info.rows + report["records_skipped"]
    assert {Path(s["where"]).name for s in report["skipped"]} == BAD
    assert all(s["reason"] for s in report["skipped"])

    ds = fl.open(tmp_path / "out")
    stored = ds.manifest.write["report"]
    assert stored["skipped"] == report["skipped"] and stored["records_skipped"] == len(BAD)
    paths = ds.to_arrow().column("path").to_pylist()
    assert {Path(x).name for x in paths} == set(good_files())
    reasons = {Path(s["where"]).name: s["reason"] for s in stored["skipped"]}
    assert "empty" in reasons["empty.jpg"] and "too large" in reasons["bomb.png"]
    assert "truncated" in reasons["truncated.jpg"] and "identify" in reasons["notes.png"]
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_skip_without_a_path_column_names_rows_and_warns():
    files = {"a.jpg": good_files()["rgb_small.jpg"], "b.png": b"", "c.png": None}
    batch = pa.record_batch({"bytes": pa.array(list(files.values()), pa.binary())})
    with pytest.warns(RuntimeWarning, match="skipped 2"):
        out = DecodeImages(size=8, on_error="skip").transform_batch(batch)
    assert out.num_rows == 1
    report = ExecutionReport()
    DecodeImages(size=8, on_error="skip").transform_batch(batch, report=report, where="x.parquet")
    assert [s["where"] for s in report.skipped] == [
        "row 1 of the batch from x.parquet",
        "row 2 of the batch from x.parquet",
    ]
    assert "null" in report.skipped[1]["reason"]


def test_empty_batches_and_bad_arguments():
    empty = pa.record_batch({"path": pa.array([], pa.string()), "bytes": pa.array([], pa.binary())})
    out = DecodeImages(size=(4, 5), layout="CHW").transform_batch(empty)
    assert out.num_rows == 0 and out.schema.field("bytes").type.shape == [3, 4, 5]
    with pytest.raises(SchemaError, match="binary column"):
        DecodeImages(size=4).transform_batch(pa.record_batch({"bytes": [1, 2]}))
    for bad in (
        {"size": (0, 4)},
        {"mode": "CMYK"},
        {"layout": "WHC"},
        {"on_error": "ignore"},
        {"resize": "fit"},
        {"max_pixels": 0},
        {"resample": "cubic"},
    ):
        with pytest.raises(ConfigurationError):
            DecodeImages(**bad)


# ---------------------------------------------------------------- state, threads


def test_state_round_trip_and_manifest(folder, tmp_path):
    p = DecodeImages(
        "bytes",
        size=(20, 30),
        mode="L",
        resize="stretch",
        layout="CHW",
        on_error="skip",
        max_pixels=10**7,
        resample="lanczos",
        background=None,
    )
    again = from_state(p.state)
    assert isinstance(again, DecodeImages) and again.params() == p.params()
    files = {k: v for k, v in good_files().items() if k != "rgba.png"}
    assert np.array_equal(decoded(again, files), decoded(p, files))

    fl.read_images(folder / "good").transform(p).write(tmp_path / "out")
    saved = fl.open(tmp_path / "out").manifest.preprocessors
    assert from_state(saved[0]["state"]).params() == p.params()

    record = {"path": "rgb.png", "bytes": files["rgb.png"]}
    single = DecodeImages(size=(8, 8)).transform_record(record)
    batch = decoded(DecodeImages(size=(8, 8)), {"rgb.png": files["rgb.png"]})[0]
    assert np.array_equal(np.asarray(single["bytes"], np.uint8).reshape(8, 8, 3), batch)


def test_one_shared_pool():
    assert decode_pool() is decode_pool()
    files = {f"{i}.jpg": encode(photo(64, 48, i), "JPEG") for i in range(12)}
    out = decoded(DecodeImages(size=16), files)
    for i, data in enumerate(files.values()):
        assert np.array_equal(out[i], decoded(DecodeImages(size=16), {"x": data})[0])


# ---------------------------------------------------------------- Normalize


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_normalize_matches_numpy():
    x = np.random.default_rng(0).integers(0, 256, (4, 6, 5, 3), dtype=np.uint8)
    expect = (x / 255.0 - np.array(MEAN)) / np.array(STD)
    got = Normalize("image", MEAN, STD).apply(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expect, atol=1e-5)
    np.testing.assert_allclose(Normalize("i", MEAN, STD).apply(x[0]), expect[0], atol=1e-5)
    chw = Normalize("image", MEAN, STD, layout="CHW").apply(x.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(chw, expect.transpose(0, 3, 1, 2), atol=1e-5)
    np.testing.assert_allclose(
        Normalize("i", 0.5, 0.25).apply(x), (x / 255 - 0.5) / 0.25, atol=1e-5
    )
    with pytest.raises(SchemaError, match="layout"):
        Normalize("image", MEAN, STD, layout="CHW").apply(x)
    with pytest.raises(ConfigurationError):
        Normalize("image", MEAN, (0.2, 0.0, 0.2))


def test_normalize_as_a_pipeline_step_and_round_trip(folder):
    norm = Normalize("bytes", MEAN, STD, output="x")
    table = fl.read_images(folder / "good").transform(DecodeImages(size=12)).transform(norm)
    out = table.to_arrow()
    assert out.schema.field("x").type == pa.fixed_shape_tensor(pa.float32(), [12, 12, 3])
    pixels = out.column("bytes").combine_chunks().to_numpy_ndarray()
    np.testing.assert_allclose(
        out.column("x").combine_chunks().to_numpy_ndarray(),
        (pixels / 255.0 - np.array(MEAN)) / np.array(STD),
        atol=1e-5,
    )
    again = from_state(norm.state)
    assert isinstance(again, Normalize) and again.params() == norm.params()
    with pytest.raises(SchemaError, match="fixed-shape tensor"):
        norm.transform_batch(pa.record_batch({"bytes": [b"x"]}))


def test_normalize_torch_tensors_when_torch_is_installed():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).integers(0, 256, (2, 3, 4, 5), dtype=np.uint8)
    norm = Normalize("image", MEAN, STD, layout="CHW")
    got = norm.apply(torch.from_numpy(x))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), norm.apply(x), atol=1e-6)
