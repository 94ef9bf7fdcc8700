"""Per-sample randomness: pure functions of ``(seed, epoch, sample index)``.

A random transform (crop, flip, noise) draws from a generator keyed by the sample's global
row index, never from a shared stream, so its draws do not depend on worker count, worker
timing, batch composition or where a run resumed: the same ``(seed, epoch, index)`` gives the
same augmented sample on every run, another epoch gives another one.

- :func:`sample_rng`: one NumPy ``Generator`` (PCG64) per sample, from
  ``SeedSequence([seed, epoch, index])``. About 20 µs to build: negligible next to a JPEG
  decode (about 1 ms), noticeable for a cheap per-sample function over large batches.
- :func:`sample_rngs`: the same generators for a batch of indices (one per index).
- :func:`sample_uniforms`: vectorized, about 10 ns per draw: an ``(n, k)`` array of uniform
  ``[0, 1)`` floats, a pure function of ``(seed, epoch, index, j)`` (a SplitMix64 counter
  hash keyed through ``SeedSequence``), for per-batch transforms (e.g. flip these rows).

The streams are separated from the shuffle's (``order.py`` keys ``SeedSequence([seed, epoch,
tag])``) by a spawn key, so a sample's draws never coincide with the epoch permutation's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.checks import checked_int

__all__ = ["sample_rng", "sample_rngs", "sample_uniforms"]

# Spawn keys that keep these streams apart from each other and from order.py's.
_SAMPLE, _UNIFORMS = 0x53414D50, 0x554E4946
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FIX = "pass non-negative integers (the loader's seed, the epoch and the global row index)."


def _non_negative(name: str, value: Any) -> int:
    def fail(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"sample_rng: {name} must be {expected}, got {value!r} ({type(value).__name__}). "
            f"Fix: {_FIX}"
        )

    return checked_int(value, 0, fail=fail)


def _indices(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(indices)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ConfigurationError(
            f"sample indices must be a 1-D integer array, got shape {arr.shape} dtype "
            f"{arr.dtype}. Fix: pass the batch's global row indices."
        )
    if arr.size and int(arr.min()) < 0:
        raise ConfigurationError(
            f"sample indices must be >= 0, got {int(arr.min())}. Fix: pass the batch's global "
            "row indices."
        )
    return arr.astype(np.uint64)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of sample ``index`` in ``epoch``: ``SeedSequence([seed, epoch, index])``.

    Parameters
    ----------
    seed:
        The loader's seed (>= 0).
    epoch:
        The epoch (>= 0): another epoch gives other draws for the same sample.
    index:
        The sample's global row index in the dataset (>= 0), not its position in a batch.

    Examples
    --------
    >>> a = sample_rng(0, epoch=0, index=7).integers(0, 1000, 3)
    >>> b = sample_rng(0, epoch=0, index=7).integers(0, 1000, 3)
    >>> c = sample_rng(0, epoch=1, index=7).integers(0, 1000, 3)
    >>> bool((a == b).all()), bool((a == c).all())
    (True, False)
    """
    key = [_non_negative("seed", seed), _non_negative("epoch", epoch),
           _non_negative("index", index)]  # fmt: skip
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key, spawn_key=(_SAMPLE,))))


def sample_rngs(
    seed: int, epoch: int, indices: Sequence[int] | np.ndarray
) -> list[np.random.Generator]:
    """:func:`sample_rng` for each of ``indices`` (a batch's global row indices), in order.

    Examples
    --------
    >>> rngs = sample_rngs(0, 0, [7, 3])
    >>> rngs[0].random() == sample_rng(0, 0, 7).random()
    True
    """
    s, e = _non_negative("seed", seed), _non_negative("epoch", epoch)
    return [
        np.random.Generator(np.random.PCG64(np.random.SeedSequence([s, e, int(i)],
                                                                   spawn_key=(_SAMPLE,))))
        for i in _indices(indices)
    ]  # fmt: skip


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (a bijection; arithmetic wraps mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_uniforms(
    seed: int, epoch: int, indices: Sequence[int] | np.ndarray, draws: int = 1
) -> np.ndarray:
    """Uniform ``[0, 1)`` float64 draws, ``draws`` per sample, shape ``(len(indices), draws)``.

    Vectorized (no Python loop over samples): row ``i`` depends only on ``(seed, epoch,
    indices[i])`` and column ``j`` on ``j`` too, so a sample's draws are the same whichever
    batch it is in and however many columns are asked for (the first ``k`` columns of a wider
    request are equal). Each sample's key is a SplitMix64 hash of its index under a 128-bit
    key from ``SeedSequence([seed, epoch])``; column ``j`` is the ``j``-th output of SplitMix64
    from that key (53-bit floats). These are not :func:`sample_rng`'s draws.

    Examples
    --------
    >>> u = sample_uniforms(0, 0, [5, 9, 5], draws=2)
    >>> u.shape, bool((u[0] == u[2]).all()), bool((0 <= u).all() and (u < 1).all())
    ((3, 2), True, True)
    >>> flip = sample_uniforms(0, 0, [5, 9, 5])[:, 0] < 0.5   # e.g. which rows to flip
    """
    s, e = _non_negative("seed", seed), _non_negative("epoch", epoch)
    k = _non_negative("draws", draws)
    idx = _indices(indices)
    a, b = np.random.SeedSequence([s, e], spawn_key=(_UNIFORMS,)).generate_state(2, np.uint64)
    key = _mix(_mix(idx ^ a) + b)
    steps = np.arange(1, k + 1, dtype=np.uint64) * _GOLDEN
    bits = _mix(key[:, None] + steps[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
