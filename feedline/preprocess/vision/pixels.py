"""Crop, resize and mirror decoded ``uint8`` images, a whole batch per NumPy call.

The geometry of :mod:`feedline.preprocess.vision.augment` is a :class:`~feedline.preprocess.
vision.ops.View` per image: a box on the picture, an output size, mirrored or not. For
encoded images Pillow decodes straight into it; for pixels already decoded (a ``uint8``
tensor column) :func:`resample` samples every image's box at once: bilinear interpolation
on the same grid Pillow's ``resize(size, box=...)`` uses (output pixel ``j`` samples the
box at ``x0 + (j + 0.5) * (x1 - x0) / width``, in pixel centres), mirrored columns read from
the right, and zeros outside the picture (a centre crop larger than the image, as
torchvision pads). Unlike Pillow it does not antialias: a box shrunk by more than 2x
aliases (as ``torch.nn.functional.interpolate(..., antialias=False)``); a crop whose box
falls on whole pixels without resizing copies them exactly.

The work is a few NumPy calls per batch, whatever the batch size (the gathers and the
arithmetic release the GIL), never a Python loop over pixels or images.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["resample", "to_uint8"]


def _axis(
    lo: np.ndarray, hi: np.ndarray, count: int, limit: int, flip: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Per image, the two source indices, the weight of the second and (if any pixel falls
    outside the picture) the inside mask of ``count`` output positions along one axis."""
    step = (hi - lo) / count
    at = lo[:, None] + (np.arange(count) + 0.5)[None, :] * step[:, None] - 0.5
    if flip is not None and flip.any():
        at = np.where(flip[:, None], at[:, ::-1], at)
    inside = (at >= -0.5) & (at <= limit - 0.5)
    at = np.clip(at, 0, limit - 1)
    first = np.floor(at).astype(np.intp)
    second = np.minimum(first + 1, limit - 1)
    weight = (at - first).astype(np.float32)
    return first, second, weight, None if inside.all() else inside


def resample(
    images: np.ndarray,
    boxes: Sequence[Sequence[float]] | np.ndarray,
    size: tuple[int, int],
    flips: Sequence[bool] | np.ndarray | None = None,
) -> np.ndarray:
    """Every image's ``box`` resized to ``size``, mirrored where ``flips``: float32 pixels.

    Parameters
    ----------
    images:
        ``(N, H, W, C)`` ``uint8`` (any strides: a transposed ``(N, C, H, W)`` view works).
    boxes:
        ``(N, 4)``: ``(x0, y0, x1, y1)`` of each image, in pixels (edges: the whole image is
        ``(0, 0, W, H)``); may reach outside it (zeros there).
    size:
        The output ``(width, height)``, the same for every image.
    flips:
        ``(N,)`` booleans: mirror that image's output left-right.

    Returns
    -------
    ``(N, height, width, C)`` float32 on the 0..255 scale.

    Examples
    --------
    >>> image = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)
    >>> resample(image, [(1, 1, 3, 3)], (2, 2))[0, :, :, 0].tolist()  # a crop: exact
    [[5.0, 6.0], [9.0, 10.0]]
    >>> resample(image, [(0, 0, 4, 4)], (2, 2), flips=[True])[0, :, :, 0].tolist()
    [[4.5, 2.5], [12.5, 10.5]]
    """
    n, height, width, _ = images.shape
    box = np.asarray(boxes, dtype=np.float64).reshape(n, 4)
    flip = None if flips is None else np.asarray(flips, dtype=bool).reshape(n)
    w, h = int(size[0]), int(size[1])
    y0, y1, wy, inside_y = _axis(box[:, 1], box[:, 3], h, height, None)
    x0, x1, wx, inside_x = _axis(box[:, 0], box[:, 2], w, width, flip)
    rows = np.arange(n)[:, None]
    cols = rows[:, :, None]
    # columns first, on the rows needed: (N, h, w, C); the GIL is released while NumPy copies
    top = images[rows[:, :, None], y0[:, :, None], x0[:, None, :]].astype(np.float32)
    if wx.any():
        right = images[cols, y0[:, :, None], x1[:, None, :]]
        top += (right - top) * wx[:, None, :, None]
    if wy.any():
        bottom = images[cols, y1[:, :, None], x0[:, None, :]].astype(np.float32)
        if wx.any():
            corner = images[cols, y1[:, :, None], x1[:, None, :]]
            bottom += (corner - bottom) * wx[:, None, :, None]
        top += (bottom - top) * wy[:, :, None, None]
    if inside_y is not None or inside_x is not None:  # outside the picture: zeros
        mask = np.ones((n, h, w), dtype=bool)
        if inside_y is not None:
            mask &= inside_y[:, :, None]
        if inside_x is not None:
            mask &= inside_x[:, None, :]
        top *= mask[..., None]
    return top


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """Float pixels (0..255) rounded to ``uint8``, in place of a copy where possible.

    Examples
    --------
    >>> to_uint8(np.array([0.4, 254.6, 300.0], np.float32)).tolist()
    [0, 255, 255]
    """
    out = np.rint(pixels, out=pixels) if pixels.flags.writeable else np.rint(pixels)
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)
