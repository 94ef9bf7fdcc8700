"""Applying a user transform to a batch's samples, and stacking the samples into a batch.

Shared by the inline, thread and process paths of :class:`~feedline.loader.nodes.Map` (a
worker process imports this module, so it stays light: NumPy and feedline's errors).

- Per sample: ``fn(sample: dict, rng: np.random.Generator) -> dict``, ``rng`` being
  :func:`~feedline.loader.order.rng.sample_rng` of ``(seed, epoch, global row index)``; a function
  with an ``index`` parameter also gets the row index (for messages). Returning a
  :class:`~feedline.preprocess.vision.augment.Skipped` marker drops the sample (counted).
- Per batch (``batched=True``): ``fn(batch: dict, rngs: SampleRngs) -> dict``, ``rngs[i]``
  being sample ``i``'s generator (built on first use) and ``rngs.uniforms(k)`` an ``(n, k)``
  array of uniform draws keyed the same way (vectorized, :func:`~feedline.loader.order.rng.
  sample_uniforms`).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from feedline.errors import FeedlineError, UserFunctionError
from feedline.loader.nodes.progress import Progress
from feedline.loader.order.rng import sample_rng, sample_uniforms
from feedline.preprocess.vision.augment import Skipped

__all__ = ["SampleRngs", "Stacker", "add_note", "apply_batch", "apply_samples", "as_error",
           "collate_samples", "is_skipped", "takes_index"]  # fmt: skip

_FIX_SHAPES = (
    "Fix: make the transform return arrays of one shape and dtype per key (e.g. crop or "
    "resize images to a fixed size), or return lists/strings for ragged values."
)


class SampleRngs(Sequence[np.random.Generator]):
    """The per-sample generators of a batch, built on first use (about 20 µs each).

    Examples
    --------
    >>> rngs = SampleRngs(seed=0, epoch=1, indices=np.array([7, 3]))
    >>> len(rngs), rngs[0].random() == sample_rng(0, 1, 7).random()
    (2, True)
    >>> rngs.uniforms(2).shape
    (2, 2)
    """

    def __init__(self, seed: int, epoch: int, indices: np.ndarray) -> None:
        self.seed, self.epoch, self.indices = int(seed), int(epoch), np.asarray(indices)
        self._made: dict[int, np.random.Generator] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        if i not in self._made:
            self._made[i] = sample_rng(self.seed, self.epoch, int(self.indices[i]))
        return self._made[i]

    def uniforms(self, draws: int = 1) -> np.ndarray:
        """``(len(self), draws)`` uniform ``[0, 1)`` draws, one row per sample."""
        return sample_uniforms(self.seed, self.epoch, self.indices, draws)


class Stacker:
    """The arrays of one batch, filled by the chunks of its samples in place.

    Each chunk of a batch (the rows ``[start, start + k)``) stacks its samples' results
    straight into the batch's array of each key (:meth:`place`), made by the first chunk to
    get there: joining the chunks then costs nothing when no sample was skipped, where
    stacking per chunk and concatenating copied every output twice (the concatenation ran in
    the single thread that hands batches over, so it bounded what more worker threads could
    give). Thread-safe.

    Examples
    --------
    >>> stacker = Stacker(4)
    >>> part = stacker.place("x", [np.zeros(2), np.ones(2)], start=2)
    >>> part.shape, stacker.arrays["x"][2:].tolist()
    ((2, 2), [[0.0, 0.0], [1.0, 1.0]])
    """

    def __init__(self, rows: int) -> None:
        self.rows = int(rows)
        self.arrays: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def place(self, key: str, values: Sequence[np.ndarray], start: int) -> np.ndarray | None:
        """Stack ``values`` into rows ``[start, start + len(values))`` of ``key``'s array
        and return those rows (a view); ``None`` (nothing written) when the values do not
        share the array's shape and dtype: the caller stacks them on its own."""
        first = values[0]
        shape, dtype = first.shape, first.dtype
        if dtype.kind not in "biufc" or any(
            not isinstance(v, np.ndarray) or v.shape != shape or v.dtype != dtype for v in values
        ):  # mixed values: np.stack's own promotion (or its error) decides
            return None
        with self._lock:
            array = self.arrays.get(key)
            if array is None:
                array = self.arrays[key] = np.empty((self.rows, *shape), dtype)
        if array.shape[1:] != shape or array.dtype != dtype or start + len(values) > self.rows:
            return None
        rows = array[start : start + len(values)]
        np.stack(values, out=rows)
        return rows


