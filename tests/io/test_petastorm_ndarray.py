"""Decoding binary columns of np.save bytes: feedline.io.npy (shared with fl.read_petastorm) and
the fl.DecodeNdarray preprocessor (a map_batches-free way to decode such a column)."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.io.npy import decode_npy
from feedline.io.npy_arrow import cells_to_arrow


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def npz(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, arr=array)
    return buf.getvalue()


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2", ">u4", "|u1"])
@pytest.mark.parametrize("fortran", [False, True])
def test_one_shared_header_is_sliced_at_once_and_equals_np_load(dtype, fortran):
    rng = np.random.default_rng(0)
    arrays = [(rng.random((3, 5)) * 100).astype(dtype) for _ in range(7)]
    if fortran:
        arrays = [np.asfortranarray(a) for a in arrays]
    blobs = [npy(a) for a in arrays]
    blobs[2] = None
    cells = decode_npy(pa.array(blobs, pa.binary()))
    assert cells.stacked is not None  # the vectorized path was taken
    wanted = [np.load(io.BytesIO(b)) for b in blobs if b is not None]
    np.testing.assert_array_equal(cells.stacked, np.stack(wanted))
    assert cells.stacked.dtype.isnative and cells.stacked.flags.c_contiguous
    array, failed = cells_to_arrow(cells, (3, 5), np.dtype(dtype).newbyteorder("="))
    assert not failed and array.to_pylist()[2] is None
    assert array.storage.values.to_numpy().reshape(7, 3, 5)[3].tolist() == wanted[2].tolist()


def test_different_shapes_are_decoded_one_by_one_into_lists():
    arrays = [np.arange(n * 2, dtype=np.int32).reshape(n, 2) for n in (1, 3, 0, 2)]
    cells = decode_npy(pa.array([npy(a) for a in arrays], pa.large_binary()))
    assert cells.stacked is None
    out, failed = cells_to_arrow(cells, (None, 2), None)
    assert not failed and out.type == pa.list_(pa.list_(pa.int32()))
    assert out.to_pylist() == [a.tolist() for a in arrays]


def _batch(blobs: list[bytes | None]) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(len(blobs))), "x": pa.array(blobs, pa.binary())})


def test_decode_ndarray_in_a_pipeline_loads_as_tensors(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (20, 3, 4, 4), dtype=np.uint8)
    path = tmp_path / "npy.parquet"
    pq.write_table(
        pa.Table.from_batches([_batch([npy(a) for a in images])]), path, row_group_size=7
    )
    ds = fl.read_parquet(path).transform(fl.DecodeNdarray("x", shape=(3, 4, 4)))
    assert ds.schema().field("x").type == pa.fixed_shape_tensor(pa.uint8(), [3, 4, 4])
    ds.write(tmp_path / "out")
    loader = fl.open(tmp_path / "out").loader(batch_size=20, shuffle=False, format="numpy")
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["x"][np.argsort(batch["id"])], images)


def test_state_round_trips_through_from_state():
    decoder = fl.DecodeNdarray(
        "x", shape=(None, 2), dtype="float32", format="npz", on_error="skip", output="y"
    )
    again = fl.preprocess.from_state(decoder.state)
    assert isinstance(again, fl.DecodeNdarray) and again.state == decoder.state
    batch = _batch([npz(np.ones((3, 2))), npz(np.zeros((1, 2)))])
    out = again.transform_batch(batch)
    assert out.column("y").type == pa.list_(pa.list_(pa.float32()))
    assert out.column("y").to_pylist() == [[[1.0, 1.0]] * 3, [[0.0, 0.0]]]


def test_bad_values_raise_naming_row_and_column_or_are_skipped_and_counted(tmp_path):
    blobs = [npy(np.ones(4)), npy(np.ones(4))[:-3], npy(np.ones(5)), npy(np.zeros(4))]
    with pytest.raises(fl.DataError, match=r"row 1 .*'x'.*Fix:"):
        fl.DecodeNdarray("x").transform_batch(_batch(blobs))
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_batches([_batch(blobs)]), path)
    ds = fl.read_parquet(path).transform(fl.DecodeNdarray("x", shape=(4,), on_error="skip"))
    assert ds.to_arrow()["id"].to_pylist() == [0, 3]
    report = ds.analyze()
    assert report.records_skipped == 2
    assert sorted(s["reason"][:20] for s in report.skipped) == [
        "its shape (5,) does ",
        "not a readable .npy ",
    ]


class _RunsShell:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_object_arrays_are_refused_never_unpickled(tmp_path):
    marker = tmp_path / "ran"
    hostile = npy(np.array([_RunsShell(f"touch {marker}")], dtype=object), allow_pickle=True)
    with pytest.raises(fl.DataError, match="object"):
        fl.DecodeNdarray("x").transform_batch(_batch([hostile]))
    assert not marker.exists()
    np.load(io.BytesIO(hostile), allow_pickle=True)  # the control: unpickling it runs it
    assert marker.exists()


def test_bad_arguments_raise_with_a_fix():
    for kwargs in (
        {"format": "pickle"},
        {"on_error": "ignore"},
        {"shape": (2, -1)},
        {"dtype": "object"},
    ):
        with pytest.raises(fl.ConfigurationError, match="Fix:"):
            fl.DecodeNdarray("x", **kwargs)
    with pytest.raises(fl.SchemaError, match="Fix:"):
        fl.DecodeNdarray("id").transform_batch(_batch([npy(np.ones(2))]))
