"""Each epoch's pipeline is freed when the epoch ends, without the cyclic garbage collector:
no feedline loader object is left in a reference cycle. (A stage meter that held a bound
method of itself, and one that held the prefetch node feeding on it, kept every epoch's
nodes and their batch buffers until a full collection: ~19 MB an epoch of 3 MB batches, and
a loader in a 300 MB memory cgroup was OOM-killed after about ten epochs.)"""

from __future__ import annotations

import gc

import map_fns
import pytest

import feedline as fl


def _loader_garbage(loader, epochs: int = 3) -> list[str]:
    """The feedline loader objects that only the cyclic collector would free, after
    ``epochs`` epochs."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(epochs):
            for _batch in loader:
                pass
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage
                       if type(o).__module__.startswith("feedline.loader")})  # fmt: skip
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("cache", ["memory", "none", "staged"])
def test_an_epochs_pipeline_is_freed_without_the_cyclic_collector(write, tmp_path, cache):
    ds = write(400, row_group_rows=50)
    loader = ds.loader(batch_size=16, format="numpy", seed=1, cache=cache,
                       cache_dir=tmp_path / "cache")  # fmt: skip
    assert _loader_garbage(loader) == []
    loader.close()


def test_a_pipeline_with_workers_and_a_transform_is_freed_too():
    loader = fl.range(500).loader(batch_size=10, format="numpy", transform=map_fns.ident,
                                  num_workers=2, seed=0)  # fmt: skip
    assert _loader_garbage(loader) == []
