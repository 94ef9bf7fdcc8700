"""How each column of a Petastorm dataset is decoded: a plan per column, and the decoders.

A :class:`ColumnPlan` says what a stored column holds and what it becomes. It comes from the
Unischema field when the dataset's metadata could be read (:func:`plan_from_field`), or else
from the first value's bytes (:func:`sniff_plan`): ``.npy`` magic (``\\x93NUMPY``) means
``NdarrayCodec``, a zip archive means ``CompressedNdarrayCodec``, PNG or JPEG magic means
``CompressedImageCodec``; the first value's dtype and shape are then taken for all rows.

Images are decoded with Pillow (Petastorm uses OpenCV: PNG pixels are identical, JPEG pixels
may differ by a few levels between the two libjpeg builds). Colour images come out RGB
``(H, W, 3)``, grey ones ``(H, W)``, as Petastorm returns them.

Examples
--------
>>> import numpy as np
>>> plan = ColumnPlan("x", "npy", np.dtype(np.float32), (2, 2))
>>> plan.arrow_type(pa.binary())
FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=float, shape=[2,2]]>)
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import MissingDependencyError
from feedline.io.npy import NPY_MAGIC, ZIP_MAGIC, Cells, decode_npy, decode_npz, load_npy
from feedline.io.npy_arrow import arrow_type_for, cells_to_arrow
from feedline.io.petastorm.unischema import PetastormField

__all__ = ["ColumnPlan", "decode_column", "plan_from_field", "sniff_plan"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
#: what each codec is called in messages
CODEC_NAMES = {
    "npy": "NdarrayCodec",
    "npz": "CompressedNdarrayCodec",
    "image": "CompressedImageCodec",
    "scalar": "ScalarCodec",
    None: "no codec",
}
_FORMATS = ("PNG", "JPEG")
_MODES: dict[str, tuple[type[np.unsignedinteger[Any]], int]] = {
    "L": (np.uint8, 2),
    "RGB": (np.uint8, 3),
    "I;16": (np.uint16, 2),
    "I;16L": (np.uint16, 2),
    "I;16B": (np.uint16, 2),
    "I": (np.uint16, 2),
}


@dataclass(frozen=True)
class ColumnPlan:
    """What one stored column holds and how it is decoded.

    ``codec``: ``"npy"``, ``"npz"``, ``"image"``, ``"scalar"`` or ``None`` (stored as is);
    ``dtype``/``shape``: what every value must be (``None`` dimensions vary);
    ``inferred``: ``True`` when taken from the first value, not from a Unischema.
    """

    name: str
    codec: str | None
    dtype: np.dtype | None = None
    shape: tuple[int | None, ...] = ()
    inferred: bool = False

    @property
    def decodes(self) -> bool:
        """True for binary columns decoded into arrays."""
        return self.codec in ("npy", "npz", "image")

    @property
    def codec_name(self) -> str:
        """The Petastorm codec's class name."""
        return CODEC_NAMES[self.codec]

    def arrow_type(self, stored: pa.DataType) -> pa.DataType:
        """The Arrow type of the column once decoded (``stored``: its type in the files)."""
        if self.decodes and self.dtype is not None:
            return arrow_type_for(self.dtype, self.shape)
        numeric = self.dtype is not None and self.dtype.kind in "biuf"
        if self.codec == "scalar" and numeric and not self.shape and _is_number(stored):
            return pa.from_numpy_dtype(self.dtype)
        return stored


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def plan_from_field(spec: PetastormField) -> ColumnPlan:
    """The plan of a column described by a Unischema field.

    Examples
    --------
    >>> spec = PetastormField("im", np.dtype(np.uint8), (8, 8, 3), "CompressedImageCodec")
    >>> plan_from_field(spec).codec
    'image'
    """
    codec = {
        "NdarrayCodec": "npy",
        "CompressedNdarrayCodec": "npz",
        "CompressedImageCodec": "image",
        "ScalarCodec": "scalar",
    }.get(spec.codec or "")
    return ColumnPlan(spec.name, codec, spec.dtype, tuple(spec.shape))


def sniff_plan(name: str, first: bytes | None) -> ColumnPlan:
    """The plan of a binary column from its first non-null value (``None``: all null).

    Examples
    --------
    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), np.int16))
    >>> sniff_plan("x", buf.getvalue())
    ColumnPlan(name='x', codec='npy', dtype=dtype('int16'), shape=(2, 3), inferred=True)
    >>> sniff_plan("x", b"plain bytes").codec is None
    True
    """
    if first is None:
        return ColumnPlan(name, None, inferred=True)
    try:
        if first.startswith(NPY_MAGIC):
            value, codec = load_npy(first), "npy"
        elif first.startswith(ZIP_MAGIC):
            value, codec = decode_npz(pa.array([first], pa.binary())).values()[0], "npz"
        elif first.startswith((PNG_MAGIC, JPEG_MAGIC)):
            value, codec = decode_images(pa.array([first], pa.binary())).values()[0], "image"
        else:
            return ColumnPlan(name, None, inferred=True)
    except (ValueError, IndexError):
        return ColumnPlan(name, None, inferred=True)
    return ColumnPlan(name, codec, value.dtype, tuple(value.shape), inferred=True)


def decode_images(column: pa.Array) -> Cells:
    """Decode a binary column of PNG/JPEG values with Pillow (nulls stay absent)."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("pillow", "images", "Decoding Petastorm images") from exc
    values: list[np.ndarray | None] = [None] * len(column)
    failed: dict[int, str] = {}
    for row, blob in enumerate(column.to_pylist()):
        if blob is None:
            continue
        try:
            values[row] = _image(Image, blob)
        except Exception as exc:  # noqa: BLE001 - Pillow's plugins raise many kinds: all mean "bad"
            failed[row] = f"not a decodable image ({type(exc).__name__}: {exc})"
    return Cells.from_values(values, failed)


def _image(Image: Any, blob: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(blob), formats=_FORMATS) as im:  # no probing of other plugins
        im.load()  # raises on truncated data
        mode = im.mode
        if mode not in _MODES:
            im = im.convert("RGB" if mode not in ("LA", "La") else "L")
            mode = im.mode
        dtype, _ = _MODES[mode]
        pixels = np.asarray(im)
    if pixels.dtype != dtype:
        if pixels.min(initial=0) < 0 or pixels.max(initial=0) > np.iinfo(dtype).max:
            raise ValueError(f"its pixel values do not fit {np.dtype(dtype).name}")
        pixels = pixels.astype(dtype)
    return np.ascontiguousarray(pixels)


def decode_column(
    plan: ColumnPlan, column: pa.Array | pa.ChunkedArray
) -> tuple[pa.Array, dict[int, str]]:
    """One stored column decoded by ``plan``, plus the rows that failed and why."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if plan.decodes and plan.codec is not None:  # decodes: codec is one of three names
        decoder = {"npy": decode_npy, "npz": decode_npz, "image": decode_images}[plan.codec]
        cells = decoder(column)
        return cells_to_arrow(cells, plan.shape, plan.dtype)
    kind = plan.arrow_type(column.type)
    return (column if kind == column.type else column.cast(kind)), {}
