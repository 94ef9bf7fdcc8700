"""Images: decode encoded bytes into fixed-shape ``uint8`` tensors; normalize them.

- JPEG **draft**: libjpeg decodes at 1/2, 1/4 or 1/8 scale, the smallest still covering
  what the resize needs (never upsampling): 2-5x faster for photos much larger than the target.
- **Filter**: antialiased bilinear with ``reducing_gap=3`` (box-reduce big reductions first;
  per Pillow, indistinguishable from a full resample), as torchvision; lanczos: ~2x slower.
- **Orientation**: the EXIF (or XMP) orientation tag is applied, so a photo taken sideways
  comes out upright (``PIL.ImageOps.exif_transpose``, on the drafted image; a no-op without
  a tag). An unreadable orientation tag leaves the picture as stored.
- **Threads**: one pool per process decodes a batch (Pillow releases the GIL) into one
  preallocated array, wrapped without a copy. Pillow's globals are never changed.
- **Normalize** belongs at the loader edge, so stored pixels stay ``uint8`` (4x smaller).
"""

from __future__ import annotations

import io
import math
import os
import threading
import warnings
from collections import namedtuple
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, DataError, MissingDependencyError, SchemaError
from feedline.preprocess.preprocessor import Preprocessor, register

__all__ = ["DecodeImages", "Normalize", "decode_pool"]

#: Pillow's own default ``Image.MAX_IMAGE_PIXELS``
DEFAULT_MAX_PIXELS = 89_478_485
_CHANNELS = {"RGB": 3, "L": 1, "RGBA": 4}
_RESAMPLE = ("bilinear", "lanczos", "bicubic", "hamming", "box", "nearest")
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_REDUCING_GAP = 3.0

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def decode_pool() -> ThreadPoolExecutor:
    """The process-wide decoding thread pool, created on first use (and anew after a fork)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            _pool = ThreadPoolExecutor(cpus or os.cpu_count() or 2, "feedline-decode")
            _pool_pid = os.getpid()
        return _pool


#: everything one decode needs (immutable, shared by the pool's threads); image: PIL.Image
_Spec = namedtuple("_Spec", "image height width mode crop chw max_pixels resample background ops")


class _ModeSpec(Protocol):
    """What :func:`_to_mode` reads of a :data:`_Spec` (decode.py passes just these)."""

    @property
    def image(self) -> Any: ...  # the PIL.Image module
    @property
    def mode(self) -> str: ...
    @property
    def background(self) -> Sequence[int] | None: ...


_DRAFTABLE = ("JPEG", "MPO")
#: EXIF orientation -> where a point (x, y) of a w x h image lands after ``exif_transpose``
_TURNS = {
    2: lambda x, y, w, h: (w - x, y),  # mirrored
    3: lambda x, y, w, h: (w - x, h - y),  # upside down
    4: lambda x, y, w, h: (x, h - y),
    5: lambda x, y, w, h: (y, x),
    6: lambda x, y, w, h: (h - y, x),  # taken with the camera turned right: rotate clockwise
    7: lambda x, y, w, h: (h - y, w - x),
    8: lambda x, y, w, h: (y, w - x),
}


def _decode_into(data: bytes | None, dst: np.ndarray, spec: _Spec) -> str | None:
    """Decode ``data`` into ``dst`` (one output image); return ``None`` or why it failed."""
    if data is None:
        return "the value is null (no image bytes)"
    if len(data) == 0:
        return "the file is empty (0 bytes)"
    Image = spec.image
    try:
        with Image.open(io.BytesIO(data)) as opened:  # reads the header only
            w, h = opened.size
            if w * h > spec.max_pixels:
                return (
                    f"the image is too large: {w}x{h} = {w * h:,} pixels > max_pixels="
                    f"{spec.max_pixels:,} (a possible decompression bomb; nothing decoded)"
                )
            # JPEG's EXIF is in its header: read before drafting (others' may follow the pixels)
            turn = _orientation(opened) if opened.format in _DRAFTABLE else None
            box = _draft(opened, w, h, spec, turned=turn in (5, 6, 7, 8))
            opened.load()  # raises on truncated data (LOAD_TRUNCATED_IMAGES stays False)
            turn = _orientation(opened) if turn is None else turn
            if turn in _TURNS:
                size = opened.size
                spec.ops.exif_transpose(opened, in_place=True)
                (x0, y0), (x1, y1) = (
                    _TURNS[turn](x, y, *size) for x, y in ((box[0], box[1]), (box[2], box[3]))
                )
                box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
            im = _resize(_to_mode(opened, spec), box, spec)
            pixels = np.frombuffer(im.tobytes(), np.uint8).reshape(spec.height, spec.width, -1)
            dst[...] = pixels.transpose(2, 0, 1) if spec.chw else pixels
    except Image.UnidentifiedImageError:
        return "Pillow cannot identify it as an image (unknown format or corrupt header)"
    except Image.DecompressionBombError as exc:
        return f"the image is too large for Pillow's own limit ({exc})"
    except Exception as exc:  # noqa: BLE001 - Pillow's plugins raise many kinds: all mean "bad"
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    return None


def _orientation(im: Any) -> int:
    """The image's EXIF/XMP orientation (1: as stored); 1 when its EXIF block is corrupt."""
    try:
        return int(im.getexif().get(0x0112, 1))  # ExifTags.Base.Orientation
    except Exception:  # noqa: BLE001 - any broken metadata: keep the pixels as stored
        return 1


