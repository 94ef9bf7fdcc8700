"""The loader's views and reports: ``to_tf_dataset``, ``as_torch_dataset``, ``timeline``,
``metrics`` and ``stats`` (a mixin of :class:`~feedline.loader.Loader`, kept apart so the
loader's own module holds its iteration and checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.loader.adapters.tf import import_tensorflow, tf_dataset
from feedline.loader.adapters.torch import import_torch
from feedline.loader.nodes.gather import Gather
from feedline.loader.nodes.indices import Order
from feedline.loader.nodes.map import Map

if TYPE_CHECKING:
    import tensorflow as tf
    import torch.utils.data

    from feedline.loader.adapters.torch_dataset import LoaderDataLoader

__all__ = ["LoaderViews"]


class LoaderViews:
    """Views of a :class:`~feedline.loader.Loader`'s batches, and what it measured."""

    def to_tf_dataset(self, label: str | None = None) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of this loader's batches (each pass iterates the loader).

        Elements are dicts of tensors with a fixed batch dimension, or ``(features, label)``
        pairs with ``label`` (ready for ``keras.Model.fit``); each pass is the loader's next
        epoch. Needs ``feedline[tf]``.

        Examples
        --------
        >>> import feedline as fl
        >>> ds = fl.range(64).loader(batch_size=16).to_tf_dataset()  # doctest: +SKIP
        >>> ds.element_spec  # doctest: +SKIP
        {'id': TensorSpec(shape=(16,), dtype=tf.int64, name='id')}
        """

        import_tensorflow()
        whole = not self._segments and (self._consumed == 0 or self._consumed >= len(self))
        passes = len(self) if whole else None  # then every pass is a whole epoch
        short = self.transform is not None or not (self.drop_last or self.pad_last)
        rows = None if short else self.batch_size
        return tf_dataset(lambda: self._iterate("numpy"), self._output_shapes(), rows, label,
                          cardinality=passes)  # fmt: skip

    def _output_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: one sample's shape and dtype (a transform's: from a first batch)."""
        if self.transform is None:
            return self._shapes()
        order = Order(self._plan, epoch=self._epoch, batch=0)
        node = Map(Gather(order, self._prepare(), shuffle=self.shuffle, seed=self.seed),
                   self.transform, batched=self.batched, seed=self.seed)  # fmt: skip
        with node:
            data = next(node, None)
        shapes = {} if data is None else {
            k: (v.shape[1:], v.dtype) if isinstance(v, np.ndarray) else ((), np.dtype(object))
            for k, v in data.data.items()
        }  # fmt: skip
        if self.return_padding_mask:
            shapes["_padded"] = ((), np.dtype(bool))
        return shapes

    def as_torch_dataset(self) -> torch.utils.data.IterableDataset:
        """This loader as a ``torch.utils.data.IterableDataset`` (DataLoader, Lightning).

        Use ``DataLoader(ds, batch_size=None)`` (batches are made here) with
        ``num_workers=0`` (the loader has its own workers); ``len(ds)`` and
        ``ds.set_epoch(e)`` follow the loader. See :mod:`feedline.loader.adapters.torch_dataset`.

        Examples
        --------
        >>> import feedline as fl
        >>> from torch.utils.data import DataLoader
        >>> ds = fl.range(6).loader(batch_size=3, shuffle=False).as_torch_dataset()
        >>> [b["id"].tolist() for b in DataLoader(ds, batch_size=None)]
        [[0, 1, 2], [3, 4, 5]]
        """

        import_torch()
        from feedline.loader.adapters.torch_dataset import LoaderDataset

        return LoaderDataset(self)

    def as_torch_dataloader(self) -> LoaderDataLoader:
        """This loader as a ready ``torch.utils.data.DataLoader`` that frameworks checkpoint.

        Its ``state_dict()`` / ``load_state_dict()`` are this loader's exact position, so
        PyTorch Lightning keeps it in checkpoints and ``fit(ckpt_path=...)`` resumes mid-epoch;
        every ``iter()`` is a whole pass (an abandoned pass is dropped). Return it from
        ``train_dataloader()`` / ``val_dataloader()``. See
        :class:`~feedline.loader.adapters.torch_dataset.LoaderDataLoader`.

        Examples
        --------
        >>> import feedline as fl
        >>> dl = fl.range(6).loader(batch_size=3, shuffle=False).as_torch_dataloader()
        >>> [b["id"].tolist() for b in dl], len(dl)
        ([[0, 1, 2], [3, 4, 5]], 2)
        """

        import_torch()
        from feedline.loader.adapters.torch_dataset import LoaderDataLoader

        return LoaderDataLoader(self)

    def timeline(self) -> list[dict[str, Any]]:
        """Per batch delivered so far (the last 100,000): when, and where the time went.

        Each entry: ``epoch``, ``batch``, ``time`` (seconds since the loader first started
        iterating), ``samples``, ``wait_s`` (the caller blocked in ``next()`` for it, the
        first batch of an iteration counting from ``iter()``) and ``step_s`` (the caller's
        time between the previous batch and asking for this one; 0 for an iteration's first).

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=4, format="numpy")
        >>> _ = list(loader)
        >>> [(t["epoch"], t["batch"], t["samples"], t["step_s"]) for t in loader.timeline()][0]
        (0, 0, 4, 0.0)
        """
        return self._timing.timeline()

    def metrics(self) -> list[dict[str, Any]]:
        """Per epoch iterated so far: ``epoch``, ``batches``, ``samples``, ``seconds``,
        ``samples_per_s`` and ``data_wait_fraction`` (wait / (wait + step)), from the caller's
        side (see :meth:`timeline`; ``seconds`` leaves out pauses between iterations), and
        ``skipped``: samples the transform dropped from the batches delivered.

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=4, format="numpy")
        >>> _ = list(loader)
        >>> m = loader.metrics()[0]
        >>> m["batches"], m["samples"], 0 <= m["data_wait_fraction"] <= 1, m["skipped"]
        (2, 8, True, 0)
        """
        return [m | {"skipped": self._skips.of(m["epoch"])} for m in self._timing.metrics()]

    def stats(self) -> dict[str, Any]:
        """How the data is held: cache mode, cached bytes, window and streaming counters.

        With a ``transform``: ``num_workers``, ``worker_type``, ``skipped`` (samples it dropped
        from the batches delivered so far) and ``skipped_examples`` (the first 20, each naming
        its epoch, sample and reason).

        A remote dataset read through the shard cache adds its folder, limit and counters
        (``shard_hits``, ``shard_downloads``, ``shard_download_bytes``, ``shard_evictions``,
        ``shard_corrupt``, ``shard_prefetch_errors``; see
        :class:`~feedline.loader.data.shard_cache.CacheStats`).

        Examples
        --------
        >>> import feedline as fl
        >>> s = fl.range(10).loader(batch_size=2).stats()
        >>> s["cache"], s["cache_bytes"], s["num_samples"]
        ('memory', 80, 10)
        """
        out = self._prepare().describe()
        if self.transform is not None:
            out |= {"num_workers": self._workers.num_workers, "worker_type": self._workers.kind,
                    "skipped": self._skips.total,
                    "skipped_examples": list(self._skips.examples)}  # fmt: skip
        return out
