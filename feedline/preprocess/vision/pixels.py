"""Crop, resize and mirror decoded ``uint8`` images, a whole batch per NumPy call.

The geometry of :mod:`feedline.preprocess.vision.augment` is a :class:`~feedline.preprocess.
vision.ops.View` per image: a box on the picture, an output size, mirrored or not. For
encoded images Pillow decodes straight into it; for pixels already decoded (a ``uint8``
tensor column) :func:`resample` resizes every image's box at once with Pillow's own bilinear
filter: output pixel ``j`` is centred on ``x0 + (j + 0.5) * (x1 - x0) / width`` and weighs
the source pixels within ``max(1, scale)`` of it by a triangle, so a shrunk box is
antialiased as Pillow's ``resize(size, box=...)`` does (:func:`filter_taps` computes Pillow's
coefficients; the sums run in float32, where Pillow rounds through 8 bits in between: the
results differ by at most 1-2 levels). Mirrored columns read from the right; output pixels
centred outside the picture (a centre crop larger than the image) are zeros, as torchvision
pads.

The work is separable, rows then columns, and vectorized over the batch: per filter tap, one
gather of whole rows (a ``memcpy`` each) and one multiply-add over the batch, never a Python
loop over images or pixels; NumPy releases the GIL for each.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["filter_taps", "resample", "to_uint8"]


def filter_taps(
    lo: np.ndarray, hi: np.ndarray, count: int, limit: int, flip: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's bilinear resampling coefficients along one axis, for a batch of boxes.

    Output position ``j`` of image ``n`` (``count`` of them) samples ``[lo[n], hi[n])`` of an
    axis of ``limit`` pixels. Returns ``(index, weight)``, both ``(N, count, taps)``: the
    source pixels and their weights (each row sums to 1, or is all zeros when the position's
    centre is outside the picture). ``flip[n]`` reverses image ``n``'s positions.

    Examples
    --------
    >>> index, weight = filter_taps(np.array([0.0]), np.array([4.0]), 2, 4)  # 4 -> 2
    >>> index[0].tolist()
    [[0, 1, 2], [1, 2, 3]]
    >>> weight[0].astype(float).round(3).tolist()  # antialiased: 3 taps, not 2
    [[0.429, 0.429, 0.143], [0.143, 0.429, 0.429]]
    """
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    scale = (hi - lo) / count
    widen = np.maximum(scale, 1.0)  # Pillow's filterscale: antialias when shrinking
    support = widen  # the bilinear (triangle) filter's support is 1
    centre = lo[:, None] + (np.arange(count) + 0.5)[None, :] * scale[:, None]
    if flip is not None and flip.any():
        centre = np.where(flip[:, None], centre[:, ::-1], centre)
    first = np.trunc(centre - support[:, None] + 0.5).astype(np.int64)
    first = np.maximum(first, 0)
    last = np.minimum(np.trunc(centre + support[:, None] + 0.5).astype(np.int64), limit)
    # Pillow's window holds ceil(support) * 2 + 1 taps; only last - first can weigh anything
    taps = max(1, int((last - first).max(initial=1)))
    index = first[:, :, None] + np.arange(taps)[None, None, :]
    x = (index - centre[:, :, None] + 0.5) / widen[:, None, None]
    weight = np.maximum(0.0, 1.0 - np.abs(x))
    weight[index >= last[:, :, None]] = 0.0
    total = weight.sum(axis=2, keepdims=True)
    inside = (centre >= 0) & (centre < limit)
    weight = np.where(inside[:, :, None] & (total > 0), weight / np.where(total > 0, total, 1), 0)
    index = np.minimum(index, limit - 1)
    return index, weight.astype(np.float32)


def _gather_rows(images: np.ndarray, index: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``sum_k weight[..., k] * images[n, index[..., k]]``: ``(M, out, ...)`` float32."""
    rows = np.arange(len(images))[:, None]
    out: np.ndarray | None = None
    part = None
    for k in range(index.shape[2]):
        w = weight[:, :, k]
        if not w.any():
            continue
        picked = images[rows, index[:, :, k]]  # whole rows: one memcpy each
        w = w.reshape(*w.shape, *([1] * (picked.ndim - 2)))
        if out is None:
            out = np.multiply(picked, w, dtype=np.float32)
            continue
        part = np.multiply(picked, w, out=part, dtype=np.float32)
        out += part
    if out is None:  # every position outside the picture
        out = np.zeros((len(images), index.shape[1], *images.shape[2:]), np.float32)
    return out


def resample(
    images: np.ndarray,
    boxes: Sequence[Sequence[float]] | np.ndarray,
    size: tuple[int, int],
    flips: Sequence[bool] | np.ndarray | None = None,
    *,
    channels_first: bool = False,
) -> np.ndarray:
    """Every image's ``box`` resized to ``size``, mirrored where ``flips``: float32 pixels.

    Parameters
    ----------
    images:
        ``(N, H, W, C)`` ``uint8``, or ``(N, C, H, W)`` with ``channels_first=True`` (each
        channel is then resized as an image of its own: rows stay contiguous).
    boxes:
        ``(N, 4)``: ``(x0, y0, x1, y1)`` of each image, in pixels (edges: the whole image is
        ``(0, 0, W, H)``); may reach outside it (zeros there).
    size:
        The output ``(width, height)``, the same for every image.
    flips:
        ``(N,)`` booleans: mirror that image's output left-right.

    Returns
    -------
    ``(N, height, width, C)`` float32 on the 0..255 scale (channels last either way).

    Examples
    --------
    >>> image = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)
    >>> resample(image, [(1, 1, 3, 3)], (2, 2))[0, :, :, 0].tolist()  # a crop: exact
    [[5.0, 6.0], [9.0, 10.0]]
    >>> resample(image, [(1, 1, 3, 3)], (2, 2), flips=[True])[0, :, :, 0].tolist()
    [[6.0, 5.0], [10.0, 9.0]]
    """
    if channels_first:
        n, c, height, width = images.shape
        planes = images.reshape(n * c, height, width, 1)  # a view of contiguous channels
    else:
        n, height, width, c = images.shape
        planes = images
    box = np.asarray(boxes, dtype=np.float64).reshape(n, 4)
    flip = None if flips is None else np.asarray(flips, dtype=bool).reshape(n)
    w, h = int(size[0]), int(size[1])
    y_index, y_weight = filter_taps(box[:, 1], box[:, 3], h, height)
    x_index, x_weight = filter_taps(box[:, 0], box[:, 2], w, width, flip)
    if channels_first:  # the same taps for each channel of an image
        y_index, y_weight = np.repeat(y_index, c, 0), np.repeat(y_weight, c, 0)
        x_index, x_weight = np.repeat(x_index, c, 0), np.repeat(x_weight, c, 0)
    rows = _gather_rows(planes, y_index, y_weight)  # (M, h, W, D)
    columns = np.ascontiguousarray(rows.transpose(0, 2, 1, 3))  # (M, W, h, D): rows again
    out = _gather_rows(columns, x_index, x_weight)  # (M, w, h, D)
    if channels_first:
        return out.reshape(n, c, w, h).transpose(0, 3, 2, 1)
    return out.transpose(0, 2, 1, 3)


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """Float pixels (0..255) rounded to ``uint8``.

    Examples
    --------
    >>> to_uint8(np.array([0.4, 254.6, 300.0], np.float32)).tolist()
    [0, 255, 255]
    """
    out = np.rint(pixels)
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)