def _draft(
    im: Any, w: int, h: int, spec: _Spec, turned: bool = False
) -> tuple[float, float, float, float]:
    """JPEG: decode at 1/2..1/8 scale, never below what the resize needs. Returns the region
    holding the picture (the original size over the scale, possibly fractional). ``turned``:
    the stored image is the picture turned by 90 degrees (EXIF orientation 5 to 8)."""
    if im.format in _DRAFTABLE:
        H, W = (spec.width, spec.height) if turned else (spec.height, spec.width)
        s = max(W / w, H / h)
        need = (max(W, math.ceil(w * s - 1e-6)), max(H, math.ceil(h * s - 1e-6)))
        drafted = im.draft("L" if spec.mode == "L" else "RGB", need if spec.crop else (W, H))
        if drafted is not None:
            return drafted[1]
    return (0.0, 0.0, float(w), float(h))


def _to_mode(im: Any, spec: _ModeSpec) -> Any:
    """Convert any decodable mode to ``spec.mode`` (alpha composited onto the background)."""
    Image, target = spec.image, spec.mode
    if im.mode == target:
        return im
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):  # Pillow's convert would clip
        values = np.asarray(im)  # 16-bit grey (I: older Pillows' 16-bit PNG) scaled, F clipped
        scaled = (
            np.clip(np.rint(values), 0, 255)
            if im.mode == "F"
            else (np.clip(values, 0, 65535).astype(np.uint32) * 255 + 32767) // 65535
        )
        return Image.fromarray(np.ascontiguousarray(scaled, np.uint8)).convert(target)
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif im.mode in _ALPHA_MODES:
        im = im.convert("RGBA")
    elif im.mode not in _CHANNELS:
        im = im.convert("RGB")  # CMYK (Adobe-inverted too), YCbCr, 1, ...
    if im.mode == "RGBA" and target != "RGBA" and spec.background is not None:
        flat = Image.new("RGB", im.size, spec.background)
        flat.paste(im, mask=im.getchannel("A"))
        im = flat
    return im if im.mode == target else im.convert(target)


def _resize(im: Any, box: tuple[float, float, float, float], spec: _Spec) -> Any:
    H, W = spec.height, spec.width
    x0, y0, sw, sh = box[0], box[1], box[2] - box[0], box[3] - box[1]
    if spec.crop:  # the largest centred region with the target's aspect ratio
        s = max(W / sw, H / sh)  # min(): W / s may exceed sw by a rounding error
        cw, ch = min(sw, W / s), min(sh, H / s)
        x0, y0, sw, sh = x0 + (sw - cw) / 2, y0 + (sh - ch) / 2, cw, ch
    region = (x0, y0, x0 + sw, y0 + sh)
    if im.size == (W, H) and region == (0.0, 0.0, float(W), float(H)):
        return im
    return im.resize((W, H), spec.resample, box=region, reducing_gap=_REDUCING_GAP)


