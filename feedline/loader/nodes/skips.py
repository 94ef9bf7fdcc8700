"""Samples a transform dropped: counted per epoch and reported, never silently lost."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["Skips"]

#: skipped samples described in ``Loader.stats()["skipped_examples"]``
EXAMPLES = 20


class Skips:
    """Per-epoch counts of skipped samples, the first few described, one warning per loader.

    Examples
    --------
    >>> skips = Skips()
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     skips.add(0, ["sample 3: the file is empty (0 bytes)"])
    >>> skips.total, skips.of(0), len(caught)
    (1, 1, 1)
    """

    def __init__(self) -> None:
        self.per_epoch: dict[int, int] = {}
        self.examples: list[str] = []

    @property
    def total(self) -> int:
        return sum(self.per_epoch.values())

    def of(self, epoch: int) -> int:
        return self.per_epoch.get(epoch, 0)

    def add(self, epoch: int, markers: Iterable[Any]) -> None:
        """Count the samples ``markers`` describe (dropped from a batch the caller received)."""
        markers = list(markers)
        if not markers:
            return
        first = not self.per_epoch
        self.per_epoch[epoch] = self.of(epoch) + len(markers)
        room = EXAMPLES - len(self.examples)
        if room > 0:
            self.examples.extend(f"epoch {epoch}, {m}" for m in markers[:room])
        if first:
            warnings.warn(
                f"The loader's transform skipped a sample ({markers[0]}); skipped samples are "
                "dropped from their batch (it is shorter) and counted in loader.stats()"
                "['skipped'] and loader.metrics()[epoch]['skipped'] (no further warnings).",
                UserWarning,
                stacklevel=4,
            )
