"""Load-time image augmentation (``preprocess/vision/augment.py``): torchvision's sampling
semantics, JPEG draft decoding (exact geometry, close pixels), EXIF orientation, bad images,
outputs."""

from __future__ import annotations

import functools
import importlib.resources
import io
import math
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from feedline.errors import ConfigurationError, DataError
from feedline.loader.order.rng import sample_rng, sample_rngs
from feedline.loader.order.sample_order import epoch_permutation
from feedline.preprocess.vision.augment import Compose, Skipped
from feedline.preprocess.vision.decode import decode, draft_scale, open_image, render
from feedline.preprocess.vision.ops import (
    CenterCrop,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToArray,
    View,
)

Image = pytest.importorskip("PIL.Image")

STORED = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
          4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
          6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
          8: Image.Transpose.ROTATE_270}  # how a camera stores an upright picture  # fmt: skip


def encode(im, fmt: str = "JPEG", **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


@functools.cache
def china() -> bytes:
    """A real photo (scikit-learn's china.jpg, 640x427), as shipped."""
    pytest.importorskip("sklearn")
    return importlib.resources.files("sklearn.datasets.images").joinpath("china.jpg").read_bytes()


@functools.cache
def big_photo() -> bytes:
    """The same photo at 1280x854, JPEG quality 90: large enough for 1/2 and 1/4 drafts."""
    return encode(Image.open(io.BytesIO(china())).resize((1280, 854)), quality=90)


def marked(w: int, h: int):
    """Asymmetric: red top-left quadrant, green bar top right, blue stripe bottom left."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 6, w // 2 :] = (0, 255, 0)
    a[h // 2 :, : w // 8] = (0, 0, 255)
    return Image.fromarray(a)


def reference_params(width, height, scale, ratio, rng):
    """torchvision.transforms.RandomResizedCrop.get_params, transcribed with ``torch.empty(1)
    .uniform_`` -> ``rng.uniform`` and ``torch.randint`` -> ``rng.integers``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))  # noqa: RUF046 - as written
        h = int(round(math.sqrt(target_area / aspect_ratio)))  # noqa: RUF046
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))  # noqa: RUF046
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))  # noqa: RUF046
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


# ---------------------------------------------------------------- geometry (no pixels)


@pytest.mark.parametrize("size", [(500, 400), (640, 427), (37, 29), (1000, 100), (90, 800)])
@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.6), (1.0, 2.0))])
def test_random_resized_crop_is_torchvisions_sampling_over_many_seeds(size, scale, ratio):
    op, (W, H) = RandomResizedCrop(224, scale=scale, ratio=ratio), size
    fallback = reference_params(W, H, scale, ratio, _Never())
    fell_back = 0
    for seed in range(600):
        got = op.params(W, H, np.random.default_rng(seed))
        assert got == reference_params(W, H, scale, ratio, np.random.default_rng(seed))
        top, left, h, w = got
        assert 0 <= top <= H - h and 0 <= left <= W - w and h > 0 and w > 0
        if got == fallback:
            fell_back += 1
            continue
        # rounding each side by at most 1/2 pixel moves area and aspect by that much only
        assert scale[0] * W * H - (w + h) <= w * h <= scale[1] * W * H + (w + h)
        assert ratio[0] - 1 / h - 1e-9 <= w / h * (1 - 0.5 / w) and (
            w / h * (1 - 0.5 / h) <= ratio[1] * (1 + 1 / w) + 1e-9
        )
    if size in ((1000, 100), (90, 800)) and scale == (0.5, 0.6):
        assert fell_back > 300  # half the picture cannot have a 1..2 aspect: the fallback


class _Never:
    """A generator whose draws always fail the attempts: the fallback crop."""

    def uniform(self, lo, hi):
        return hi * 1e6 if lo > 0 else hi

    def integers(self, lo, hi):  # pragma: no cover - never reached
        raise AssertionError


def test_fallback_is_the_largest_center_crop_within_the_ratio():
    op = RandomResizedCrop(224)
    assert op.params(1000, 100, _Never()) == (0, 433, 100, 133)  # w = round(100 * 4/3)
    assert op.params(100, 1000, _Never()) == (433, 0, 133, 100)
    assert op.params(500, 400, _Never()) == (0, 0, 400, 500)  # within bounds: everything


