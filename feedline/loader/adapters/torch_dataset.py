"""The loader as a ``torch.utils.data.IterableDataset``, for code that wants a DataLoader.

``loader.as_torch_dataset()`` wraps a :class:`~feedline.loader.Loader`: iterating it yields
the loader's batches (already batched, shuffled, sharded by rank and prefetched, so wrap it
in ``DataLoader(ds, batch_size=None)`` with ``num_workers=0``: the loader has its own
``num_workers`` for transforms). ``len()`` is the loader's batches per epoch,
``set_epoch(e)`` starts epoch ``e`` (what Lightning's and Accelerate's per-epoch hooks
call; without it each complete pass moves on to the next epoch by itself), and
``state_dict()`` / ``load_state_dict()`` are the loader's exact mid-epoch resume.

Passes follow PyTorch's convention: every ``iter()`` is a whole pass. A pass abandoned
part-way (Lightning's sanity check reads two validation batches, a ``break``) is dropped, so
the next ``iter()`` starts the same epoch again from its first batch — unless
``load_state_dict()`` came in between, in which case it continues from the restored
position. (A bare :class:`~feedline.loader.Loader` instead continues an abandoned
iteration where it stopped.)

``loader.as_torch_dataloader()`` gives the ready ``DataLoader``: a :class:`LoaderDataLoader`
that also forwards ``state_dict()`` / ``load_state_dict()``, so Lightning stores the
loader's position in its checkpoints and ``Trainer.fit(ckpt_path=...)`` resumes exactly.

PyTorch Lightning: return ``loader.as_torch_dataloader()`` from ``train_dataloader()``; the
loader takes rank and world size from ``torch.distributed`` when Lightning has initialized
it (build the loader in ``setup()`` or later). Accelerate: the loader already shards by
rank, so leave its DataLoader out of ``accelerator.prepare`` (which would shard it again)
and pass ``device=accelerator.device`` to the loader.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from feedline.errors import ConfigurationError

if TYPE_CHECKING:
    import torch.utils.data

    from feedline.loader.loader import Loader

__all__ = ["torch_dataloader", "torch_dataset"]


class _LoaderState:
    """The loader's epoch and position, forwarded (what frameworks call on a data source)."""

    loader: Loader

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at the next pass (see ``Loader.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position (JSON-safe: a few integers and strings)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next pass yields the first batch not yet yielded."""
        self.loader.load_state_dict(state)


def _classes() -> tuple[type, type]:
    """``(LoaderDataset, LoaderDataLoader)``, built on first use: torch is the ``torch``
    extra, so this module imports it only when a torch view is asked for. The classes are
    module attributes once built (pickle and ``isinstance`` find them by name)."""
    built = globals().get("LoaderDataLoader")
    if built is not None:
        return globals()["LoaderDataset"], built
    import torch.utils.data

    class LoaderDataset(_LoaderState, torch.utils.data.IterableDataset):
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
            if 0 < self.loader.state_dict()["batches"] < len(self.loader):
                # the last pass stopped part-way: this one starts its epoch again (set_epoch
                # keeps a position that load_state_dict just restored)
                self.loader.set_epoch(self.loader.epoch)
            return iter(self.loader)

        def __len__(self) -> int:
            return len(self.loader)

    class LoaderDataLoader(_LoaderState, torch.utils.data.DataLoader):
        """A ``DataLoader`` over a feedline loader that frameworks can checkpoint.

        The batches are the loader's own (``batch_size=None``, ``num_workers=0``: the loader
        batches, shuffles, shards and runs its workers). ``state_dict()`` / ``load_state_dict()``
        are the loader's exact mid-epoch position, which Lightning saves in its checkpoints for
        every training dataloader that has them and restores on ``fit(ckpt_path=...)``; under
        DDP one state stands for every rank (they step in lock-step), so each rank resumes its
        own share. Made by :meth:`Loader.as_torch_dataloader`.

        Examples
        --------
        >>> import feedline as fl
        >>> dl = fl.range(10).loader(batch_size=4, shuffle=False).as_torch_dataloader()
        >>> first = next(iter(dl))["id"].tolist()
        >>> [b["id"].tolist() for b in dl]  # a new pass: the abandoned one is dropped
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        >>> dl.state_dict()["batches"]
        3
        """

        def __init__(self, loader: Loader) -> None:
            super().__init__(LoaderDataset(loader), batch_size=None, num_workers=0)
            self.loader = loader

    for cls in (LoaderDataset, LoaderDataLoader):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    globals().update(LoaderDataset=LoaderDataset, LoaderDataLoader=LoaderDataLoader)
    return LoaderDataset, LoaderDataLoader


def torch_dataset(loader: Loader) -> torch.utils.data.IterableDataset:
    """A ``LoaderDataset``: an ``IterableDataset`` over ``loader``'s batches (see the module
    docstring); what :meth:`Loader.as_torch_dataset` returns.

    Examples
    --------
    >>> import feedline as fl
    >>> from torch.utils.data import DataLoader
    >>> ds = torch_dataset(fl.range(10).loader(batch_size=4, seed=0))
    >>> len(ds), [len(b["id"]) for b in DataLoader(ds, batch_size=None)]
    (2, [4, 4])
    """
    return _classes()[0](loader)


def torch_dataloader(loader: Loader) -> torch.utils.data.DataLoader:
    """A ``LoaderDataLoader``: a ``DataLoader`` over ``loader`` that frameworks can
    checkpoint; what :meth:`Loader.as_torch_dataloader` returns.

    Examples
    --------
    >>> import feedline as fl
    >>> dl = torch_dataloader(fl.range(10).loader(batch_size=4, shuffle=False))
    >>> first = next(iter(dl))["id"].tolist()
    >>> [b["id"].tolist() for b in dl]  # a new pass: the abandoned one is dropped
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> dl.state_dict()["batches"]
    3
    """
    return _classes()[1](loader)


def __getattr__(name: str) -> object:
    if name in ("LoaderDataset", "LoaderDataLoader"):  # unpickling, isinstance checks
        return dict(zip(("LoaderDataset", "LoaderDataLoader"), _classes(), strict=True))[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
