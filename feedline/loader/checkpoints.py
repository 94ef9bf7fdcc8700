"""The loader's checkpoints: ``state_dict`` and ``load_state_dict`` (a mixin of
:class:`~feedline.loader.Loader`, kept apart so the loader's own module holds its
configuration and iteration).

The state itself (fields, validation, JSON form) is :mod:`feedline.loader.order.state`; how a
state becomes a position in an epoch, elastic resume included, is
:mod:`feedline.loader.order.resume`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from feedline.loader.order.resume import restore
from feedline.loader.order.state import State, parse_states

__all__ = ["LoaderCheckpoints"]


class LoaderCheckpoints:
    """Saving and restoring a :class:`~feedline.loader.Loader`'s exact position."""

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: tiny and JSON-safe (batches yielded to the caller so far).

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=2, format="numpy")
        >>> _ = next(iter(loader))
        >>> loader.state_dict()["batches"]
        1
        """
        return State(
            seed=self.seed, epoch=self._epoch, batches=self._consumed, rank=self.rank,
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            shuffle=self.shuffle, shuffle_window=self._prepare().window,
            num_samples=self.num_samples, history=self._segments, fingerprint=self._fingerprint,
        ).as_dict()  # fmt: skip

    @functools.cached_property
    def _fingerprint(self) -> str | None:
        """The dataset's fingerprint (its manifest's shard checksums); ``None`` if unwritten."""
        return self._source().fingerprint

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume from ``state_dict()``: the next iteration yields exactly the unseen batches.

        Seed, shuffle and window come from the state (the order must be the checkpoint's); a
        seed given explicitly to this loader must be the state's (else ConfigurationError).
        With a different ``world_size``, ``batch_size`` or ``drop_last`` the samples no old
        rank yielded are split over the new ranks (elastic resume). One state stands for all
        old ranks having yielded as many batches (lock-step training); pass every old rank's
        state otherwise.

        Every field is validated first (types, ranges, keys, version), then the state must
        have been taken on this dataset (the manifest's fingerprint and the sample count) at
        a position its epoch holds; anything else raises :class:`ConfigurationError` naming
        the field and leaves the loader as it was (see :mod:`feedline.loader.order.state`).

        Examples
        --------
        >>> import feedline as fl
        >>> ds = fl.range(8)
        >>> first = ds.loader(batch_size=2, format="numpy", seed=5)
        >>> it = iter(first)
        >>> head = [next(it)["id"].tolist() for _ in range(2)]
        >>> resumed = ds.loader(batch_size=2, format="numpy")
        >>> resumed.load_state_dict(first.state_dict())
        >>> whole = [b["id"].tolist() for b in ds.loader(batch_size=2, format="numpy", seed=5)]
        >>> head + [b["id"].tolist() for b in resumed] == whole
        True
        """
        states = parse_states(state)  # before loading any data
        backend = self._prepare()
        at = restore(
            states, num_samples=backend.num_samples, streaming=backend.mode == "none",
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            fingerprint=self._fingerprint, seed=self.seed if self._seed_given else None,
        )  # fmt: skip
        self._close_active()
        self.seed, self.shuffle, backend.window = at.seed, at.shuffle, at.window
        self._epoch, self._segments, self._consumed = at.epoch, at.segments, at.batches
        self._restored = True
