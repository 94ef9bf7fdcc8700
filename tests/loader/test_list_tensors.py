"""List columns (list / large_list / fixed_size_list, nested) loaded as tensors (issue 16.1).

Data written by pyarrow; the Spark-written files are in ``test_list_tensors_spark.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.arrow.list_tensors import list_to_numpy
from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.loader.data.columns import chunk_to_numpy, column_specs

ROWS = 120
SHAPE = (3, 4, 5)
CACHES = ("memory", "none")


def _images(rows: int = ROWS, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, *SHAPE), dtype=np.uint8)


def _write(folder: Path, table: pa.Table, row_group_size: int = 25) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet", row_group_size=row_group_size)
    return folder


def _all(loader: fl.Loader) -> dict[str, np.ndarray]:
    batches = list(loader)
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _flat_lists(images: np.ndarray, kind: pa.DataType) -> pa.Array:
    flat = images.reshape(len(images), -1)
    return pa.array(list(flat), kind)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize(
    "kind",
    [pa.list_(pa.uint8()), pa.large_list(pa.uint8()), pa.list_(pa.uint8(), int(np.prod(SHAPE)))],
    ids=["list", "large_list", "fixed_size_list"],
)
def test_flat_lists_load_with_a_given_shape(tmp_path: Path, kind: pa.DataType, cache: str) -> None:
    images = _images()
    table = pa.table({"image": _flat_lists(images, kind), "id": np.arange(ROWS)})
    folder = _write(tmp_path / "pq", table)
    loader = fl.read_parquet(folder).loader(
        batch_size=16, seed=3, format="numpy", cache=cache, shapes={"image": SHAPE}
    )
    got = _all(loader)
    assert got["image"].shape == (len(got["id"]), *SHAPE) and got["image"].dtype == np.uint8
    np.testing.assert_array_equal(got["image"], images[got["id"]])
    assert sorted(got["id"].tolist()) != got["id"].tolist()  # shuffled, gathered by row


@pytest.mark.parametrize("cache", CACHES)
def test_shape_is_inferred_flat_and_nested(tmp_path: Path, cache: str) -> None:
    rng = np.random.default_rng(1)
    flat = rng.normal(size=(ROWS, 7)).astype(np.float32)
    nested = rng.normal(size=(ROWS, 4, 6))
    table = pa.table({
        "v": pa.array(list(flat), pa.list_(pa.float32())),
        "m": pa.array([[list(r) for r in m] for m in nested], pa.list_(pa.list_(pa.float64()))),
    })  # fmt: skip
    folder = _write(tmp_path / "pq", table)
    loader = fl.read_parquet(folder).loader(batch_size=50, shuffle=False, format="numpy",
                                            cache=cache)  # fmt: skip
    got = _all(loader)
    np.testing.assert_array_equal(got["v"], flat)
    np.testing.assert_array_equal(got["m"], nested)
    assert got["m"].dtype == np.float64 and got["v"].dtype == np.float32


def test_nested_fixed_size_lists_need_no_shape(tmp_path: Path) -> None:
    values = np.arange(ROWS * 6, dtype=np.int16).reshape(ROWS, 2, 3)
    kind = pa.list_(pa.list_(pa.int16(), 3), 2)
    table = pa.table({"t": pa.array([[list(r) for r in m] for m in values], kind)})
    got = _all(fl.from_arrow(table).loader(batch_size=40, shuffle=False, format="numpy"))
    np.testing.assert_array_equal(got["t"], values)


def test_torch_batches(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    images = _images()
    folder = _write(tmp_path / "pq", pa.table({"image": _flat_lists(images, pa.list_(pa.uint8()))}))
    loader = fl.read_parquet(folder).loader(batch_size=8, shuffle=False, shapes={"image": SHAPE})
    first = next(iter(loader))["image"]
    assert first.dtype == torch.uint8 and tuple(first.shape) == (8, *SHAPE)
    np.testing.assert_array_equal(first.numpy(), images[:8])


@pytest.mark.parametrize("cache", CACHES)
def test_written_feedline_dataset_keeps_lists(tmp_path: Path, cache: str) -> None:
    images = _images()
    table = pa.table({"image": _flat_lists(images, pa.list_(pa.uint8())), "id": np.arange(ROWS)})
    out = tmp_path / "ds"
    fl.from_arrow(table).write(out, rows_per_shard=50, row_group_rows=20)
    stored = pq.read_schema(next(out.glob("*.parquet"))).field("image").type
    assert pa.types.is_list(stored)  # no shape declared: stored as written
    loader = fl.open(out).loader(batch_size=16, seed=0, format="numpy", cache=cache,
                                 shapes={"image": SHAPE})  # fmt: skip
    got = _all(loader)
    np.testing.assert_array_equal(got["image"], images[got["id"]])


def test_list_to_tensor_stores_fixed_size_binary(tmp_path: Path) -> None:
    images = _images()
    table = pa.table({"image": _flat_lists(images, pa.list_(pa.uint8())), "id": np.arange(ROWS)})
    out = tmp_path / "ds"
    fl.from_arrow(table).transform(fl.ListToTensor("image", shape=SHAPE)).write(out)
    stored = pq.read_schema(next(out.glob("*.parquet"))).field("image")
    assert stored.type == pa.binary(int(np.prod(SHAPE)))
    assert json.loads(stored.metadata[b"feedline.tensor"])["shape"] == list(SHAPE)
    got = _all(fl.open(out).loader(batch_size=30, shuffle=False, format="numpy"))
    np.testing.assert_array_equal(got["image"], images)
    state = fl.ListToTensor("image", shape=SHAPE, ragged="pad", pad_value=1).state
    assert fl.preprocess.from_state(json.loads(json.dumps(state))).params() == state["params"]


# --------------------------------------------------------------------------- slices, chunks


def test_sliced_arrays_and_offset_children() -> None:
    values = np.arange(40, dtype=np.int32)
    lists = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 37, 4, dtype=np.int32)), pa.array(values).slice(3)
    )  # child with its own offset
    ref = values[3:39].reshape(9, 4)
    np.testing.assert_array_equal(list_to_numpy(lists, (4,)), ref)
    sliced = list_to_numpy(lists.slice(2, 5), (2, 2))
    np.testing.assert_array_equal(sliced, ref[2:7].reshape(5, 2, 2))
    large = pa.array(list(ref), pa.large_list(pa.int32())).slice(4)
    np.testing.assert_array_equal(list_to_numpy(large, (4,)), ref[4:])
    fixed = pa.array(list(ref), pa.list_(pa.int32(), 4)).slice(1, 3)
    np.testing.assert_array_equal(list_to_numpy(fixed, (4,)), ref[1:4])
    nested = pa.array([[list(r[:2]), list(r[2:])] for r in ref], pa.list_(pa.list_(pa.int32())))
    np.testing.assert_array_equal(list_to_numpy(nested.slice(3, 4), (2, 2)),
                                  ref[3:7].reshape(4, 2, 2))  # fmt: skip


def test_fast_path_is_a_view_of_the_values_buffer() -> None:
    values = pa.array(np.arange(1200, dtype=np.float32))
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, 1201, 12, dtype=np.int32)), values)
    out = list_to_numpy(lists.slice(10), (3, 4))
    assert out.shape == (90, 3, 4)
    address = values.buffers()[1].address
    assert out.__array_interface__["data"][0] == address + 120 * 4  # no copy, no loop


def test_chunked_column_through_a_computed_plan() -> None:
    images = _images(60)
    kind = pa.list_(pa.uint8())
    column = pa.chunked_array([_flat_lists(images[:25], kind), _flat_lists(images[25:], kind)])
    table = pa.table({"image": column, "id": np.arange(60)})
    ds = fl.from_arrow(table).filter(lambda b: pa.array(np.ones(b.num_rows, bool)))
    got = _all(ds.loader(batch_size=20, seed=2, format="numpy", shapes={"image": SHAPE}))
    np.testing.assert_array_equal(got["image"], images[got["id"]])


# --------------------------------------------------------------------------- ragged and nulls


def _ragged_folder(tmp_path: Path, bad_row: int = 87, length: int = 5) -> tuple[Path, list]:
    rows = [list(r) for r in _images().reshape(ROWS, -1)]
    rows[bad_row] = rows[bad_row][:length]
    table = pa.table({"image": pa.array(rows, pa.list_(pa.uint8()))})
    return _write(tmp_path / "ragged", table), rows


@pytest.mark.parametrize("cache", CACHES)
def test_ragged_row_error_names_column_global_row_and_lengths(tmp_path: Path, cache: str) -> None:
    folder, _ = _ragged_folder(tmp_path)  # row 87 sits in row group 3 (rows 75..99)
    loader = fl.read_parquet(folder).loader(
        batch_size=10, seed=0, format="numpy", cache=cache, shuffle_window=2
    )  # pools of 2 shuffled row groups
    with pytest.raises(DataError) as err:
        list(loader)
    text = str(err.value)
    assert "'image'" in text and "row 87" in text and "length 5" in text and "length 60" in text
    assert "Fix:" in text and "ragged=" in text and "shapes=" in text


def test_nested_inner_ragged_list_names_the_row() -> None:
    rows = [[[1.0, 2.0], [3.0, 4.0]]] * 6
    rows[4] = [[1.0, 2.0], [3.0]]
    table = pa.table({"m": pa.array(rows, pa.list_(pa.list_(pa.float32())))})
    with pytest.raises(DataError, match=r"nesting level 1 .*length 1 at row 4"):
        list(fl.from_arrow(table).loader(batch_size=2, shuffle=False, format="numpy"))


def test_pad_truncate_and_pad_or_truncate() -> None:
    arr = pa.array([[1, 2, 3], [4], None, [5, 6]], pa.list_(pa.int16()))
    fit = list_to_numpy(arr, (2,), ragged="pad_or_truncate", pad_value=-1)
    assert fit.tolist() == [[1, 2], [4, -1], [-1, -1], [5, 6]] and fit.dtype == np.int16
    padded = list_to_numpy(arr.slice(1), (2,), ragged="pad", pad_value=9)
    assert padded.tolist() == [[4, 9], [9, 9], [5, 6]]
    with pytest.raises(DataError, match=r"length 3 at row 0.*ragged='pad'"):
        list_to_numpy(arr, (2,), ragged="pad")  # a long row is never cut by "pad"
    long = pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int16()))
    cut = list_to_numpy(long, (2,), ragged="truncate")
    assert cut.tolist() == [[1, 2], [4, 5]]
    with pytest.raises(DataError, match="length 1 at row 1"):
        list_to_numpy(arr, (2,), ragged="truncate")
    nested = pa.array([[[1, 2], [3]], [[4]], None], pa.list_(pa.list_(pa.int8())))
    out = list_to_numpy(nested, (2, 2), ragged="pad")
    assert out.tolist() == [[[1, 2], [3, 0]], [[4, 0], [0, 0]], [[0, 0], [0, 0]]]


@pytest.mark.parametrize("cache", CACHES)
def test_loader_pads_ragged_and_null_rows_when_asked(tmp_path: Path, cache: str) -> None:
    rows = [list(r) for r in _images().reshape(ROWS, -1)]
    rows[30], rows[31] = rows[30][:5], None
    folder = _write(tmp_path / "pq", pa.table({"image": pa.array(rows, pa.list_(pa.uint8()))}))
    loader = fl.read_parquet(folder).loader(
        batch_size=ROWS, shuffle=False, format="numpy", cache=cache, drop_last=False,
        shapes={"image": SHAPE}, ragged="pad", pad_value=7,
    )  # fmt: skip
    got = _all(loader)["image"].reshape(ROWS, -1)
    assert got[30, :5].tolist() == rows[30] and (got[30, 5:] == 7).all() and (got[31] == 7).all()
    np.testing.assert_array_equal(got[32:], np.array(rows[32:], np.uint8))


def test_null_row_raises_unless_padding(tmp_path: Path) -> None:
    table = pa.table({"v": pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float64()))})
    with pytest.raises(DataError, match=r"null row at row 1.*Fix:.*ragged='pad'"):
        list(fl.from_arrow(table).loader(batch_size=3, shuffle=False, format="numpy"))
    with pytest.raises(DataError, match="null element at row 1"):
        list_to_numpy(pa.array([[1.0, 2.0], [3.0, None]], pa.list_(pa.float64())), (2,))


def test_configuration_errors() -> None:
    schema = pa.schema({"v": pa.list_(pa.uint8()), "x": pa.float32(),
                        "f": pa.list_(pa.uint8(), 4), "s": pa.list_(pa.string())})  # fmt: skip
    with pytest.raises(SchemaError, match="shapes="):
        column_specs(schema, ["v"])
    with pytest.raises(ConfigurationError, match="not a list column"):
        column_specs(schema, ["v"], shapes={"x": (2,)})
    with pytest.raises(ConfigurationError, match="pad_value=-1"):
        column_specs(schema, ["v"], shapes={"v": (4,)}, ragged="pad", pad_value=-1)
    with pytest.raises(ConfigurationError, match="ragged='zero'"):
        column_specs(schema, ["v"], shapes={"v": (4,)}, ragged="zero")
    with pytest.raises(SchemaError, match="hold 4 values"):
        column_specs(schema, ["f"], shapes={"f": (5,)})
    assert column_specs(schema, ["f"], shapes={"f": (5,)}, ragged="pad")[0].shape == (5,)
    with pytest.raises(SchemaError, match="Fix:"):
        column_specs(schema, ["s"])
    table = pa.table({"v": pa.array([[1, 2]], pa.list_(pa.uint8()))})
    with pytest.raises(ConfigurationError, match="needs its shape"):
        _ = fl.from_arrow(table).loader(batch_size=1, format="numpy", ragged="pad").num_samples


def test_chunk_to_numpy_names_the_callers_row() -> None:
    spec = column_specs(pa.schema({"v": pa.list_(pa.int8())}), shapes={"v": (2,)})[0]
    chunk = pa.array([[1, 2], [3]], pa.list_(pa.int8()))
    with pytest.raises(DataError, match="at row 1001"):
        chunk_to_numpy(chunk, spec, "here", row_of=lambda i: 1000 + i)


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("cache", CACHES)
def test_resume_is_exact(tmp_path: Path, cache: str) -> None:
    images = _images()
    table = pa.table({"image": _flat_lists(images, pa.list_(pa.uint8())), "id": np.arange(ROWS)})
    folder = _write(tmp_path / "pq", table)

    def make() -> fl.Loader:
        return fl.read_parquet(folder).loader(
            batch_size=8, seed=4, format="numpy", cache=cache, shapes={"image": SHAPE},
            shuffle_window=2,
        )  # fmt: skip

    whole = [b["image"].copy() for b in make()]
    first = make()
    it = iter(first)
    head = [next(it)["image"].copy() for _ in range(5)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    rest = [b["image"].copy() for b in resumed]
    assert len(head + rest) == len(whole)
    for a, b in zip(head + rest, whole, strict=True):
        np.testing.assert_array_equal(a, b)
