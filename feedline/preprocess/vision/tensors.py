"""Load-time augmentation of images already decoded: ``uint8`` pixels, a batch at a time.

A :class:`~feedline.preprocess.vision.augment.Compose` plans each image's geometry from its
size and the sample's generator exactly as for encoded bytes (the same crop box and flip for
the same ``(seed, epoch, index)``), then :func:`augment_pixels` resizes every box of the
batch with a few NumPy calls (:func:`feedline.preprocess.vision.pixels.resample`: Pillow's
bilinear filter, antialiased when shrinking) and finishes them together
(:class:`~feedline.preprocess.vision.ops.Normalize` to float32, or ``uint8``; ``CHW`` or
``HWC``).

Images come as ``uint8`` arrays ``(C, H, W)``, ``(H, W, C)`` or ``(H, W)`` (one channel):
a fixed-shape tensor column gives the batch as one ``(N, ...)`` array, a list column a list
of arrays (several sizes are fine). :func:`pixel_layout` tells ``CHW`` from ``HWC`` by the
channel count of the mode (``"RGB"``: 3), or takes it as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.preprocess.vision.ops import Normalize, View
from feedline.preprocess.vision.pixels import resample, to_uint8

if TYPE_CHECKING:
    from feedline.preprocess.vision.augment import Compose

__all__ = ["PIXEL_LAYOUTS", "augment_pixels", "is_pixels", "pixel_layout"]

#: how decoded pixels may be laid out (``"auto"``: told by the channel count)
PIXEL_LAYOUTS = ("auto", "CHW", "HWC")
_CHANNELS = {"RGB": 3, "L": 1, "RGBA": 4}


def is_pixels(value: Any) -> bool:
    """Whether ``value`` is decoded pixels (an array of 2 or 3 dimensions, or a nested list),
    not encoded bytes (bytes, or a 1-D ``uint8`` array of them).

    Examples
    --------
    >>> is_pixels(np.zeros((3, 8, 8), np.uint8)), is_pixels(b"\\xff\\xd8"), is_pixels(None)
    (True, False, False)
    """
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "O" and value.ndim >= 2
    return isinstance(value, list) and bool(value) and isinstance(value[0], list | np.ndarray)


def pixel_layout(shape: tuple[int, ...], mode: str, given: str, column: str) -> str:
    """``"CHW"``, ``"HWC"`` or ``"HW"`` for one image of ``shape`` in ``mode``.

    Examples
    --------
    >>> pixel_layout((3, 32, 40), "RGB", "auto", "image"), pixel_layout((32, 40, 3), "RGB",
    ...                                                                  "auto", "image")
    ('CHW', 'HWC')
    """
    channels = _CHANNELS[mode]
    if len(shape) == 2 and channels == 1:
        return "HW"
    if len(shape) == 3:
        if given != "auto":
            c = shape[0] if given == "CHW" else shape[2]
            if c == channels:
                return given
        else:
            first, last = shape[0] == channels, shape[2] == channels
            if first != last:
                return "CHW" if first else "HWC"
            if first:
                raise ConfigurationError(
                    f"ImageTransform: the pixels of column {column!r} have shape {shape}: "
                    f"channels first or last? Both hold {channels}. Fix: pass "
                    "input_layout='CHW' or 'HWC'."
                )
    raise ConfigurationError(
        f"ImageTransform: the pixels of column {column!r} have shape {shape}, which is not "
        f"{channels}-channel {mode} pixels (input_layout={given!r}). Fix: pass the mode of "
        "the pixels (mode='RGB' 3 channels, 'L' 1 or (H, W), 'RGBA' 4) and input_layout='CHW' "
        "or 'HWC'."
    )


def _hwc(images: np.ndarray, layout: str) -> np.ndarray:
    """``(N, H, W, C)`` view of a batch of images in ``layout``."""
    if layout == "CHW":
        return images.transpose(0, 2, 3, 1)
    if layout == "HW":
        return images[..., None]
    return images


def _finish(pixels: np.ndarray, finish: Any) -> np.ndarray:
    """float32 ``(N, h, w, C)`` pixels turned into the output step's dtype and layout."""
    chw = finish.layout == "CHW"
    if isinstance(finish, Normalize):
        scale, offset = finish._scale, finish._offset
        if chw:
            out = np.empty((pixels.shape[0], pixels.shape[3], *pixels.shape[1:3]), np.float32)
            np.multiply(pixels.transpose(0, 3, 1, 2), scale[:, None, None], out=out)
            out += offset[:, None, None]
            return out
        pixels *= scale
        pixels += offset
        return pixels
    out = to_uint8(pixels)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2)) if chw else out


