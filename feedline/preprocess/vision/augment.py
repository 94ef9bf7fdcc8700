"""Load-time image augmentation: decode + crop + flip + normalize, one sample at a time.

Pure functions of ``(encoded bytes, rng)``: no global random state, so a loader that hands
each sample the generator of its ``(seed, epoch, index)``
(:func:`feedline.loader.order.rng.sample_rng`) gets augmentation that differs per epoch, repeats on
a re-run and survives an exact resume, whatever the number of workers.

The torchvision names and sampling semantics, written on Pillow without torchvision::

    train = Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
                     Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    valid = Compose([Resize(256), CenterCrop(224), Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    out = train({"bytes": jpeg, "label": 3}, rng, index=17)   # {"bytes": float32 CHW, "label": 3}

Geometry first, pixels once: the geometric steps (:class:`RandomResizedCrop`,
:class:`Resize`, :class:`CenterCrop`, :class:`RandomHorizontalFlip`) only move a box over the
picture as displayed (EXIF orientation applied), read from the header, drawing from ``rng``
in the order given; then the image is decoded once, straight to that box and size, at the
smallest JPEG draft (DCT) scale that still covers the output
(:mod:`feedline.preprocess.vision.decode`). The geometry is identical with and without draft.
Then any ``fn(hwc_uint8, rng) -> array`` steps, then the output step (:class:`Normalize` to
float32, or :class:`ToArray` for uint8; CHW by default, as torchvision; HWC on request).

The steps live in :mod:`feedline.preprocess.vision.ops` (re-exported here); decoding in
:mod:`feedline.preprocess.vision.decode`. A :class:`Compose` holds no Pillow object, so it
pickles to process workers.

Bad images follow ``on_error``: ``"raise"`` raises :class:`~feedline.errors.DataError` naming
the sample index (and its path), ``"skip"`` returns a :class:`Skipped` marker, which the
caller drops, counts and reports (it is never silently lost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, DataError
from feedline.preprocess.vision.decode import (
    Undecodable,
    failure_reason,
    open_image,
    oriented_size,
    render,
)
from feedline.preprocess.vision.ops import (
    CenterCrop,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToArray,
    View,
    is_geometry,
)
from feedline.preprocess.vision.preprocessors import DEFAULT_MAX_PIXELS, _choose

__all__ = ["Compose", "Skipped"]

_MODES = {"RGB": 3, "L": 1, "RGBA": 4}
_RESAMPLE = ("bilinear", "bicubic", "lanczos", "hamming", "box", "nearest")


@dataclass(frozen=True)
class Skipped:
    """The marker :class:`Compose` returns for an undecodable image under ``on_error="skip"``:
    drop the sample, count it, report ``index``, ``path`` and ``reason``."""

    index: int | None
    path: str | None
    reason: str

    def __str__(self) -> str:
        where = f"sample {self.index}" + (f" ({self.path})" if self.path else "")
        return f"{where}: {self.reason}"


class Compose:
    """Decode and augment one sample: geometric steps, then array steps, then the output.

    Parameters
    ----------
    ops:
        In order: geometric steps (:class:`RandomResizedCrop`, :class:`Resize`,
        :class:`CenterCrop`, :class:`RandomHorizontalFlip`), then any ``fn(hwc_uint8, rng)
        -> hwc array`` steps, then at most one output step (:class:`Normalize` or
        :class:`ToArray`; default ``ToArray("CHW")``, uint8).
    key, output:
        The sample's field holding the encoded bytes; the field the result goes to
        (default: ``key``). A sample given as bytes returns the array alone.
    path_key:
        A field naming the file in messages, used when present.
    mode:
        ``"RGB"``, ``"L"`` or ``"RGBA"``: every image is converted to it (palette, CMYK,
        16-bit, alpha onto ``background``), so every output has the same channels.
    on_error:
        ``"raise"``: :class:`~feedline.errors.DataError` naming the sample; ``"skip"``:
        return :class:`Skipped`.
    resample, draft, max_pixels, background:
        Pillow filter of the single resize (``"bilinear"``, as torchvision); JPEG DCT-scaled
        decoding (exact geometry either way); the decompression-bomb limit; the colour under
        transparent pixels (``None``: alpha dropped).

    Examples
    --------
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (500, 400), (255, 0, 0)).save(buf, "JPEG")
    >>> train = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), Normalize()])
    >>> out = train({"bytes": buf.getvalue(), "label": 1}, np.random.default_rng(0), index=0)
    >>> out["bytes"].shape, out["bytes"].dtype, out["label"]
    ((3, 224, 224), dtype('float32'), 1)
    >>> Compose([Resize(256), CenterCrop(224)])(buf.getvalue()).shape
    (3, 224, 224)
    >>> Compose([CenterCrop(224)], on_error="skip")(b"", index=9)
    Skipped(index=9, path=None, reason='the file is empty (0 bytes)')
    """

    def __init__(
        self,
        ops: Sequence[Any],
        *,
        key: str = "bytes",
        output: str | None = None,
        path_key: str | None = "path",
        mode: str = "RGB",
        on_error: str = "raise",
        resample: str = "bilinear",
        draft: bool = True,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        background: Sequence[int] | None = (255, 255, 255),
    ) -> None:
        _choose("mode", mode, tuple(_MODES))
        _choose("on_error", on_error, ("raise", "skip"))
        _choose("resample", resample, _RESAMPLE)
        ops = list(ops)
        self.finish: ToArray = ops.pop() if ops and isinstance(ops[-1], ToArray) else ToArray()
        n_geo = next((i for i, op in enumerate(ops) if not is_geometry(op)), len(ops))
        self.geometry, self.steps = ops[:n_geo], ops[n_geo:]
        bad = [op for op in self.steps if is_geometry(op) or isinstance(op, ToArray)
               or not callable(op)]  # fmt: skip
        if bad:
            raise ConfigurationError(
                f"Compose: {bad[0]!r} is out of place. Fix: order the steps as geometric ones "
                "(crops, resizes, flips), then fn(array, rng) steps, then one Normalize/ToArray."
            )
        channels = getattr(self.finish, "channels", 1)
        if channels not in (1, _MODES[mode]):
            raise ConfigurationError(
                f"Compose: Normalize has {channels} channel values but mode={mode!r} gives "
                f"{_MODES[mode]} channels. Fix: one mean/std per channel (or one for all)."
            )
        self.key, self.output, self.path_key = key, output or key, path_key
        self.mode, self.on_error, self.resample, self.draft = mode, on_error, resample, draft
        self.max_pixels, self.background = max_pixels, background

    @property
    def random(self) -> bool:
        """Whether any step draws from ``rng`` (array steps are assumed to)."""
        return bool(self.steps) or any(getattr(op, "random", True) for op in self.geometry)

    def output_shape(self, size: tuple[int, int] | None = None) -> tuple[int, ...] | None:
        """The shape of every output (``None`` when it depends on the image: no fixed-size
        step last and no ``size`` (width, height) given)."""
        fixed = size is not None
        for op in self.geometry:
            if isinstance(op, RandomResizedCrop | CenterCrop) or (
                isinstance(op, Resize) and op.shorter is None
            ):
                fixed = True
            elif not isinstance(op, Resize | RandomHorizontalFlip):
                return None  # a geometric step of the user's: unknown
        if not fixed or self.steps:
            return None
        view = self.plan(size or (256, 256), np.random.default_rng(0))
        (w, h), c = view.size, _MODES[self.mode]
        return (c, h, w) if self.finish.layout == "CHW" else (h, w, c)

    def plan(self, size: tuple[int, int], rng: np.random.Generator | None) -> View:
        """The geometry for a picture of ``size`` (width, height, as displayed)."""
        self._check_rng(rng)
        view = View.of(*size)
        for op in self.geometry:
            view = op.plan(view, rng)
        return view

    def __call__(
        self,
        sample: Any,
        rng: np.random.Generator | None = None,
        *,
        index: int | None = None,
    ) -> Any:
        """Decode and augment ``sample``: a dict (its ``key`` field is decoded; the result is
        a new dict with the array under ``output``) or the encoded bytes (the array).

        ``rng`` is the sample's generator (:func:`feedline.loader.order.rng.sample_rng` of
        ``(seed, epoch, index)``; ``None`` when no step is random) and ``index`` its global
        row index, named in errors and in :class:`Skipped`. Returns :class:`Skipped` for an
        undecodable image under ``on_error="skip"``.
        """
        is_dict = isinstance(sample, dict)
        if is_dict and self.key not in sample:
            raise ConfigurationError(
                f"Compose: the sample has no field {self.key!r} (it has {sorted(sample)}). "
                "Fix: pass key= naming the column of encoded image bytes."
            )
        self._check_rng(rng)
        data = sample[self.key] if is_dict else sample
        path = sample.get(self.path_key) if is_dict and self.path_key else None
        try:
            im, orientation = open_image(data, max_pixels=self.max_pixels)
        except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds: all mean "bad"
            return self._bad(exc, index, path)
        with im:  # closed whatever happens
            view = self.plan(oriented_size(im, orientation), rng)
            try:
                picture, _ = render(im, orientation, view.box, view.size, mode=self.mode,
                                    background=self.background, resample=self.resample,
                                    draft=self.draft)  # fmt: skip
                hwc = np.asarray(picture)
            except Exception as exc:  # noqa: BLE001
                return self._bad(exc, index, path)
        if hwc.ndim == 2:
            hwc = hwc[:, :, None]
        if view.flip:
            hwc = hwc[:, ::-1]
        for step in self.steps:
            hwc = step(hwc, rng)
        out = self.finish(hwc)
        if not is_dict:
            return out
        result = dict(sample)
        result[self.output] = out
        return result

    def batch(
        self,
        samples: Sequence[Any],
        rngs: Sequence[np.random.Generator | None] | None = None,
        *,
        indices: Sequence[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[Skipped]]:
        """Decode and augment a batch in this thread, stacked.

        ``samples`` are encoded bytes or sample dicts, ``rngs`` one generator per sample
        (:func:`feedline.loader.order.rng.sample_rngs`; ``None`` when no step is random) and
        ``indices`` their global row indices (for messages). Returns the outputs of the kept
        samples ``(k, *shape)``, their positions in ``samples`` (int64) and the
        :class:`Skipped` ones (``on_error="skip"``; ``"raise"`` raises on the first).

        Examples
        --------
        >>> import io
        >>> from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (64, 48)).save(buf, "PNG")
        >>> images, kept, skipped = Compose([CenterCrop(32)], on_error="skip").batch(
        ...     [buf.getvalue(), b"oops", buf.getvalue()], indices=[10, 11, 12])
        >>> images.shape, kept.tolist(), [s.index for s in skipped]
        ((2, 3, 32, 32), [0, 2], [11])
        """
        rngs = [None] * len(samples) if rngs is None else rngs
        outs, kept, skipped = [], [], []
        for pos, (sample, rng) in enumerate(zip(samples, rngs, strict=True)):
            out = self(sample, rng, index=None if indices is None else int(indices[pos]))
            if isinstance(out, Skipped):
                skipped.append(out)
                continue
            outs.append(out[self.output] if isinstance(sample, dict) else out)
            kept.append(pos)
        shapes = {o.shape for o in outs}
        if len(shapes) > 1:
            raise ConfigurationError(
                f"Compose.batch: the outputs have different shapes {sorted(shapes)[:3]}. Fix: "
                "end the geometric steps with a fixed size (RandomResizedCrop, CenterCrop)."
            )
        if outs:
            images = np.stack(outs)
        else:
            shape = self.output_shape() or (0,)
            images = np.empty((0, *shape), np.float32 if isinstance(self.finish, Normalize)
                              else np.uint8)  # fmt: skip
        return images, np.asarray(kept, np.int64), skipped

    def _check_rng(self, rng: np.random.Generator | None) -> None:
        if rng is None and self.random:
            raise ConfigurationError(
                "Compose has random steps but got rng=None. Fix: pass the sample's generator, "
                "feedline.loader.order.rng.sample_rng(seed, epoch, index)."
            )

    def _bad(self, exc: BaseException, index: int | None, path: Any) -> Skipped:
        reason = failure_reason(exc)
        where = (f"sample {index}" if index is not None else "a sample") + (
            f" ({path})" if path is not None else "")  # fmt: skip
        if self.on_error == "raise":
            raise DataError(
                f"Cannot decode the image of {where}, field {self.key!r}: {reason}. Fix: remove "
                "or re-encode the file, or pass on_error='skip' to drop undecodable images "
                "(they are counted and reported)."
            ) from (None if isinstance(exc, Undecodable) else exc)
        return Skipped(index, None if path is None else str(path), reason)