def test_resize_and_center_crop_follow_torchvision_rounding():
    assert Resize(256).plan(View.of(500, 375)).size == (341, 256)  # int(256 * 500 / 375)
    assert Resize(256).plan(View.of(375, 500)).size == (256, 341)
    assert Resize((100, 50)).plan(View.of(375, 500)).size == (50, 100)  # (h, w) -> (w, h)
    view = CenterCrop(224).plan(Resize(256).plan(View.of(500, 375)))
    s = 500 / 341
    assert view.size == (224, 224)
    assert view.box == pytest.approx((58 * s, 16 * 375 / 256, 282 * s, 240 * 375 / 256))
    odd = CenterCrop((10, 50)).plan(View.of(101, 20))  # round(25.5) = 26, round(5.0) = 5
    assert odd.box == (26.0, 5.0, 76.0, 15.0)
    padded = CenterCrop(300).plan(View.of(200, 100))  # pad (300-200)//2 left, 100 on top
    assert padded.box == (-50.0, -100.0, 250.0, 200.0)


def test_a_crop_of_a_flipped_view_is_mirrored_back_onto_the_picture():
    flipped = RandomHorizontalFlip(p=1.0).plan(View.of(101, 20), np.random.default_rng(0))
    assert flipped.flip
    crop = CenterCrop((10, 50)).plan(flipped)  # columns 26..76 of the mirror = 25..75 here
    assert crop.box == (25.0, 5.0, 75.0, 15.0) and crop.flip


def test_plan_draws_in_op_order_and_is_pure():
    c = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    views = [c.plan((500, 400), sample_rng(0, 0, i)) for i in range(50)]
    assert views == [c.plan((500, 400), sample_rng(0, 0, i)) for i in range(50)]
    assert 10 < sum(v.flip for v in views) < 40
    rng = sample_rng(0, 0, 7)
    op = RandomResizedCrop(224)
    top, left, h, w = op.params(500, 400, rng)
    flip = rng.random() < 0.5
    view = c.plan((500, 400), sample_rng(0, 0, 7))
    assert view.box == (left, top, left + w, top + h) and view.flip == flip


# ---------------------------------------------------------------- JPEG draft


def test_draft_scale_keeps_at_least_the_output_size():
    assert draft_scale((448, 448), (224, 224)) == 2
    assert draft_scale((447.9, 448), (224, 224)) == 1  # 1/2 would give 223.95 < 224
    assert draft_scale((448, 447), (224, 224)) == 1
    assert draft_scale((896, 900), (224, 224)) == 4
    assert draft_scale((5000, 1800), (224, 224)) == 8  # never below 1/8
    assert draft_scale((1792, 1791), (224, 224)) == 4
    assert draft_scale((100, 100), (224, 224)) == 1  # upsampling: full size


@pytest.mark.parametrize("w,h,out,scale", [(448, 448, 224, 2), (447, 448, 224, 1),
                                           (448, 447.5, 224, 1), (800, 800, 200, 4),
                                           (799, 800, 200, 2), (1000, 800, 100, 8),
                                           (1000, 799, 100, 4)])  # fmt: skip
