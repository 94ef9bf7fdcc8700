"""What ``Loader.stats()`` and ``Loader.metrics()`` say about one epoch's staging.

Examples
--------
>>> report = StageReport(0, stage_s=4.0, wait_s=0.1)
>>> report.as_dict()["stage_hidden"]
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["HIDDEN_SHARE", "StageReport"]

#: the loop waited less than this share of an epoch's staging: the staging was hidden
HIDDEN_SHARE = 0.05


@dataclass
class StageReport:
    """One epoch's staging: its time, the loop's wait for it (pass 1, then each bucket
    not yet ordered when the loop reached it), and what was read, sent and served;
    ``source``: where its rows came from, ``"dataset"`` (pass 1) or ``"epoch before"`` (its
    buckets, as they were read: :mod:`~feedline.loader.data.staging.recycle`)."""

    epoch: int
    stage_s: float = 0.0
    wait_s: float = 0.0
    staged_here: bool = False
    rows_read: int = 0
    bytes_read: int = 0
    bytes_sent: int = 0
    buckets: int = 0
    source: str = "dataset"

    def as_dict(self) -> dict[str, Any]:
        """The keys of ``Loader.stats()["staged_epochs"]`` (see the loader's docs)."""
        hidden = self.wait_s <= max(0.01, HIDDEN_SHARE * self.stage_s)
        return {"epoch": self.epoch, "stage_s": self.stage_s, "stage_wait_s": self.wait_s,
                "stage_hidden": hidden, "staged_here": self.staged_here,
                "stage_rows_read": self.rows_read, "stage_bytes_read": self.bytes_read,
                "stage_bytes_sent": self.bytes_sent, "stage_buckets": self.buckets,
                "stage_source": self.source}  # fmt: skip
