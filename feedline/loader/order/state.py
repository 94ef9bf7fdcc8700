"""The loader's checkpoint: a tiny JSON-safe dict, parsed and validated field by field.

``Loader.state_dict()`` writes :meth:`State.as_dict`; ``Loader.load_state_dict()`` reads it
back with :func:`parse_states` (types, ranges, keys, version: nothing about the data) and
then :func:`check_position` (against the dataset it resumes on: its fingerprint, its size,
and how many batches an epoch of the state's layout can hold). Every problem is a
:class:`~feedline.errors.ConfigurationError` naming the field, the two values and the fix,
so a damaged checkpoint never silently replays or skips samples.

Version history: 1 had no ``fingerprint``; 2 adds it (the manifest's shard-checksum
fingerprint; an earlier feedline wrote ``None`` for data that was never written, which now
has a fingerprint of its own: see :mod:`feedline.loader.data.fingerprint`). A state without
one (version 1, or ``None``) names no dataset, so it is refused unless the caller opts in
(``Loader.load_state_dict(state, check_dataset=False)``); its sample count is still checked.

Version 3 has the keys of 2; it marks the exact shuffle of more than
:data:`~feedline.loader.order.sample_order.LAZY_ROWS` rows as the lazily evaluated permutation
(earlier versions drew another one): a version 1 or 2 state of such a dataset taken mid-epoch
is refused (:func:`~feedline.loader.order.resume.restore`), one at an epoch boundary resumes.

Counts (``epoch``, ``batches``, ``num_samples``, ``batch_size``, ``shuffle_window``, a
segment's ``consumed``) are ints in ``[0, MAX_COUNT]`` (``2**62 - 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.checks import MAX_COUNT, checked_int

__all__ = [
    "MAX_WORLD_SIZE",
    "STATE_VERSION",
    "Segment",
    "State",
    "check_position",
    "epoch_batches",
    "parse_states",
    "real_samples",
    "remaining_samples",
]

STATE_VERSION = 3
#: more ranks than any training job has; bounds the per-rank lists a state implies
MAX_WORLD_SIZE = 1 << 20
_KEYS: dict[int, tuple[str, ...]] = {
    1: ("version", "seed", "epoch", "batches", "rank", "world_size", "batch_size", "drop_last",
        "shuffle", "shuffle_window", "num_samples", "history"),
}  # fmt: skip
_KEYS[2] = (*_KEYS[1], "fingerprint")
_KEYS[3] = _KEYS[2]
_SEGMENT_KEYS = ("world_size", "batch_size", "drop_last", "consumed")
_UNCHANGED = (
    "pass the dict Loader.state_dict() returned, unchanged (a JSON or torch.save round trip "
    "keeps it valid)."
)


def _fail(field: str, value: Any, expected: str) -> ConfigurationError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ConfigurationError(
        f"Loader state field {field!r} is {shown} ({type(value).__name__}); expected {expected}. "
        f"Fix: {_UNCHANGED}"
    )


def _int(value: Any, field: str, low: int, high: int | None = MAX_COUNT) -> int:
    return checked_int(value, low, high, fail=lambda expected: _fail(field, value, expected))


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise _fail(field, value, "true or false")
    return bool(value)


def _keys(doc: Any, keys: Sequence[str], what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ConfigurationError(
            f"Not a feedline loader state{what}: expected a dict with keys {list(keys)}, got "
            f"{type(doc).__name__} {str(doc)[:120]!r}. Fix: {_UNCHANGED} Loader.state_dict() "
            "is the only source of states."
        )
    missing = [k for k in keys if k not in doc]
    extra = sorted(str(k) for k in doc if k not in keys)
    if missing or extra:
        raise ConfigurationError(
            f"Not a feedline loader state{what}: missing keys {missing}, unexpected keys "
            f"{extra} (expected exactly {list(keys)}). Fix: {_UNCHANGED} Loader.state_dict() "
            "is the only source of states."
        )
    return doc


@dataclass(frozen=True)
class Segment:
    """A finished part of an epoch: a world layout and the samples each of its ranks yielded."""

    world_size: int
    batch_size: int
    drop_last: bool
    consumed: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "consumed": list(self.consumed),
        }

    @classmethod
    def from_dict(cls, doc: Any, at: str = "history[0].") -> Segment:
        """The segment ``doc`` describes, validated (``at`` names it in errors)."""
        doc = _keys(doc, _SEGMENT_KEYS, f" segment ({at[:-1]})")
        world = _int(doc["world_size"], at + "world_size", 1, MAX_WORLD_SIZE)
        batch = _int(doc["batch_size"], at + "batch_size", 1)
        drop, consumed = _bool(doc["drop_last"], at + "drop_last"), doc["consumed"]
        if not isinstance(consumed, list | tuple) or len(consumed) != world:
            raise _fail(at + "consumed", consumed, f"a list of {world} sample counts (one a rank)")
        counts = tuple(_int(c, f"{at}consumed[{r}]", 0) for r, c in enumerate(consumed))
        return cls(world, batch, drop, counts)


@dataclass(frozen=True)
class State:
    """A parsed loader state (see :meth:`Loader.state_dict <feedline.loader.Loader>`)."""

    seed: int
    epoch: int
    batches: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    shuffle: bool
    shuffle_window: int | None
    num_samples: int
    history: tuple[Segment, ...]
    fingerprint: str | None
    #: the version it was written with (:data:`STATE_VERSION` for a new one)
    version: int = STATE_VERSION

    def as_dict(self) -> dict[str, Any]:
        """The JSON-safe dict ``Loader.state_dict()`` returns.

        Examples
        --------
        >>> s = State(0, 1, 2, 0, 1, 4, True, True, None, 10, (), None)
        >>> parse_states(s.as_dict())[0] == s
        True
        """
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "batches": self.batches,
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            "num_samples": self.num_samples,
            "history": [s.as_dict() for s in self.history],
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> State:
        """Parse and validate one state dict (its own consistency, not the dataset's)."""
        has_version = isinstance(doc, Mapping) and "version" in doc
        version = doc["version"] if has_version else STATE_VERSION
        integer = isinstance(version, int | np.integer) and not isinstance(version, bool)
        if has_version and (not integer or version not in _KEYS):
            raise ConfigurationError(
                f"Loader state version {version!r} is not supported (this feedline reads "
                f"versions {sorted(_KEYS)} and writes {STATE_VERSION}). Fix: resume with the "
                "feedline version that saved it, or start the epoch over without the state."
            )
        doc = _keys(doc, _KEYS[int(version)], "")
        world = _int(doc["world_size"], "world_size", 1, MAX_WORLD_SIZE)
        window = doc["shuffle_window"]
        history = doc["history"]
        if not isinstance(history, list | tuple):
            raise _fail("history", history, "a list of finished segments")
        fingerprint = doc.get("fingerprint")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise _fail("fingerprint", fingerprint, "a string or null")
        return cls(
            seed=_int(doc["seed"], "seed", 0, None),  # any seed a loader takes
            epoch=_int(doc["epoch"], "epoch", 0),
            batches=_int(doc["batches"], "batches", 0),
            rank=_int(doc["rank"], "rank", 0, world - 1),
            world_size=world,
            batch_size=_int(doc["batch_size"], "batch_size", 1),
            drop_last=_bool(doc["drop_last"], "drop_last"),
            shuffle=_bool(doc["shuffle"], "shuffle"),
            shuffle_window=None if window is None else _int(window, "shuffle_window", 1),
            num_samples=_int(doc["num_samples"], "num_samples", 0),
            history=tuple(Segment.from_dict(h, f"history[{i}].") for i, h in enumerate(history)),
            fingerprint=fingerprint,
            version=int(version),
        )


def parse_states(states: Any) -> list[State]:
    """One state, or one per old rank, parsed, validated and checked to be one checkpoint.

    Examples
    --------
    >>> parse_states({"version": 2, "seed": 0, "epoch": 0, "batches": -5})
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Not a feedline loader state: missing keys [...
    """
    if isinstance(states, State):
        return [states]
    if isinstance(states, Mapping) or not isinstance(states, Sequence) or isinstance(
        states, str | bytes
    ):  # fmt: skip
        return [State.from_dict(states)]
    items = [s if isinstance(s, State) else State.from_dict(s) for s in states]
    if not items:
        raise ConfigurationError(
            "load_state_dict() got an empty list of states. Fix: pass the state_dict() of "
            "every rank (or one state)."
        )
    first = items[0]
    for s in items[1:]:
        for key in State.__dataclass_fields__:
            if key not in ("rank", "batches") and getattr(s, key) != getattr(first, key):
                raise ConfigurationError(
                    f"The loader states disagree on {key!r} ({getattr(s, key)!r} vs "
                    f"{getattr(first, key)!r}). Fix: pass the states of one checkpoint, one "
                    "per rank."
                )
    ranks = sorted(s.rank for s in items)
    if len(items) > 1 and ranks != list(range(first.world_size)):
        raise ConfigurationError(
            f"Got states for ranks {ranks} of a world of {first.world_size}. Fix: pass one "
            "state per old rank (or a single state when all ranks yielded as many batches)."
        )
    return items


def epoch_batches(n: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Batches per rank in an epoch of ``n`` samples under this layout.

    Examples
    --------
    >>> epoch_batches(10, 2, 3, True), epoch_batches(10, 2, 3, False)
    (1, 2)
    """
    step = world_size * batch_size
    return n // step if drop_last else -(-n // step)


def real_samples(n: int, rank: int, count: int, world_size: int, batch_size: int) -> int:
    """How many of ``rank``'s first ``count`` samples are real ones, not padding repeats.

    In the layout of :mod:`feedline.loader.order.sample_order` rank ``r``'s ``k``-th batch
    takes global positions ``k * world_size * batch_size + r * batch_size`` onwards;
    positions past ``n`` pad the epoch. Arithmetic only, so a huge padded layout costs nothing.

    Examples
    --------
    >>> real_samples(10, rank=1, count=4, world_size=2, batch_size=3)  # positions 3-5, 9
    4
    >>> real_samples(10, rank=1, count=6, world_size=2, batch_size=3)  # 10, 11 are padding
    4
    """
    left = n - rank * batch_size
    if left <= 0:
        return 0
    step = world_size * batch_size
    full = (left - batch_size) // step + 1 if left >= batch_size else 0
    return min(count, full * batch_size + min(max(left - full * step, 0), batch_size))


def remaining_samples(n: int, history: Sequence[Segment]) -> int:
    """Samples of an ``n``-sample epoch that no rank of the finished ``history`` yielded.

    Examples
    --------
    >>> remaining_samples(12, [Segment(2, 2, True, (2, 2))])
    8
    """
    for seg in history:
        n -= sum(real_samples(n, r, c, seg.world_size, seg.batch_size)
                 for r, c in enumerate(seg.consumed))  # fmt: skip
    return n


def check_position(
    state: State, *, num_samples: int, fingerprint: str | None, check_dataset: bool = True
) -> None:
    """Refuse ``state`` unless it was taken on this dataset and its position fits the epoch.

    ``fingerprint`` is this dataset's. A state must carry the same one; a state without
    one (version 1, or ``None``) is refused too, since nothing says which data it was taken
    on, unless ``check_dataset=False`` (then the fingerprints are not compared; the sample
    count always is).

    Examples
    --------
    >>> s = State(0, 0, 9, 0, 1, 4, True, True, None, 10, (), "fp")
    >>> check_position(s, num_samples=10, fingerprint="fp")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader state field 'batches' is 9, but an epoch ...
    >>> check_position(State(0, 0, 1, 0, 1, 4, True, True, None, 10, (), None), num_samples=10,
    ...                fingerprint="fp")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader state field 'fingerprint' is missing: ...
    """
    if state.num_samples != num_samples:
        raise ConfigurationError(
            f"Loader state field 'num_samples' differs: the state is for {state.num_samples} "
            f"samples but this dataset has {num_samples}. Fix: resume on the dataset the "
            "checkpoint was taken on, with the same columns/windows."
        )
    if check_dataset and state.fingerprint is None:
        raise ConfigurationError(
            "Loader state field 'fingerprint' is missing: the state (a version-1 state, or one "
            "an earlier feedline took on in-memory data) does not say which dataset it was "
            f"taken on, and this loader reads {fingerprint!r}; on other data of the same size "
            "its positions would name other samples. Fix: resume with a state taken by this "
            "feedline, or, if you know the state was taken on this very data, pass "
            "load_state_dict(state, check_dataset=False)."
        )
    if check_dataset and state.fingerprint != fingerprint:
        raise ConfigurationError(
            f"Loader state field 'fingerprint' differs: the state was taken on the dataset "
            f"{state.fingerprint!r} but this loader reads {fingerprint!r} (the fingerprint of "
            "the manifest's shard checksums, or of the data itself when it was never written: "
            "see feedline.loader.data.fingerprint), so its positions would name other samples. "
            "Fix: resume on the dataset the checkpoint was taken on (fl.open of the same "
            "written path), with the columns, stack= and dtype= of the checkpoint's loader, or "
            "start the epoch over without load_state_dict()."
        )
    n = num_samples
    for i, seg in enumerate(state.history):
        share = epoch_batches(n, seg.world_size, seg.batch_size, seg.drop_last) * seg.batch_size
        for r, c in enumerate(seg.consumed):
            if c > share:
                raise ConfigurationError(
                    f"Loader state field 'history[{i}].consumed[{r}]' is {c}, but rank {r} of "
                    f"that segment had only {share} samples (world_size={seg.world_size}, "
                    f"batch_size={seg.batch_size}, {n} samples left). Fix: {_UNCHANGED}"
                )
        n = remaining_samples(n, [seg])
    limit = epoch_batches(n, state.world_size, state.batch_size, state.drop_last)
    if state.batches > limit:
        raise ConfigurationError(
            f"Loader state field 'batches' is {state.batches}, but an epoch of this layout "
            f"(world_size={state.world_size}, batch_size={state.batch_size}, "
            f"drop_last={state.drop_last}, {n} samples) has {limit} batches per rank. "
            f"Fix: {_UNCHANGED}"
        )
