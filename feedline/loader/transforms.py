"""Ready-made loader transforms: decode and augment images at load time.

``fl.ImageTransform`` is the ``transform=`` of a loader over a dataset of encoded JPEG/PNG
bytes (``fl.read_images(..., decode=False)`` or any binary column) or of decoded ``uint8``
pixels (a ``uint8[C, H, W]`` or ``[H, W, C]`` tensor column, e.g. written by
``fl.DecodeImages``): the pure image ops of :mod:`feedline.preprocess.vision.augment`
(RandomResizedCrop + horizontal flip for training, Resize + CenterCrop for evaluation,
Normalize), drawing from the sample's ``(seed, epoch, index)`` generator. Bytes are decoded
straight to the crop at the smallest JPEG draft scale that covers it; pixels are cropped and
resized by :mod:`feedline.preprocess.vision.tensors`, a whole batch per NumPy call with
``batched=True``. Run it in workers: ``num_workers=2`` threads (Pillow and NumPy release the
GIL) or processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, DataError
from feedline.preprocess.vision.augment import Compose, Skipped
from feedline.preprocess.vision.ops import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToArray,
)
from feedline.preprocess.vision.preprocessors import _choose
from feedline.preprocess.vision.tensors import PIXEL_LAYOUTS, augment_pixels, is_pixels

__all__ = ["ImageTransform"]


class ImageTransform:
    """Decode + augment the image in ``column`` of each sample (a loader transform).

    The column holds encoded bytes (JPEG, PNG, ...: decoded with Pillow) or decoded ``uint8``
    pixels (a tensor column, ``(C, H, W)``, ``(H, W, C)`` or ``(H, W)``: cropped, resized and
    flipped with NumPy, by Pillow's bilinear filter, antialiased when shrinking). Either way a
    sample gets the same crop box and flip from its ``(seed, epoch, index)`` generator. Per
    sample by default; with the loader's ``batched=True`` it is called once per batch, and
    pixels are augmented for the whole batch in a few NumPy calls (the same values as per
    sample).

    Parameters
    ----------
    column:
        The field holding the encoded bytes or the pixels; the augmented image replaces it
        (or goes to ``output``). Other fields (labels) pass through.
    train:
        ``True``: ``RandomResizedCrop(size, scale, ratio)`` then a horizontal flip with
        probability ``flip``; ``False`` (evaluation): ``Resize(resize)`` then
        ``CenterCrop(size)``, no randomness.
    size, resize:
        Output size (int: square, or ``(height, width)``); the evaluation resize of the
        shorter side (default ``size * 256 / 224``, torchvision's recipe).
    normalize, mean, std, layout:
        float32 ``(x / 255 - mean) / std`` (ImageNet statistics by default), or uint8 with
        ``normalize=False``; ``"CHW"`` (torch) or ``"HWC"``.
    on_error:
        ``"raise"``: a :class:`~feedline.errors.DataError` naming the sample;
        ``"skip"``: the sample is dropped from its batch and counted (``loader.stats()
        ["skipped"]``, ``loader.metrics()``), never silently lost; a batch whose every sample
        is skipped is not yielded at all (it is counted). A batched call cannot drop a
        sample: it raises. Pixels of the wrong dtype or channel count are a
        :class:`~feedline.errors.ConfigurationError` (every sample of the column has them).
    mode, draft:
        ``"RGB"`` / ``"L"`` / ``"RGBA"`` (pixels must have that many channels); JPEG
        DCT-scaled decoding (same geometry either way).
    input_layout:
        Of pixels: ``"CHW"``, ``"HWC"``, or ``"auto"`` (by where the mode's channel count is).

    Examples
    --------
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (500, 400), (9, 9, 9)).save(buf, "JPEG")
    >>> train = ImageTransform("image", size=224)
    >>> out = train({"image": buf.getvalue(), "label": 3}, np.random.default_rng(0), index=0)
    >>> out["image"].shape, out["image"].dtype, out["label"]
    ((3, 224, 224), dtype('float32'), 3)
    >>> ImageTransform("image", train=False, size=224, normalize=False).output_shape
    (3, 224, 224)

    Decoded pixels, per sample or a whole batch at once (``batched=True`` in the loader):

    >>> from feedline.loader.nodes import SampleRngs
    >>> pixels = np.random.default_rng(0).integers(0, 256, (4, 3, 40, 48), dtype=np.uint8)
    >>> crop = ImageTransform("image", size=32)
    >>> batch = crop({"image": pixels}, SampleRngs(seed=0, epoch=0, indices=np.arange(4)))
    >>> batch["image"].shape, batch["image"].dtype
    ((4, 3, 32, 32), dtype('float32'))
    """

    def __init__(
        self,
        column: str = "image",
        *,
        train: bool = True,
        size: int | Sequence[int] = 224,
        resize: int | None = None,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        normalize: bool = True,
        mean: float | Sequence[float] = IMAGENET_MEAN,
        std: float | Sequence[float] = IMAGENET_STD,
        layout: str = "CHW",
        output: str | None = None,
        on_error: str = "raise",
        mode: str = "RGB",
        draft: bool = True,
        input_layout: str = "auto",
    ) -> None:
        _choose("input_layout", input_layout, PIXEL_LAYOUTS)
        short = size if isinstance(size, int) else min(size)
        if train:
            ops: list[Any] = [RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip(flip)]
        else:
            ops = [Resize(resize or round(short * 256 / 224)), CenterCrop(size)]
        ops.append(Normalize(mean, std, layout) if normalize else ToArray(layout))
        self.column, self.train, self.input_layout = column, bool(train), input_layout
        self.compose = Compose(ops, key=column, output=output, mode=mode, on_error=on_error,
                               draft=draft)  # fmt: skip

    @property
    def output_shape(self) -> tuple[int, ...] | None:
        """The shape of every decoded image."""
        return self.compose.output_shape()

    def __call__(
        self, sample: dict[str, Any], rng: Any = None, *, index: int | None = None,
    ) -> Any:  # fmt: skip
        """The sample with its image decoded and augmented (or a ``Skipped`` marker).

        ``rng`` is the sample's generator; a sequence of them (the loader's ``rngs`` with
        ``batched=True``) makes ``sample`` a batch of columns, augmented as a whole.
        """
        if rng is not None and not isinstance(rng, np.random.Generator):
            return self._batch(sample, rng)
        value = sample.get(self.column) if isinstance(sample, dict) else sample
        if not is_pixels(value):
            return self.compose(sample, rng, index=index)
        pixels = np.asarray(value)
        image = augment_pixels(self.compose, pixels[None], [rng], layout=self.input_layout,
                               column=self.column)[0]  # fmt: skip
        if not isinstance(sample, dict):
            return image
        return {**sample, self.compose.output: image}

    def _batch(self, batch: dict[str, Any], rngs: Sequence[Any]) -> dict[str, Any]:
        """A batch of columns (``batched=True``): pixels in a few NumPy calls, bytes one by
        one; a sample that cannot be decoded raises (a batch keeps every row)."""
        if not isinstance(batch, dict) or self.column not in batch:
            raise ConfigurationError(
                f"ImageTransform: the batch has no column {self.column!r} (it has "
                f"{sorted(batch) if isinstance(batch, dict) else type(batch).__name__}). Fix: "
                "name the column of images."
            )
        values = batch[self.column]
        indices = getattr(rngs, "indices", None)
        if isinstance(values, np.ndarray) and values.dtype.kind != "O" and values.ndim >= 3:
            images = augment_pixels(self.compose, values, rngs, layout=self.input_layout,
                                    column=self.column)  # fmt: skip
        elif all(is_pixels(v) for v in values):
            images = augment_pixels(self.compose, list(values), rngs, layout=self.input_layout,
                                    column=self.column)  # fmt: skip
        else:
            outs = []
            for i, (value, rng) in enumerate(zip(values, rngs, strict=True)):
                index = None if indices is None else int(indices[i])
                out = self(value, rng, index=index)
                if isinstance(out, Skipped):
                    raise DataError(
                        f"Cannot decode the image of {out} in a batched call, which cannot "
                        "drop a sample. Fix: run ImageTransform per sample (batched=False) "
                        "to skip bad images, or remove the file."
                    )
                outs.append(out)
            images = np.stack(outs) if outs else np.empty((0,), np.float32)
        return {**batch, self.compose.output: images}

    def __repr__(self) -> str:
        return f"ImageTransform({self.column!r}, train={self.train}, shape={self.output_shape})"