def takes_index(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts an ``index`` keyword (then it gets the sample's row index)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "index" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def is_skipped(value: Any) -> bool:
    """Whether a transform's result is the marker that drops its sample."""

    return isinstance(value, Skipped)


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def apply_samples(
    fn: Callable[..., Any],
    columns: Mapping[str, Any],
    indices: np.ndarray,
    *,
    seed: int,
    epoch: int,
    with_index: bool,
    progress: Progress | None = None,
) -> tuple[list[dict[str, Any]], list[int], list[Any]]:
    """``fn`` on every sample: ``(results kept, positions skipped, their markers)``.

    An exception from ``fn`` gets a note naming the sample (row index, epoch) and propagates.
    ``progress`` (if given) is told which sample each call is on, when it starts.

    Examples
    --------
    >>> out, skipped, _ = apply_samples(lambda s, rng: {"y": s["x"] * 2},
    ...                                 {"x": np.arange(3)}, np.arange(3), seed=0, epoch=0,
    ...                                 with_index=False)
    >>> [int(o["y"]) for o in out], skipped
    ([0, 2, 4], [])
    """
    kept: list[dict[str, Any]] = []
    skipped: list[int] = []
    markers: list[Any] = []
    names = list(columns)
    values = [columns[n] for n in names]
    for i, index in enumerate(indices.tolist()):
        sample = {n: v[i] for n, v in zip(names, values, strict=True)}
        rng = sample_rng(seed, epoch, index)
        if progress is not None:
            progress.begin(i)
        try:
            result = fn(sample, rng, index=index) if with_index else fn(sample, rng)
        except Exception as exc:
            add_note(exc, f"(in the loader's transform {_describe(fn)}, on the sample at row "
                          f"index {index}, epoch {epoch})")  # fmt: skip
            raise
        if is_skipped(result):
            skipped.append(i)
            markers.append(result)
            continue
        if not isinstance(result, Mapping):
            raise UserFunctionError(
                f"The loader's transform {_describe(fn)} returned {type(result).__name__} for "
                f"the sample at row index {index}; it must return a dict of the sample's "
                "fields (or a feedline.preprocess.vision.augment.Skipped marker to drop the "
                "sample). Fix: return the (modified) sample dict."
            )
        kept.append(dict(result))
    return kept, skipped, markers


def apply_batch(
    fn: Callable[..., Any],
    columns: Mapping[str, Any],
    indices: np.ndarray,
    *,
    seed: int,
    epoch: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``fn(batch, rngs)`` for ``batched=True``; the result must keep one row per sample.

    ``progress`` (if given) is told when the call starts (position 0).

    Examples
    --------
    >>> apply_batch(lambda b, rngs: {"y": b["x"] + 1}, {"x": np.arange(3)}, np.arange(3),
    ...             seed=0, epoch=0)["y"].tolist()
    [1, 2, 3]
    """
    if progress is not None:
        progress.begin(0)
    try:
        result = fn(dict(columns), SampleRngs(seed, epoch, indices))
    except Exception as exc:
        add_note(exc, f"(in the loader's batched transform {_describe(fn)}, on a batch of "
                      f"{len(indices)} samples of epoch {epoch})")  # fmt: skip
        raise
    if not isinstance(result, Mapping):
        raise UserFunctionError(
            f"The loader's batched transform {_describe(fn)} returned {type(result).__name__}; "
            "it must return a dict of columns. Fix: return {name: array with one row per "
            "sample}."
        )
    out = {}
    for name, value in result.items():
        value = _to_numpy(value)
        if len(value) != len(indices):
            raise UserFunctionError(
                f"The loader's batched transform {_describe(fn)} returned {len(value)} rows "
                f"for {name!r} but the batch has {len(indices)} samples. Fix: return one row "
                "per sample (drop samples per sample instead: batched=False and a Skipped "
                "marker)."
            )
        out[name] = value
    return out


def _to_numpy(value: Any) -> Any:
    """Tensors (torch, ...) to NumPy; arrays and lists as they are."""
    if isinstance(value, np.ndarray | list):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        return value.detach().cpu().numpy()
    if hasattr(value, "__array__"):
        return np.asarray(value)
    return value


def _stackable(value: Any) -> bool:
    return isinstance(value, np.ndarray | np.generic | bool | int | float | complex)


def collate_samples(
    samples: Sequence[Mapping[str, Any]], where: str = "", *,
    into: tuple[Stacker, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Stack sample dicts into a batch: arrays and numbers → one array, others → a list.

    ``into``: a batch's :class:`Stacker` and the first row of these samples in the batch:
    arrays of one shape and dtype are stacked straight into the batch's arrays (the result
    holds views of them).

    Raises
    ------
    UserFunctionError
        When samples disagree on their keys, or a key's arrays on shape or dtype kind.

    Examples
    --------
    >>> b = collate_samples([{"x": np.zeros(2), "y": 1, "s": "a"},
    ...                      {"x": np.ones(2), "y": 2, "s": "b"}])
    >>> b["x"].shape, b["y"].tolist(), b["s"]
    ((2, 2), [1, 2], ['a', 'b'])
    """
    if not samples:
        return {}
    keys = list(samples[0])
    out: dict[str, Any] = {}
    for s in samples[1:]:
        if len(s) != len(keys) or any(k not in s for k in keys):
            raise UserFunctionError(
                f"The loader's transform{where} returned samples with different keys "
                f"({sorted(samples[0])} and {sorted(s)}). Fix: return the same keys for every "
                "sample."
            )
    for key in keys:
        values = [_to_numpy(s[key]) for s in samples]
        if all(_stackable(v) for v in values):
            shapes = {np.shape(v) for v in values}
            if len(shapes) > 1:
                raise UserFunctionError(
                    f"The loader's transform{where} returned {key!r} with different shapes "
                    f"{sorted(shapes)[:3]} in one batch. {_FIX_SHAPES}"
                )
            placed = None
            if into is not None and isinstance(values[0], np.ndarray):
                placed = into[0].place(key, values, into[1])
            if placed is not None:
                out[key] = placed
                continue
            try:
                out[key] = np.stack(values) if isinstance(values[0], np.ndarray) else (
                    np.asarray(values))  # fmt: skip
            except (TypeError, ValueError) as exc:
                raise UserFunctionError(
                    f"The loader's transform{where} returned {key!r} values that cannot be "
                    f"stacked ({exc}). {_FIX_SHAPES}"
                ) from exc
        else:
            out[key] = values
    return out


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` where Python has it (3.11+); on 3.10 the note is left out.

    Examples
    --------
    >>> error = ValueError("bad")
    >>> add_note(error, "on row 3")  # on 3.11+: error.__notes__ == ["on row 3"]
    """
    if sys.version_info >= (3, 11):
        exc.add_note(note)


def as_error(exc: BaseException) -> BaseException:
    """A feedline error for ``exc`` raised by a user transform (feedline's own pass as is)."""
    if isinstance(exc, FeedlineError):
        return exc
    error = UserFunctionError(
        f"The loader's transform raised {type(exc).__name__}: {exc}. Fix: correct the "
        "transform (its traceback is chained below; the note names the sample), or drop bad "
        "samples by returning a feedline.preprocess.vision.augment.Skipped marker."
    )
    error.__cause__ = exc
    return error
