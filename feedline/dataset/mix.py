"""``fl.mix``: several datasets read as one weighted, deterministic, resumable stream."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedline.errors import ConfigurationError
from feedline.loader.loader import Loader
from feedline.loader.mixing.mixed_loader import MixedLoader, Stop, check_stop
from feedline.loader.packing.packed_loader import PackedLoader
from feedline.loader.packing.spec import Packing

__all__ = ["Mix", "mix"]


class Mix:
    """Sources with weights (what :func:`mix` returns); ``.loader(...)`` reads the mix."""

    def __init__(self, sources: Mapping[str, Any], weights: Mapping[str, float] | None, *,
                 seed: int, stop: Stop, window: int) -> None:  # fmt: skip
        if not isinstance(sources, Mapping) or not sources:
            raise ConfigurationError(
                f"fl.mix: sources must be a non-empty dict of name -> dataset, got "
                f"{type(sources).__name__}. Fix: fl.mix({{'web': ds_a, 'code': ds_b}}, ...)."
            )
        self.sources = {str(k): v for k, v in sources.items()}
        self.weights = dict(weights) if weights is not None else dict.fromkeys(self.sources, 1.0)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ConfigurationError(f"fl.mix: window={window!r}; expected an int >= 1 "
                                     "(positions per window of the schedule). Fix: pass "
                                     "e.g. window=256.")  # fmt: skip
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigurationError(f"fl.mix: seed={seed!r}; expected an int >= 0. Fix: pass "
                                     "e.g. seed=0.")  # fmt: skip
        self.seed, self.stop, self.window = seed, check_stop(stop), window

    def loader(self, batch_size: int = 256, *, rank: int | None = None,
               world_size: int | None = None, drop_last: bool = True,
               format: str = "torch",  # noqa: A002 (the loaders' option name)
               transform: Callable[..., Any] | None = None, batched: bool = False,
               num_workers: int | str = 0, worker_type: str = "thread",
               prefetch: int | str = 2,
               pack: Packing | None = None, **source_options: Any) -> Any:  # fmt: skip
        """A loader of the mixed stream: batches with a ``source`` column, ``state_dict()``
        / ``load_state_dict(state, weights=...)``, ``set_weights``, ``set_epoch`` and
        ``metrics()`` (see :class:`~feedline.loader.mixing.mixed_loader.MixedLoader`).

        ``source_options`` (``columns``, ``cache``, ``memory_budget``, ``ragged``, ...) go to
        each source's :class:`~feedline.loader.Loader`, which caches its samples. With
        ``pack=fl.Packing(...)`` the batches are packed rows of the mixed documents
        (resumable on as many ranks; see :mod:`feedline.loader.packing.packed_loader`).

        Examples
        --------
        >>> import feedline as fl
        >>> m = fl.mix({"a": fl.range(6), "b": fl.range(4)}, weights={"a": 3, "b": 1},
        ...            seed=0, window=4)
        >>> loader = m.loader(batch_size=4, format="numpy")
        >>> sorted(next(iter(loader))["source"].tolist())  # 3 of "a" to 1 of "b" a window
        [0, 0, 0, 1]
        """
        refused = sorted({"seed", "shuffle", "windows"} & set(source_options))
        if refused:
            raise ConfigurationError(
                f"fl.mix(...).loader: {refused} cannot be set per loader of a mix (the mix is "
                "always shuffled, by fl.mix's seed; windows= does not mix). Fix: pass "
                "seed= to fl.mix and leave these out."
            )
        if pack is not None:
            return self._packed(pack, batch_size, rank, world_size, drop_last, format,
                                transform, batched, num_workers, worker_type,
                                source_options)  # fmt: skip
        padding_mask = bool(source_options.pop("return_padding_mask", False))
        if transform is not None:
            source_options.setdefault("strings", "list")
        names = list(self.sources)
        loaders = [Loader(_opened(self.sources[n]), batch_size=batch_size, rank=rank,
                          world_size=world_size, seed=self.seed, format="numpy", prefetch=0,
                          drop_last=False, **source_options) for n in names]  # fmt: skip
        return MixedLoader(names, loaders, _weights(self.weights, names), seed=self.seed,
                           stop=self.stop, window=self.window, batch_size=batch_size,
                           drop_last=drop_last, fmt=format, transform=transform,
                           batched=batched, num_workers=num_workers, worker_type=worker_type,
                           prefetch=prefetch, padding_mask=padding_mask)  # fmt: skip

    def _packed(self, pack: Packing, batch_size: int, rank: int | None, world_size: int | None,
                drop_last: bool, fmt: str, transform: Callable[..., Any] | None, batched: bool,
                num_workers: int | str, worker_type: str,
                source_options: dict[str, Any]) -> PackedLoader:  # fmt: skip
        ragged = source_options.pop("ragged", {})
        ragged = ragged if isinstance(ragged, Mapping) else {}
        if transform is None:
            source_options.setdefault("columns", [pack.column])
            source_options["ragged"] = {**ragged, pack.column: "list"}

        def make_docs(r: int | None, w: int | None) -> MixedLoader:
            # the packer leaves out the repeats marked in "_padded" (never a document twice)
            return self.loader(pack.buffer_size, rank=r, world_size=w, drop_last=False,
                               format="numpy", transform=transform, batched=batched,
                               num_workers=num_workers, worker_type=worker_type, prefetch=0,
                               return_padding_mask=True, **source_options)  # fmt: skip

        docs = make_docs(rank, world_size)
        return PackedLoader(docs, make_docs, pack, batch_size=batch_size, drop_last=drop_last,
                            fmt=fmt)  # fmt: skip


def _opened(source: Any) -> Any:
    return os.fspath(source) if isinstance(source, os.PathLike) else source


def _weights(weights: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """Every source's weight (an unknown name is refused by the loader, naming it)."""
    missing = [n for n in names if n not in weights]
    if missing:
        raise ConfigurationError(f"fl.mix: no weight for source(s) {missing}. Fix: give every "
                                 "source a weight (0 leaves it out).")  # fmt: skip
    return {n: float(weights[n]) for n in weights}


def mix(sources: Mapping[str, Any], weights: Mapping[str, float] | None = None, *,
        seed: int = 0, stop: Stop = "first_exhausted", window: int = 256) -> Mix:  # fmt: skip
    """Mix datasets (or paths) with weights: one deterministic, exactly resumable stream.

    Parameters
    ----------
    sources:
        ``{name: dataset or path}``; a batch's ``source`` column holds each sample's source as
        its index in this dict.
    weights:
        ``{name: weight}`` (normalized; default: equal). Each window of ``window`` positions
        of the mixed stream holds ``round(window * weight)`` samples of each source (largest
        remainder: within one sample of the weight), in a seeded order.
    seed:
        The mix's seed: the windows' layouts and each source's permutations.
    stop:
        An epoch's end: a number of samples, ``{"tokens": n}`` (at the sample whose tokens,
        the lengths of its list columns' values, bring the epoch's to ``n`` or more),
        ``"first_exhausted"`` (when a source has read its every sample once) or
        ``"all_exhausted"`` (when every source has; the ones done earlier start a new,
        reshuffled pass meanwhile).
    window:
        Positions per window of the schedule (the proportions hold per window).

    Examples
    --------
    >>> import feedline as fl
    >>> m = fl.mix({"a": fl.range(8), "b": fl.range(8)}, seed=1, window=2)
    >>> loader = m.loader(batch_size=4, format="numpy")
    >>> [b["source"].tolist().count(1) for b in loader]
    [2, 2, 2]
    """
    return Mix(sources, weights, seed=seed, stop=stop, window=window)
