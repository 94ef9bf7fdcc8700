"""Ready-made loader transforms: decode and augment encoded images at load time.

``fl.ImageTransform`` is the ``transform=`` of a loader over a dataset of encoded JPEG/PNG
bytes (``fl.read_images(..., decode=False)`` or any binary column): the pure image ops of
:mod:`feedline.preprocess.vision.augment` (decode straight to the crop at the smallest JPEG draft
scale that covers it, RandomResizedCrop + horizontal flip for training, Resize + CenterCrop
for evaluation, Normalize), drawing from the sample's ``(seed, epoch, index)`` generator.
Run it in workers: ``num_workers=2`` threads (Pillow releases the GIL while decoding) or
processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.preprocess.vision.augment import Compose
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

__all__ = ["ImageTransform"]


class ImageTransform:
    """Decode + augment the image bytes in ``column`` of each sample (a loader transform).

    Parameters
    ----------
    column:
        The field holding the encoded bytes; the decoded image replaces it (or goes to
        ``output``). Other fields (labels) pass through.
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
        ["skipped"]``, ``loader.metrics()``), never silently lost.
    mode, draft:
        ``"RGB"`` / ``"L"`` / ``"RGBA"``; JPEG DCT-scaled decoding (same geometry either way).

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
    ) -> None:
        short = size if isinstance(size, int) else min(size)
        if train:
            ops: list[Any] = [RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip(flip)]
        else:
            ops = [Resize(resize or round(short * 256 / 224)), CenterCrop(size)]
        ops.append(Normalize(mean, std, layout) if normalize else ToArray(layout))
        self.column, self.train = column, bool(train)
        self.compose = Compose(ops, key=column, output=output, mode=mode, on_error=on_error,
                               draft=draft)  # fmt: skip

    @property
    def output_shape(self) -> tuple[int, ...] | None:
        """The shape of every decoded image."""
        return self.compose.output_shape()

    def __call__(
        self, sample: dict[str, Any], rng: np.random.Generator | None = None, *,
        index: int | None = None,
    ) -> Any:  # fmt: skip
        """The sample with its image decoded and augmented (or a ``Skipped`` marker)."""
        return self.compose(sample, rng, index=index)

    def __repr__(self) -> str:
        return f"ImageTransform({self.column!r}, train={self.train}, shape={self.output_shape})"