def augment_pixels(
    compose: Compose,
    images: np.ndarray | Sequence[Any],
    rngs: Sequence[np.random.Generator | None],
    *,
    layout: str = "auto",
    column: str = "image",
) -> np.ndarray:
    """Crop, flip and finish a batch of decoded images: ``(N, *output_shape)``.

    ``images`` is one ``(N, ...)`` ``uint8`` array (vectorized over the batch) or a sequence
    of per-image arrays (possibly of several sizes: each size is one vectorized group);
    ``rngs`` one generator per image (the sample's, as for encoded bytes). Raises
    :class:`~feedline.errors.ConfigurationError` for pixels that are not ``uint8`` or not
    of the mode's channels, and when the geometry gives images of several sizes.

    Examples
    --------
    >>> from feedline.preprocess.vision.augment import Compose
    >>> from feedline.preprocess.vision.ops import CenterCrop, RandomHorizontalFlip
    >>> images = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4)
    >>> crop = Compose([CenterCrop(2)])
    >>> augment_pixels(crop, images, [None, None]).shape
    (2, 3, 2, 2)
    >>> bool((augment_pixels(crop, images, [None, None]) == images[:, :, 1:3, 1:3]).all())
    True
    """
    if isinstance(images, np.ndarray) and images.dtype.kind != "O":
        groups = [(np.arange(len(images)), images)]
    else:
        arrays = [np.asarray(image) for image in images]
        shapes: dict[tuple[int, ...], list[int]] = {}
        for i, image in enumerate(arrays):
            shapes.setdefault((image.shape, image.dtype.str), []).append(i)  # type: ignore[arg-type]
        groups = [(np.array(at), np.stack([arrays[i] for i in at])) for at in shapes.values()]
    out: np.ndarray | None = None
    for at, batch in groups:
        done = _augment_group(compose, batch, [rngs[int(i)] for i in at], layout, column)
        if out is None:
            if len(groups) == 1:
                return done
            out = np.empty((len(rngs), *done.shape[1:]), done.dtype)
        if done.shape[1:] != out.shape[1:]:
            raise ConfigurationError(
                f"ImageTransform: the images of column {column!r} come out in several shapes "
                f"({out.shape[1:]} and {done.shape[1:]}). Fix: end the geometry with a fixed "
                "size (RandomResizedCrop, CenterCrop)."
            )
        out[at] = done
    assert out is not None or not len(rngs)
    return out if out is not None else np.empty((0,), np.uint8)


def _augment_group(
    compose: Compose, images: np.ndarray, rngs: Sequence[np.random.Generator | None],
    layout: str, column: str,
) -> np.ndarray:  # fmt: skip
    if images.dtype != np.uint8:
        raise ConfigurationError(
            f"ImageTransform: column {column!r} holds {images.dtype} values; it augments "
            "uint8 pixels (0..255) or decodes encoded image bytes. Fix: store the pixels as "
            "uint8 (e.g. fl.DecodeImages), or convert them before the loader."
        )
    given = pixel_layout(images.shape[1:], compose.mode, layout, column)
    hwc = _hwc(images, given)
    n, height, width, _ = hwc.shape
    views: list[View] = [compose.plan((width, height), rng) for rng in rngs]
    sizes = {v.size for v in views}
    if len(sizes) > 1:
        raise ConfigurationError(
            f"ImageTransform: the geometry gives images of several sizes {sorted(sizes)[:3]} "
            f"for column {column!r}. Fix: end it with a fixed size (RandomResizedCrop, "
            "CenterCrop)."
        )
    if not n:
        shape = compose.output_shape((width, height)) or (0,)
        dtype = np.float32 if isinstance(compose.finish, Normalize) else np.uint8
        return np.empty((0, *shape), dtype)
    boxes, flips = [v.box for v in views], [v.flip for v in views]
    if given == "CHW":  # channel planes keep their rows contiguous
        pixels = resample(images, boxes, views[0].size, flips, channels_first=True)
    else:
        pixels = resample(hwc, boxes, views[0].size, flips)
    return _finish(pixels, compose.finish)
