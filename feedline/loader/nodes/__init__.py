"""The loader as a pipeline of small resumable nodes.

``Order`` → ``Gather`` → ``Map`` → ``Collate`` → ``Format`` → ``Pin`` → ``Prefetch`` →
``ToDevice`` → the training loop (``Pack`` packs a source of documents into rows of
``seq_len`` tokens: :mod:`feedline.loader.nodes.pack`). Each node has ``next()``,
``reset(initial_state=None)`` and ``get_state()`` (aliases ``state_dict`` /
``load_state_dict``), yields
:class:`Batch` records and reports the position of the next batch it delivers, so resume is
exact through every node (:mod:`feedline.loader.nodes.node`). :class:`~feedline.loader.
Loader` composes the default pipeline; compose your own from ``loader.source_node()`` (order
and gather over the loader's data, at its position)::

    from feedline.loader import nodes

    loader = fl.open(path).loader(batch_size=64, seed=0)
    node = nodes.Map(loader.source_node(), augment, num_workers=2, worker_type="process",
                     seed=loader.seed)
    node = nodes.Prefetch(nodes.Format(node, "torch"), depth=4)
    node = nodes.ToDevice(node, "cuda")
    for batch in node:                 # Batch records: batch.data is the dict of tensors
        step(batch.data)
    state = node.state_dict()          # {"epoch": 0, "batches": k}: node.reset(state) resumes

Examples
--------
>>> import feedline as fl
>>> loader = fl.range(6).loader(batch_size=2, shuffle=False, format="numpy")
>>> node = Map(loader.source_node(), lambda s, rng: {"y": s["id"] + 100})
>>> [b.data["y"].tolist() for b in node]
[[100, 101], [102, 103], [104, 105]]
"""

from feedline.loader.nodes.collate import Collate, Format
from feedline.loader.nodes.device import AwaitDevice, CopyToDevice, Pin, ToDevice
from feedline.loader.nodes.gather import Gather
from feedline.loader.nodes.indices import Order
from feedline.loader.nodes.map import Map
from feedline.loader.nodes.node import Batch, Node, Stage
from feedline.loader.nodes.pack import Pack
from feedline.loader.nodes.prefetch import Prefetch
from feedline.loader.nodes.samples import SampleRngs

__all__ = [
    "AwaitDevice",
    "Batch",
    "Collate",
    "CopyToDevice",
    "Format",
    "Gather",
    "Map",
    "Node",
    "Order",
    "Pack",
    "Pin",
    "Prefetch",
    "SampleRngs",
    "Stage",
    "ToDevice",
]