def test_render_decodes_at_the_draft_scale_and_still_covers_the_output(w, h, out, scale):
    im, orientation = open_image(big_photo())  # 1280 x 854
    box = (100.0, 50.0, 100.0 + w, 50.0 + h)
    picture, got = render(im, orientation, box, (out, out))
    assert got == scale and picture.size == (out, out)
    assert im.size == (-(-1280 // scale), -(-854 // scale))  # libjpeg decoded at 1/scale
    assert w / got >= out and h / got >= out


def test_draft_changes_no_geometry_and_little_pixels():
    data, steps = big_photo(), [RandomResizedCrop(224, scale=(0.3, 1.0)), RandomHorizontalFlip()]
    fast, full = Compose([*steps, ToArray("HWC")]), Compose([*steps, ToArray("HWC")], draft=False)
    scales, errors = [], []
    for i in range(24):
        view = fast.plan((1280, 854), sample_rng(3, 0, i))
        assert view == full.plan((1280, 854), sample_rng(3, 0, i))
        im, orientation = open_image(data)
        scales.append(render(im, orientation, view.box, view.size)[1])
        a, b = fast(data, sample_rng(3, 0, i)), full(data, sample_rng(3, 0, i))
        errors.append(np.abs(a.astype(int) - b).mean())
    assert {2}.issubset(scales)  # the draft was used (most crops of 1280x854 allow 1/2)
    assert max(errors) < 3.0 and np.mean(errors) < 1.5, errors


def test_decode_with_draft_size_covers_it_and_is_upright():
    data = encode(Image.new("RGB", (640, 480), (0, 128, 255)))
    assert decode(data).size == (640, 480)
    assert decode(data, draft_size=(320, 240)).size == (320, 240)
    assert decode(data, draft_size=(321, 240)).size == (640, 480)  # 1/2 would not cover it
    assert decode(data, draft_size=(80, 60)).size == (80, 60)
    exif = Image.Exif()
    exif[0x0112] = 6
    turned = encode(marked(120, 80).transpose(STORED[6]), exif=exif, quality=100)
    out = np.asarray(decode(turned, draft_size=(60, 40)))
    assert out.shape == (40, 60, 3) and out[:15, :25, 0].min() > 200  # red top left, upright
    with pytest.raises(DataError, match="Fix:"):
        decode(b"not an image")


# ---------------------------------------------------------------- pixels


def test_eval_pipeline_matches_pillow_resize_then_center_crop():
    data = encode(Image.open(io.BytesIO(china())), "PNG")  # lossless: no draft involved
    got = Compose([Resize(256), CenterCrop(224), ToArray("HWC")])(data)
    resized = Image.open(io.BytesIO(data)).resize((383, 256), Image.Resampling.BILINEAR)
    want = np.asarray(resized.crop((80, 16, 304, 240)))  # round(159 / 2) = 80 (half to even)
    assert got.shape == (224, 224, 3)
    assert np.abs(got.astype(int) - want).max() <= 1


def test_random_resized_crop_matches_pillow_crop_then_resize():
    data = china()
    photo = Image.open(io.BytesIO(data))
    c = Compose([RandomResizedCrop(224), ToArray("HWC")], draft=False)
    for i in range(8):
        top, left, h, w = RandomResizedCrop(224).params(640, 427, sample_rng(0, 1, i))
        want = np.asarray(
            photo.crop((left, top, left + w, top + h)).resize((224, 224), Image.Resampling.BILINEAR)
        )
        got = c(data, sample_rng(0, 1, i))
        error = np.abs(got.astype(int) - want)
        assert error[2:-2, 2:-2].max() <= 1 and error.mean() < 0.2  # edges: filter support


def test_flip_mirrors_and_composes_with_crops_exactly():
    picture = marked(101, 20)
    data = encode(picture, "PNG")
    out = Compose([RandomHorizontalFlip(p=1.0), CenterCrop((10, 50)), ToArray("HWC")])(
        data, np.random.default_rng(0)
    )
    mirrored = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    assert np.array_equal(out, np.asarray(mirrored.crop((26, 5, 76, 15))))
    same = Compose([RandomHorizontalFlip(p=0.0), ToArray("HWC")])(data, np.random.default_rng(0))
    assert np.array_equal(same, np.asarray(picture))


def test_center_crop_larger_than_the_image_pads_with_zeros():
    out = Compose([CenterCrop(300), ToArray("HWC")])(
        encode(Image.new("RGB", (200, 100), (255, 0, 0)), "PNG")
    )
    assert out.shape == (300, 300, 3)
    assert (out[100:200, 50:250] == (255, 0, 0)).all()
    assert out[:100].max() == 0 and out[200:].max() == 0 and out[:, :50].max() == 0


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_applied_before_the_geometry(orientation):
    upright = marked(640, 420)
    exif = Image.Exif()
    exif[0x0112] = orientation
    taken = encode(upright.transpose(STORED[orientation]), exif=exif, quality=100, subsampling=0)
    plain = encode(upright, quality=100, subsampling=0)
    for steps in (
        [RandomResizedCrop(96), RandomHorizontalFlip()],
        [Resize(100), CenterCrop(96)],
        [RandomResizedCrop((40, 60), scale=(0.9, 1.0))],
    ):  # 1/4 and 1/8 drafts
        c = Compose([*steps, ToArray("HWC")])
        for i in range(4):
            got, want = c(taken, sample_rng(0, 0, i)), c(plain, sample_rng(0, 0, i))
            assert np.abs(got.astype(int) - want).mean() < 1.5, (orientation, steps, i)


def test_odd_modes_become_the_requested_mode():
    rgba = Image.new("RGBA", (80, 80), (255, 0, 0, 255))
    rgba.paste((0, 0, 255, 0), (40, 0, 80, 80))  # right half transparent
    c = Compose([ToArray("HWC")])
    out = c(encode(rgba, "PNG"))
    assert out.shape == (80, 80, 3) and (out[:, :40] == (255, 0, 0)).all()
    assert (out[:, 40:] == 255).all()  # composited onto white
    assert (Compose([ToArray("HWC")], background=None)(encode(rgba, "PNG"))[:, 40:] ==
            (0, 0, 255)).all()  # alpha dropped  # fmt: skip
    grey = c(encode(Image.new("L", (64, 48), 77), quality=95))
    assert grey.shape == (48, 64, 3) and (np.abs(grey.astype(int) - 77) <= 1).all()
    cmyk = c(encode(Image.new("CMYK", (50, 40), (0, 255, 255, 0)), quality=95))
    assert cmyk.shape == (40, 50, 3) and (np.abs(cmyk.astype(int) - (255, 0, 0)) <= 3).all()
    as_l = Compose([CenterCrop(32), ToArray()], mode="L")(china())
    assert as_l.shape == (1, 32, 32) and as_l.dtype == np.uint8


# ---------------------------------------------------------------- outputs


def test_output_dtypes_shapes_and_normalization():
    data, rng = china(), sample_rng(0, 0, 0)
    hwc = Compose([RandomResizedCrop(224), ToArray("HWC")])(data, sample_rng(0, 0, 0))
    chw = Compose([RandomResizedCrop(224), ToArray()])(data, sample_rng(0, 0, 0))
    assert hwc.shape == (224, 224, 3) and chw.shape == (3, 224, 224)
    assert hwc.dtype == chw.dtype == np.uint8 and chw.flags.c_contiguous and chw.flags.writeable
    assert np.array_equal(chw, hwc.transpose(2, 0, 1))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    norm = Compose([RandomResizedCrop(224), Normalize(mean, std)])(data, rng)
    want = (hwc.transpose(2, 0, 1) / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[
        :, None, None]  # fmt: skip
    assert norm.dtype == np.float32 and norm.shape == (3, 224, 224)
    np.testing.assert_allclose(norm, want, atol=1e-5)
    norm_hwc = Compose([RandomResizedCrop(224), Normalize(mean, std, layout="HWC")])(
        data, sample_rng(0, 0, 0)
    )
    assert norm_hwc.shape == (224, 224, 3) and np.array_equal(norm_hwc, norm.transpose(1, 2, 0))


def test_dict_samples_keep_their_other_fields():
    sample = {"bytes": china(), "label": 4, "path": "china.jpg"}
    out = Compose([CenterCrop(64)], output="pixels")(sample)
    assert (
        out["label"] == 4 and out["bytes"] is sample["bytes"] and out["pixels"].shape == (3, 64, 64)
    )
    assert set(sample) == {"bytes", "label", "path"}  # the input is not modified


def test_output_shape_is_known_when_fixed():
    assert Compose([RandomResizedCrop(224), RandomHorizontalFlip()]).output_shape() == (3, 224, 224)
    assert Compose([Resize(256), CenterCrop((200, 100)), Normalize(layout="HWC")]).output_shape(
        ) == (200, 100, 3)  # fmt: skip
    assert Compose([Resize(256)]).output_shape() is None  # depends on each image's aspect
    assert Compose([Resize(256)]).output_shape((500, 250)) == (3, 256, 512)
    assert Compose([CenterCrop(10)], mode="L").output_shape() == (1, 10, 10)


# ---------------------------------------------------------------- determinism


def test_same_seed_epoch_index_same_sample_other_epochs_differ():
    c = Compose([RandomResizedCrop(96), RandomHorizontalFlip(), ToArray()])
    data = china()
    first = [c(data, sample_rng(5, 0, i)) for i in range(6)]
    again = [c(data, sample_rng(5, 0, i)) for i in range(6)]
    other = [c(data, sample_rng(5, 1, i)) for i in range(6)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_threads_in_any_order_and_pickled_copies_give_the_serial_result():
    c = Compose([RandomResizedCrop(64), RandomHorizontalFlip(), Normalize()])
    data, order = china(), [9, 3, 7, 0, 5, 1]
    serial = {i: c(data, sample_rng(1, 2, i)) for i in order}
    copy = pickle.loads(pickle.dumps(c))  # what a process worker receives
    with ThreadPoolExecutor(2) as pool:
        threaded = dict(zip(order[::-1], pool.map(lambda i: copy(data, sample_rng(1, 2, i)),
                                                  order[::-1]), strict=True))  # fmt: skip
    assert all(np.array_equal(serial[i], threaded[i]) for i in order)


def test_a_resumed_epoch_reproduces_the_same_augmented_samples():
    c, data = Compose([RandomResizedCrop(48), RandomHorizontalFlip(), ToArray()]), china()
    order = epoch_permutation(40, seed=11, epoch=2)[:24]  # the loader's order, batches of 4
    batches = [order[k : k + 4] for k in range(0, 24, 4)]

    def run(fn, part):
        return [np.stack([fn(data, sample_rng(11, 2, int(i))) for i in b]) for b in part]

    whole = run(c, batches)
    resumed = run(pickle.loads(pickle.dumps(c)), batches[3:])  # a new process, from batch 3
    assert all(np.array_equal(a, b) for a, b in zip(whole[3:], resumed, strict=True))
    assert not np.array_equal(whole[0], run(c, [order[4:8]])[0])  # other samples differ


# ---------------------------------------------------------------- bad images


@functools.cache
def bad_values() -> dict[str, object]:
    good = encode(Image.open(io.BytesIO(china())))
    return {
        "truncated.jpg": good[: len(good) // 2],
        "random.bin": np.random.default_rng(0).bytes(4000),
        "empty.jpg": b"",
        "null": None,
        "header-only.jpg": good[:600],
    }


@pytest.mark.parametrize("name", sorted(bad_values()))
def test_raise_names_the_sample_index_and_path(name):
    c = Compose([RandomResizedCrop(64)])
    sample = {"bytes": bad_values()[name], "path": f"imgs/{name}", "label": 0}
    with pytest.raises(DataError, match=rf"sample 17 \(imgs/{name}\).*'bytes'.*Fix:"):
        c(sample, sample_rng(0, 0, 17), index=17)
    with pytest.raises(DataError, match=r"sample 3, .*Fix:"):
        Compose([CenterCrop(8)], path_key=None)(sample, index=3)


@pytest.mark.parametrize("name", sorted(bad_values()))
def test_skip_returns_a_marker_with_the_reason(name):
    c = Compose([RandomResizedCrop(64), Normalize()], on_error="skip")
    out = c({"bytes": bad_values()[name], "path": name}, sample_rng(0, 0, 4), index=4)
    assert isinstance(out, Skipped) and out.index == 4 and out.path == name and out.reason
    assert name in str(out) and "sample 4" in str(out)
    assert isinstance(c(bad_values()[name], sample_rng(0, 0, 4)), Skipped)  # bare bytes too


def test_batch_stacks_the_kept_samples_and_lists_the_skipped():
    good, bad = china(), bad_values()["truncated.jpg"]
    c = Compose([RandomResizedCrop(32), RandomHorizontalFlip()], on_error="skip")
    indices = [40, 41, 42, 43]
    samples = [{"bytes": b, "path": f"p{i}"} for b, i in zip((good, bad, good, bad), indices,
                                                             strict=True)]  # fmt: skip
    images, kept, skipped = c.batch(samples, sample_rngs(0, 3, indices), indices=indices)
    assert images.shape == (2, 3, 32, 32) and images.dtype == np.uint8
    assert kept.tolist() == [0, 2] and [(s.index, s.path) for s in skipped] == [
        (41, "p41"),
        (43, "p43"),
    ]
    for row, i in zip(images, (40, 42), strict=True):  # the same as one at a time
        assert np.array_equal(row, c(good, sample_rng(0, 3, i)))
    empty, kept, skipped = Compose([CenterCrop(8), Normalize()], on_error="skip").batch([bad])
    assert empty.shape == (0, 3, 8, 8) and empty.dtype == np.float32 and len(skipped) == 1
    with pytest.raises(DataError, match="sample 41 \\(p41\\)"):
        Compose([RandomResizedCrop(32)]).batch(samples, sample_rngs(0, 3, indices),
                                               indices=indices)  # fmt: skip
    small = encode(Image.new("RGB", (40, 30)), "PNG")
    with pytest.raises(ConfigurationError, match="Fix:"):
        Compose([Resize(16)]).batch([small, good])  # different aspects: different shapes


def test_too_large_images_are_refused_before_decoding():
    c = Compose([CenterCrop(8)], max_pixels=1000, on_error="skip")
    out = c(encode(Image.new("RGB", (50, 40))), index=1)
    assert isinstance(out, Skipped) and "too large" in out.reason


def test_bad_arguments_say_how_to_fix():
    for make in (
        lambda: Compose([ToArray(), CenterCrop(8)]),  # output step not last
        lambda: Compose([CenterCrop(8)], on_error="ignore"),
        lambda: Compose([Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))], mode="L"),
        lambda: RandomResizedCrop(0),
        lambda: RandomResizedCrop(8, scale=(0.9, 0.1)),
        lambda: RandomHorizontalFlip(p=2),
        lambda: Normalize(std=(0.0, 1.0, 1.0)),
        lambda: Compose([RandomResizedCrop(8)])(china()),  # random steps, no rng
        lambda: Compose([CenterCrop(8)], key="image")({"bytes": china()}),
    ):
        with pytest.raises(ConfigurationError, match="Fix:"):
            make()
