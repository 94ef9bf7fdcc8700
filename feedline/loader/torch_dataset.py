"""The loader as a ``torch.utils.data.IterableDataset``, for code that wants a DataLoader.

``loader.as_torch_dataset()`` wraps a :class:`~feedline.loader.Loader`: iterating it yields
the loader's batches (already batched, shuffled, sharded by rank and prefetched, so wrap it
in ``DataLoader(ds, batch_size=None)`` with ``num_workers=0``: the loader has its own
``num_workers`` for transforms). ``len()`` is the loader's batches per epoch,
``set_epoch(e)`` starts epoch ``e`` (what Lightning's and Accelerate's per-epoch hooks
call; without it each complete pass moves on to the next epoch by itself), and
``state_dict()`` / ``load_state_dict()`` are the loader's exact mid-epoch resume.

PyTorch Lightning: return ``DataLoader(loader.as_torch_dataset(), batch_size=None)`` from
``train_dataloader()``; the loader takes rank and world size from ``torch.distributed``
when Lightning has initialized it (build the loader in ``setup()`` or later). Accelerate:
the loader already shards by rank, so leave its DataLoader out of ``accelerator.prepare``
(which would shard it again) and pass ``device=accelerator.device`` to the loader.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch.utils.data

from feedline.errors import ConfigurationError

if TYPE_CHECKING:
    from feedline.loader.loader import Loader

__all__ = ["LoaderDataset"]


class LoaderDataset(torch.utils.data.IterableDataset):
    """An ``IterableDataset`` over a loader's batches (see the module docstring).

    Examples
    --------
    >>> import feedline as fl
    >>> from torch.utils.data import DataLoader
    >>> ds = fl.range(10).loader(batch_size=4, seed=0).as_torch_dataset()
    >>> len(ds), [len(b["id"]) for b in DataLoader(ds, batch_size=None)]
    (2, [4, 4])
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if torch.utils.data.get_worker_info() is not None:
            raise ConfigurationError(
                "A feedline loader dataset was iterated in a DataLoader worker process: every "
                "worker would read the whole epoch again. Fix: DataLoader(ds, batch_size=None, "
                "num_workers=0); parallel work goes in the loader itself (transform=, "
                "num_workers=, worker_type=) and prefetch= keeps batches ready."
            )
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at the next iteration (see ``Loader.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)