@register
class DecodeImages(Preprocessor):
    """Decode encoded images (JPEG, PNG, ...) into a fixed-shape ``uint8`` tensor column.

    Parameters
    ----------
    column:
        The binary column of encoded files (``fl.read_images`` calls it ``"bytes"``).
    size:
        ``(height, width)`` of the output (an int: a square).
    mode:
        ``"RGB"``, ``"L"`` (grey, 1 channel) or ``"RGBA"``. Palette, CMYK, 16-bit grey
        (scaled, not clipped) and alpha (composited onto ``background``) are converted.
    resize:
        ``"shorter+center_crop"`` (no distortion, keeps the centre) or ``"stretch"``.
    layout:
        ``"HWC"`` (NumPy/Pillow order, as TF and JAX expect) or ``"CHW"`` (PyTorch's).
    on_error:
        Corrupt, truncated, empty or undecodable files, and images whose header declares
        more than ``max_pixels`` (decompression bombs, rejected before decoding):
        ``"raise"`` raises :class:`DataError` naming the file, the reason and the fix;
        ``"skip"`` drops the row and records (path, reason) with ``report.record_skip``,
        listed in ``WriteInfo.report["skipped"]`` and the manifest's ``write.report``.
    path_column:
        The column naming each row's file in messages (else the row number is used).
    output:
        Output column name; by default the pixels replace ``column``.
    resample:
        ``"bilinear"``, ``"lanczos"``, ``"bicubic"``, ``"hamming"``, ``"box"``, ``"nearest"``.
    background:
        The RGB colour under transparent pixels (``None``: alpha is dropped as is).

    Examples
    --------
    >>> import io, pyarrow as pa
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (64, 48), (255, 0, 0)).save(buf, "PNG")
    >>> batch = pa.record_batch({"path": ["red.png"], "bytes": [buf.getvalue()]})
    >>> out = DecodeImages(size=(32, 32)).transform_batch(batch)
    >>> out.schema.field("bytes").type
    FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=uint8, shape=[32,32,3]]>)
    >>> out.column("bytes").to_numpy_ndarray()[0, 0, 0].tolist()
    [255, 0, 0]
    """

    needs_fit: ClassVar[bool] = False

    def __init__(
        self,
        column: str = "bytes",
        *,
        size: int | Sequence[int] = (224, 224),
        mode: str = "RGB",
        resize: str = "shorter+center_crop",
        layout: str = "HWC",
        on_error: str = "raise",
        path_column: str | None = "path",
        output: str | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        resample: str = "bilinear",
        background: Sequence[int] | None = (255, 255, 255),
    ) -> None:
        super().__init__(column, output)
        hw = (size, size) if isinstance(size, int) else tuple(size)
        if len(hw) != 2 or not all(isinstance(v, int) and v > 0 for v in hw):
            raise ConfigurationError(
                f"size={size!r} must be (height, width). Fix: e.g. size=(224, 224) or size=224."
            )
        _choose("mode", mode, tuple(_CHANNELS))
        _choose("resize", resize, ("shorter+center_crop", "stretch"))
        _choose("layout", layout, ("HWC", "CHW"))
        _choose("on_error", on_error, ("raise", "skip"))
        _choose("resample", resample, _RESAMPLE)
        if len(self.columns) != 1 or not isinstance(max_pixels, int) or max_pixels < 1:
            raise ConfigurationError(
                "DecodeImages needs one column and max_pixels >= 1. Fix: one DecodeImages per "
                "image column, and a positive max_pixels."
            )
        if background is not None and not (
            len(background) == 3 and all(0 <= int(v) <= 255 for v in background)
        ):
            raise ConfigurationError(
                f"background={background!r} must be an (r, g, b) tuple. Fix: e.g. "
                "background=(255, 255, 255)."
            )
        self.size: tuple[int, int] = hw
        self.mode, self.resize, self.layout = mode, resize, layout
        self.on_error, self.path_column, self.max_pixels = on_error, path_column, max_pixels
        self.resample = resample
        self.background = None if background is None else tuple(int(v) for v in background)

    @property
    def shape(self) -> tuple[int, int, int]:
        """The shape of one output image: ``(H, W, C)`` or ``(C, H, W)``."""
        (h, w), c = self.size, _CHANNELS[self.mode]
        return (h, w, c) if self.layout == "HWC" else (c, h, w)

    @property
    def output_type(self) -> pa.DataType:
        """The Arrow type of the output column."""
        return pa.fixed_shape_tensor(pa.uint8(), list(self.shape))

    def params(self) -> dict[str, Any]:
        names = ("mode", "resize", "layout", "on_error", "path_column", "max_pixels", "resample")
        return (
            {"column": self.columns[0], "size": list(self.size)}
            | {n: getattr(self, n) for n in names}
            | {
                "output": None if self.output == self.columns else self.output[0],
                "background": None if self.background is None else list(self.background),
            }
        )

    def decode(self, blobs: Sequence[bytes | None]) -> tuple[np.ndarray, list[str | None]]:
        """Decode with the shared thread pool: the ``(n, *shape)`` ``uint8`` array (failed
        rows undefined) and, per image, ``None`` or why it could not be decoded."""
        try:
            from PIL import Image, ImageOps
        except ImportError as exc:
            raise MissingDependencyError("pillow", "images", "Decoding images") from exc
        spec = _Spec(
            Image,
            *self.size,
            self.mode,
            self.resize != "stretch",
            self.layout == "CHW",
            self.max_pixels,
            Image.Resampling[self.resample.upper()],
            self.background,
            ImageOps,
        )
        out = np.empty((len(blobs), *self.shape), np.uint8)
        if len(blobs) <= 1:
            return out, [_decode_into(b, out[i], spec) for i, b in enumerate(blobs)]
        work = decode_pool().map(lambda i: _decode_into(blobs[i], out[i], spec), range(len(blobs)))
        return out, list(work)

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        column = batch.column(self.columns[0])
        kinds = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
        if not any(is_kind(column.type) for is_kind in kinds):
            raise SchemaError(
                f"DecodeImages needs a binary column of encoded images; {self.columns[0]!r} in "
                f"{where} is {column.type}. Fix: pass the bytes column (read_images: 'bytes')."
            )
        pixels, reasons = self.decode(column.to_pylist())
        failed = {i: reason for i, reason in enumerate(reasons) if reason is not None}
        bad = list(failed)
        if bad:
            if self.path_column and batch.schema.get_field_index(self.path_column) >= 0:
                paths = batch.column(self.path_column).take(pa.array(bad)).to_pylist()
                names = [str(p) for p in paths]
            else:
                names = [f"row {i} of the batch from {where}" for i in bad]
            if self.on_error == "raise":
                raise DataError(self._message(names[0], failed[bad[0]], len(bad) - 1))
            if report is not None:
                for name, i in zip(names, bad, strict=True):
                    report.record_skip(name, failed[i])
            else:  # called outside an engine: still never silent
                warnings.warn(
                    f"DecodeImages skipped {len(bad)} undecodable image(s), e.g. "
                    f"{names[0]}: {failed[bad[0]]}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            keep = np.setdiff1d(np.arange(batch.num_rows), bad)
            pixels, batch = pixels[keep], batch.take(pa.array(keep))
        return _put(batch, self.output[0], _tensor_array(pixels))

    def _message(self, name: str, reason: str, others: int) -> str:
        fix = (
            "if the image is genuine, raise max_pixels=; else remove it or on_error='skip'"
            if "too large" in reason
            else "remove or re-encode the file, or pass on_error="
            "'skip' to drop undecodable images (they are listed in the write report)"
        )
        more = f" ({others} more undecodable image(s) in the same batch)" if others else ""
        return (
            f"Cannot decode the image {name} (column {self.columns[0]!r}): {reason}{more}. "
            f"Fix: {fix}."
        )


@register
class Normalize(Preprocessor):
    """Pixels to ``float32``: ``(x / 255 - mean) / std`` per channel.

    Its usual place is the loader edge (:meth:`apply` on each NumPy or torch batch), so
    stored pixels stay ``uint8``, 4x smaller than ``float32``; it also works in ``ds.transform``.

    Parameters
    ----------
    column:
        A ``uint8`` fixed-shape tensor column (as :class:`DecodeImages` makes).
    mean, std:
        Per channel on the 0..1 scale (or one for all), e.g. ImageNet's (0.485, 0.456, 0.406)
        and (0.229, 0.224, 0.225).
    layout, output:
        ``"HWC"`` or ``"CHW"``, as decoded; the output column (default: replace ``column``).

    Examples
    --------
    >>> import numpy as np
    >>> norm = Normalize("image", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    >>> x = np.array([[[[0, 255, 51]]]], np.uint8)  # one 1x1 RGB image, (n, H, W, C)
    >>> [round(v, 2) for v in norm.apply(x).ravel().tolist()]
    [-1.0, 1.0, -0.6]
    """

    needs_fit: ClassVar[bool] = False

    def __init__(
        self,
        column: str,
        mean: float | Sequence[float],
        std: float | Sequence[float],
        *,
        layout: str = "HWC",
        output: str | None = None,
    ) -> None:
        super().__init__(column, output)
        _choose("layout", layout, ("HWC", "CHW"))
        self.layout = layout
        self.mean = [float(v) for v in np.atleast_1d(np.asarray(mean, dtype=np.float64))]
        self.std = [float(v) for v in np.atleast_1d(np.asarray(std, dtype=np.float64))]
        if (
            not all(np.isfinite(self.mean))
            or not all(np.isfinite(v) and v > 0 for v in self.std)
            or len({len(self.mean), len(self.std)} - {1}) > 1
        ):
            raise ConfigurationError(
                f"Normalize needs finite means and positive stds, one per channel (or one for "
                f"all), got mean={mean!r}, std={std!r}. Fix: e.g. mean=(0.485, 0.456, 0.406), "
                "std=(0.229, 0.224, 0.225)."
            )

    def params(self) -> dict[str, Any]:
        output = None if self.output == self.columns else self.output[0]
        return {
            "column": self.columns[0],
            "mean": self.mean,
            "std": self.std,
            "layout": self.layout,
            "output": output,
        }

    def _coefficients(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``scale`` and ``offset`` (broadcastable): ``out = x * scale + offset``."""
        width = max(len(self.mean), len(self.std))
        axis = -1 if self.layout == "HWC" else -3
        if width != 1 and (len(shape) < 3 or shape[axis] != width):
            raise SchemaError(
                f"Normalize({self.columns[0]!r}) has {width} channel values but the images "
                f"have shape {tuple(shape)} with layout {self.layout!r}. Fix: check layout= "
                "(HWC or CHW, as decoded) and the number of mean/std values."
            )
        std = np.broadcast_to(np.asarray(self.std), (width,))
        mean = np.broadcast_to(np.asarray(self.mean), (width,))
        scale, offset = 1.0 / (255.0 * std), -mean / std
        if self.layout == "CHW":
            scale, offset = scale[:, None, None], offset[:, None, None]
        return scale.astype(np.float32), offset.astype(np.float32)

    def apply(self, images: Any) -> Any:
        """Normalize a NumPy array or a torch tensor: one image or a batch.

        ``images`` holds values 0..255 (usually ``uint8``) shaped ``(n, H, W, C)`` or
        ``(H, W, C)`` (``"CHW"``: ``(n, C, H, W)`` or ``(C, H, W)``). Returns ``float32`` of
        the same shape (a torch tensor stays on its device); the input is not modified.
        """
        if isinstance(images, np.ndarray):
            scale, offset = self._coefficients(images.shape)
            out = np.multiply(images, scale, dtype=np.float32)
            out += offset
            return out
        if type(images).__module__.partition(".")[0] == "torch":
            import torch

            on_device = (
                torch.from_numpy(c).to(images.device)
                for c in self._coefficients(tuple(images.shape))
            )
            scale_t, offset_t = on_device
            return images.to(torch.float32).mul(scale_t).add_(offset_t)
        raise ConfigurationError(
            f"Normalize.apply needs a NumPy array or a torch tensor, got {type(images).__name__}."
            " Fix: np.asarray(...) it first, or use ds.transform(Normalize(...)) on Arrow data."
        )

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        name = self.columns[0]
        column = batch.column(name)
        if not isinstance(column.type, pa.FixedShapeTensorType) or column.null_count:
            raise SchemaError(
                f"Normalize needs a fixed-shape tensor column without nulls; {name!r} in {where} "
                f"is {column.type} ({column.null_count} nulls). Fix: decode it with DecodeImages."
            )
        return _put(batch, self.output[0], _tensor_array(self.apply(column.to_numpy_ndarray())))


def _tensor_array(values: np.ndarray) -> pa.ExtensionArray:
    """A fixed-shape tensor array over a ``(n, ...)`` array, without a copy when contiguous
    (also for ``n == 0``, which ``FixedShapeTensorArray.from_numpy_ndarray`` refuses)."""
    shape = list(values.shape[1:])
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, math.prod(shape))
    kind = pa.fixed_shape_tensor(pa.from_numpy_dtype(values.dtype), shape)
    return pa.ExtensionArray.from_storage(kind, storage)


def _put(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    """``batch`` with column ``name`` replaced by (or, if new, appended as) ``values``."""
    index, field = batch.schema.get_field_index(name), pa.field(name, values.type)
    return (
        batch.set_column(index, field, values) if index >= 0 else batch.append_column(field, values)
    )


def _choose(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigurationError(f"{name}={value!r} is not one of {list(allowed)}. Fix: use one.")
