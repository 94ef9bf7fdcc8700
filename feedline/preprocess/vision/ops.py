"""The steps of :class:`feedline.preprocess.vision.augment.Compose`: geometry and output, no pixels.

Geometric steps move a :class:`View` (a box over the picture as displayed, the output size so
far, mirrored or not) and draw from the sample's ``rng`` with torchvision's semantics; nothing
is decoded until the whole plan is known. Output steps turn the final ``uint8`` HWC pixels
into the array handed to the loader (:class:`ToArray`: uint8; :class:`Normalize`: float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.preprocess.vision.preprocessors import _choose

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CenterCrop",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToArray",
    "View",
    "is_geometry",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _hw(size: int | Sequence[int], what: str) -> tuple[int, int]:
    """torchvision's size convention: an int is a square, a pair is ``(height, width)``."""
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if len(hw) != 2 or not all(isinstance(v, int | np.integer) and v > 0 for v in hw):
        raise ConfigurationError(
            f"{what}: size={size!r} must be a positive int or (height, width). Fix: e.g. 224."
        )
    return int(hw[0]), int(hw[1])


@dataclass(frozen=True)
class View:
    """Where the output comes from: ``box`` (x0, y0, x1, y1) on the picture as displayed,
    the output ``size`` (width, height) so far, and whether it is mirrored (``flip``)."""

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool = False

    @classmethod
    def of(cls, width: int, height: int) -> View:
        """The whole picture, unchanged."""
        return cls((0.0, 0.0, float(width), float(height)), (width, height))

    def crop(self, left: int, top: int, width: int, height: int) -> View:
        """The ``width`` x ``height`` pixels at (left, top) of the current output."""
        W, H = self.size
        if self.flip:  # the output is mirrored: its columns count from the box's right edge
            left = W - left - width
        x0, y0, x1, y1 = self.box
        sx, sy = (x1 - x0) / W, (y1 - y0) / H
        box = (x0 + left * sx, y0 + top * sy, x0 + (left + width) * sx, y0 + (top + height) * sy)
        return View(box, (width, height), self.flip)


class RandomResizedCrop:
    """A random crop (area ``scale``, aspect ``ratio``) resized to ``size``: torchvision's
    sampling (10 attempts of a log-uniform ratio, then a center-crop fallback).

    Examples
    --------
    >>> op = RandomResizedCrop(224)
    >>> top, left, h, w = op.params(500, 400, np.random.default_rng(0))
    >>> 0 <= left <= 500 - w and 0 <= top <= 400 - h
    True
    """

    random = True

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3)) -> None:  # fmt: skip
        self.size = _hw(size, "RandomResizedCrop")
        self.scale, self.ratio = (
            (float(scale[0]), float(scale[1])),
            (float(ratio[0]), float(ratio[1])),
        )
        if not (0 < self.scale[0] <= self.scale[1] and 0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigurationError(
                f"RandomResizedCrop: scale={scale!r} and ratio={ratio!r} must be positive "
                "(min, max) pairs. Fix: e.g. scale=(0.08, 1.0), ratio=(3/4, 4/3)."
            )

    def params(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, ...]:
        """``(top, left, height, width)`` of the crop of a ``width`` x ``height`` image."""
        area = width * height
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(lo, hi))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                return top, int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height  # fallback: the largest center crop within the ratio bounds
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def plan(self, view: View, rng: np.random.Generator) -> View:
        top, left, h, w = self.params(*view.size, rng)
        return replace(view.crop(left, top, w, h), size=(self.size[1], self.size[0]))


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (one ``rng.random()`` draw)."""

    random = True

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1:
            raise ConfigurationError(f"RandomHorizontalFlip: p={p!r}. Fix: a probability 0..1.")
        self.p = float(p)

    def plan(self, view: View, rng: np.random.Generator) -> View:
        return replace(view, flip=not view.flip) if rng.random() < self.p else view


class Resize:
    """Resize: an int sets the shorter side (the longer one keeps the aspect, truncated, as
    torchvision); ``(height, width)`` sets both."""

    random = False

    def __init__(self, size: int | Sequence[int]) -> None:
        self.shorter = size if isinstance(size, int) else None
        self.size = _hw(size, "Resize")

    def plan(self, view: View, rng: Any = None) -> View:
        W, H = view.size
        if self.shorter is None:
            return replace(view, size=(self.size[1], self.size[0]))
        s = self.shorter
        size = (s, int(s * H / W)) if W <= H else (int(s * W / H), s)
        return replace(view, size=size)


class CenterCrop:
    """The centre ``size`` (int or ``(height, width)``); zero-padded where larger than the
    image (as torchvision)."""

    random = False

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _hw(size, "CenterCrop")

    def plan(self, view: View, rng: Any = None) -> View:
        (ch, cw), (W, H) = self.size, view.size
        left = -((cw - W) // 2) if cw > W else round((W - cw) / 2.0)
        top = -((ch - H) // 2) if ch > H else round((H - ch) / 2.0)
        return view.crop(left, top, cw, ch)


class ToArray:
    """uint8 output, ``layout="CHW"`` (torch) or ``"HWC"`` (NumPy/TF/JAX)."""

    def __init__(self, layout: str = "CHW") -> None:
        _choose("layout", layout, ("CHW", "HWC"))
        self.layout = layout

    def __call__(self, hwc: np.ndarray) -> np.ndarray:
        out = hwc.transpose(2, 0, 1) if self.layout == "CHW" else hwc
        return out.copy() if not (out.flags.c_contiguous and out.flags.writeable) else out


class Normalize(ToArray):
    """float32 output ``(x / 255 - mean) / std`` per channel (mean, std on the 0..1 scale)."""

    def __init__(
        self,
        mean: float | Sequence[float] = IMAGENET_MEAN,
        std: float | Sequence[float] = IMAGENET_STD,
        layout: str = "CHW",
    ) -> None:
        super().__init__(layout)
        m, s = np.atleast_1d(np.asarray(mean, np.float64)), np.atleast_1d(np.asarray(std, float))
        if not (np.isfinite(m).all() and np.isfinite(s).all() and (s > 0).all()) or (
            m.ndim != 1 or s.ndim != 1 or len({m.size, s.size} - {1}) > 1
        ):
            raise ConfigurationError(
                f"Normalize: mean={mean!r}, std={std!r} must be finite with std > 0. Fix: e.g. "
                "mean=IMAGENET_MEAN, std=IMAGENET_STD (0..1 scale)."
            )
        self.mean, self.std = m.tolist(), s.tolist()
        self._scale = np.broadcast_to(1 / (255 * s), (max(m.size, s.size),)).astype(np.float32)
        self._offset = np.broadcast_to(-m / s, self._scale.shape).astype(np.float32)

    @property
    def channels(self) -> int:
        """How many per-channel values were given (1: the same for all channels)."""
        return max(self._scale.size, self._offset.size)

    def __call__(self, hwc: np.ndarray) -> np.ndarray:
        scale, offset = self._scale, self._offset
        if self.layout == "CHW":
            hwc, scale, offset = hwc.transpose(2, 0, 1), scale[:, None, None], offset[:, None, None]
        out = np.multiply(hwc, scale, dtype=np.float32)
        out += offset
        return out


def is_geometry(step: Any) -> bool:
    """Whether ``step`` is a geometric step (it has ``plan(view, rng) -> View``)."""
    return callable(getattr(step, "plan", None))
