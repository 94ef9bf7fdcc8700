"""Decode one encoded image (JPEG, PNG, ...) with Pillow, straight to the region it needs.

The load-time augmentation pipeline (:mod:`feedline.preprocess.vision.augment`) plans its geometry
first, on the picture as displayed (EXIF orientation applied), from the header alone; then
:func:`render` decodes once:

1. **Orientation**: the box is mapped back into the stored (unrotated) pixels and the small
   output is turned at the end, so a sideways photo costs no full-size rotation.
2. **Draft**: a JPEG is decoded at 1/2, 1/4 or 1/8 scale by libjpeg's DCT scaling when the
   region still has at least the output's size in both directions at that scale
   (:func:`draft_scale`); the box is divided by the scale. The geometry does not change.
3. **Resample**: one Pillow ``resize(size, box=...)`` (antialiased; as torchvision's crop
   then resize, which samples the same grid). A box reaching outside the picture (a center
   crop larger than the image) is padded with zeros, as torchvision pads.

Mode conversion (palette, CMYK, 16-bit grey, alpha onto a background) and the orientation
tag are read with the same functions :class:`~feedline.preprocess.DecodeImages` uses.
Pillow is imported on first use (the ``images`` extra).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from feedline.errors import DataError, MissingDependencyError
from feedline.preprocess.vision.preprocessors import DEFAULT_MAX_PIXELS, _orientation, _to_mode

__all__ = [
    "Undecodable",
    "decode",
    "draft_scale",
    "failure_reason",
    "open_image",
    "oriented_size",
    "render",
]

Box = tuple[float, float, float, float]
#: EXIF orientation -> the transpose that shows the stored pixels upright (exif_transpose's)
_TRANSPOSE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
              6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}  # fmt: skip
_TURNED = (5, 6, 7, 8)  # width and height swap
_DRAFTABLE = ("JPEG", "MPO")
_SCALES = (8, 4, 2)


class Undecodable(Exception):  # an internal signal, turned into DataError or Skipped
    """The bytes are not a decodable image; ``reason`` says why (for the caller's message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("pillow", "images", "Decoding images") from exc
    return Image


def open_image(data: Any, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[Any, int]:
    """Open ``data`` (bytes-like) lazily: ``(PIL image, EXIF orientation)``; header only for
    JPEG. Raises :class:`Undecodable` (empty, null, too large) or Pillow's own exceptions."""
    if data is None:
        raise Undecodable("the value is null (no image bytes)")
    if hasattr(data, "as_py") and not isinstance(data, bytes | bytearray | memoryview):
        data = data.as_py()  # a pyarrow scalar
        if data is None:
            raise Undecodable("the value is null (no image bytes)")
    view = memoryview(data)
    if view.nbytes == 0:
        raise Undecodable("the file is empty (0 bytes)")
    im = _pil().open(io.BytesIO(view))
    w, h = im.size
    if w * h > max_pixels:
        im.close()
        raise Undecodable(
            f"the image is too large: {w}x{h} = {w * h:,} pixels > max_pixels="
            f"{max_pixels:,} (a possible decompression bomb; nothing decoded)"
        )
    return im, _orientation(im)  # JPEG: EXIF is in the header; PNG may load here


def oriented_size(im: Any, orientation: int) -> tuple[int, int]:
    """``(width, height)`` of the picture as displayed."""
    w, h = im.size
    return (h, w) if orientation in _TURNED else (w, h)


def draft_scale(region: Sequence[float], size: Sequence[int]) -> int:
    """The largest JPEG draft scale (1, 2, 4 or 8) keeping ``region`` (width, height, in
    source pixels) at least ``size`` (width, height) in both directions once scaled.

    Examples
    --------
    >>> draft_scale((448, 500), (224, 224)), draft_scale((447, 500), (224, 224))
    (2, 1)
    >>> draft_scale((4000, 3000), (224, 224))
    8
    """
    most = min(region[0] / size[0], region[1] / size[1])
    return next((s for s in _SCALES if s <= most), 1)


def _stored_box(orientation: int, box: Box, w: int, h: int) -> Box:
    """``box`` (on the picture as displayed) in the stored pixels of a ``w`` x ``h`` image."""
    x0, y0, x1, y1 = box
    return {
        1: (x0, y0, x1, y1), 2: (w - x1, y0, w - x0, y1), 3: (w - x1, h - y1, w - x0, h - y0),
        4: (x0, h - y1, x1, h - y0), 5: (y0, x0, y1, x1), 6: (y0, h - x1, y1, h - x0),
        7: (w - y1, h - x1, w - y0, h - x0), 8: (w - y1, x0, w - y0, x1),
    }.get(orientation, box)  # fmt: skip


def _draft(im: Any, want: int, mode: str) -> int:
    """Ask libjpeg for scale ``want`` (Pillow picks it exactly: see the loop); the scale got."""
    if want == 1 or im.format not in _DRAFTABLE:
        return 1
    w, h = im.size
    # Pillow takes min(w // rw, h // rh) rounded down to 8/4/2/1; with rw = w // want that
    # is in [want, 2 * want), so exactly ``want``
    drafted = im.draft("L" if mode == "L" else "RGB", (w // want, h // want))
    return 1 if drafted is None else round(w / drafted[1][2])


def render(
    im: Any,
    orientation: int,
    box: Box,
    size: Sequence[int],
    *,
    mode: str = "RGB",
    background: Sequence[int] | None = (255, 255, 255),
    resample: str = "bilinear",
    draft: bool = True,
) -> tuple[Any, int]:
    """Decode ``box`` (of the picture as displayed) of an opened image into ``size``
    (width, height): ``(PIL image of that size in ``mode``, draft scale used)``."""
    Image = _pil()
    W, H = int(size[0]), int(size[1])
    w, h = im.size
    raw = _stored_box(orientation, box, w, h)
    out = (H, W) if orientation in _TURNED else (W, H)
    scale = _draft(im, draft_scale((raw[2] - raw[0], raw[3] - raw[1]), out), mode) if draft else 1
    im.load()  # raises on truncated data (LOAD_TRUNCATED_IMAGES stays False)
    im = _to_mode(im, SimpleNamespace(image=Image, mode=mode, background=background))
    scaled = tuple(v / scale for v in raw)
    picture = _resize(Image, im, scaled, out, Image.Resampling[resample.upper()])
    if orientation in _TRANSPOSE:
        picture = picture.transpose(Image.Transpose[_TRANSPOSE[orientation]])
    return picture, scale


def _resize(Image: Any, im: Any, box: Sequence[float], out: tuple[int, int], resample: Any) -> Any:
    iw, ih = im.size
    tol = 1e-6 * max(iw, ih)  # float error of the box mapping, not a real overhang
    x0, y0, x1, y1 = (min(max(v, 0.0), lim) if -tol < v < 0 or lim < v < lim + tol else v
                      for v, lim in zip(box, (iw, ih, iw, ih), strict=True))  # fmt: skip
    if x0 >= 0 and y0 >= 0 and x1 <= iw and y1 <= ih:
        if out == (iw, ih) and (x0, y0, x1, y1) == (0, 0, iw, ih):
            return im
        return im.resize(out, resample, box=(x0, y0, x1, y1))
    canvas = Image.new(im.mode, out, 0)  # a box past the edges: zeros there, as a padded crop
    sx, sy = (x1 - x0) / out[0], (y1 - y0) / out[1]
    ix0, iy0, ix1, iy1 = max(x0, 0), max(y0, 0), min(x1, iw), min(y1, ih)
    u0, v0 = round((ix0 - x0) / sx), round((iy0 - y0) / sy)
    u1, v1 = round((ix1 - x0) / sx), round((iy1 - y0) / sy)
    if u1 > u0 and v1 > v0:
        canvas.paste(im.resize((u1 - u0, v1 - v0), resample, box=(ix0, iy0, ix1, iy1)), (u0, v0))
    return canvas


def failure_reason(exc: BaseException) -> str:
    """Why decoding failed, in words, for an exception raised while opening or rendering."""
    Image = _pil()
    if isinstance(exc, Undecodable):
        return exc.reason
    if isinstance(exc, Image.UnidentifiedImageError):
        return "Pillow cannot identify it as an image (unknown format or corrupt header)"
    if isinstance(exc, Image.DecompressionBombError):
        return f"the image is too large for Pillow's own limit ({exc})"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def decode(
    data: Any,
    *,
    mode: str = "RGB",
    draft_size: Sequence[int] | None = None,
    background: Sequence[int] | None = (255, 255, 255),
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Any:
    """Decode encoded image bytes into an upright PIL image in ``mode``.

    Parameters
    ----------
    data:
        The encoded file (bytes-like).
    mode:
        ``"RGB"``, ``"L"`` or ``"RGBA"`` (palette, CMYK, 16-bit grey and alpha converted as
        :class:`~feedline.preprocess.DecodeImages` converts them).
    draft_size:
        ``(width, height)`` the result must still cover: a JPEG is then decoded at the
        smallest 1/2, 1/4 or 1/8 scale that keeps at least this size (``None``: full size).
    background:
        The RGB colour under transparent pixels (``None``: alpha dropped as is).
    max_pixels:
        Larger images are refused before decoding (decompression bombs).

    Raises
    ------
    DataError
        The bytes are empty, truncated, corrupt or not an image.

    Examples
    --------
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (640, 480), (0, 128, 255)).save(buf, "JPEG")
    >>> decode(buf.getvalue()).size, decode(buf.getvalue(), draft_size=(300, 200)).size
    ((640, 480), (320, 240))
    """
    Image = _pil()
    try:
        im, orientation = open_image(data, max_pixels=max_pixels)
        if draft_size:
            _draft(im, draft_scale(oriented_size(im, orientation), draft_size), mode)
        im.load()
        im = _to_mode(im, SimpleNamespace(image=Image, mode=mode, background=background))
    except Exception as exc:
        raise DataError(
            f"Cannot decode the image: {failure_reason(exc)}. Fix: remove or re-encode the file."
        ) from exc
    if orientation in _TRANSPOSE:
        im = im.transpose(Image.Transpose[_TRANSPOSE[orientation]])
    return im
