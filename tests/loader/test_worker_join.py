"""Thread workers stack each chunk of a batch straight into the batch's arrays: joining the
chunks copies nothing (it used to concatenate them: a second copy of every output, in the one
thread that hands batches over), and skips and mixed shapes still come out right."""

from __future__ import annotations

import warnings
from unittest import mock

import map_fns
import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import UserFunctionError


def dataset(n: int = 64) -> fl.Dataset:
    return fl.from_arrow(pa.table({"id": np.arange(n, dtype=np.int64)}))


def test_thread_chunks_are_stacked_into_the_batch_not_concatenated_after() -> None:
    calls: list[tuple[int, ...]] = []
    concatenate = np.concatenate

    def counted(arrays, *args, **kwargs):
        out = concatenate(arrays, *args, **kwargs)
        calls.append(out.shape)
        return out

    kwargs = {"batch_size": 16, "seed": 3, "format": "numpy", "transform": map_fns.big_output}
    inline = list(dataset().loader(**kwargs))
    with mock.patch.object(np, "concatenate", counted):
        threads = dataset().loader(**kwargs, num_workers=4)
        got = list(threads)
        threads.close()
    assert (16, 16, 1024) not in calls  # no batch of outputs was put together a second time
    for a, b in zip(inline, got, strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])
        np.testing.assert_array_equal(a["image"], b["image"])
        assert b["image"].flags.c_contiguous and b["image"].flags.owndata


@pytest.mark.parametrize("workers", [1, 3])
def test_stacked_chunks_with_skipped_samples_equal_the_inline_batches(workers: int) -> None:
    kwargs = {"batch_size": 10, "seed": 1, "format": "numpy", "transform": map_fns.skip_fifth,
              "drop_last": False}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inline = list(dataset(47).loader(**kwargs))
        with dataset(47).loader(**kwargs, num_workers=workers) as threads:
            got = list(threads)
    assert [len(b["id"]) for b in got] == [len(b["id"]) for b in inline]
    for a, b in zip(inline, got, strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])
        np.testing.assert_array_equal(a["image"], b["image"])
        assert (b["image"][:, 0, 0] == b["id"]).all() and (b["id"] % 5 != 0).all()


def test_chunks_of_other_shapes_are_still_refused() -> None:
    loader = dataset(64).loader(batch_size=64, shuffle=False, transform=map_fns.shape_by_half,
                                num_workers=2)  # fmt: skip
    with loader, pytest.raises(UserFunctionError, match="different shapes"):
        list(loader)
