"""Dataset conveniences: head, show, to_polars, to_numpy, from_dict/numpy/huggingface,
sample(n=), repr and the notebook view."""

from __future__ import annotations

import io
import threading

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from rich.console import Console

import feedline as fl
from feedline.errors import ConfigurationError, DataError, SchemaError


@pytest.fixture
def float_folder(tmp_path):
    """Five Parquet files of 2 500 rows x 130 float64 columns (several row groups each)."""
    rng = np.random.default_rng(0)
    frames = []
    for i in range(5):
        df = pd.DataFrame(rng.random((2500, 130)), columns=[f"c{j}" for j in range(130)])
        pq.write_table(pa.Table.from_pandas(df), tmp_path / f"part-{i}.parquet", row_group_size=700)
        frames.append(df)
    return tmp_path, pd.concat(frames).to_numpy()


# ---------------------------------------------------------------------------- head / show


def test_head_returns_the_first_rows_and_reads_only_what_it_needs():
    seen = []
    lock = threading.Lock()

    def count(batch):
        with lock:
            seen.append(batch.num_rows)
        return batch

    ds = fl.range(1_000_000, rows_per_task=10_000).map_batches(count)
    table = ds.head(3)
    assert isinstance(table, pa.Table)
    assert table["id"].to_pylist() == [0, 1, 2]
    assert sum(seen) < 200_000  # a few read tasks, not the million rows
    assert fl.range(5).head(0).num_rows == 0
    with pytest.raises(ConfigurationError, match="Fix:"):
        fl.range(5).head(-1)


def test_show_prints_a_table_with_tensors_summarized_and_long_text_cut():
    table = pa.table(
        {
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((2, 3, 4), np.float32)),
            "text": ["x" * 200, "short"],
            "tokens": [list(range(10)), []],
            "price": [1.5, None],
        }
    )
    out = io.StringIO()
    fl.from_arrow(table).show(5, console=Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "<tensor<float, 3×4>>" in text
    assert "x" * 200 not in text and "…" in text
    assert "[0, 1, 2, 3, … +6]" in text
    assert "short" in text and "null" in text
    assert "image" in text and "price" in text


# ---------------------------------------------------------------------------- to_polars


def test_to_polars_matches_polars_and_keeps_tensor_shapes():
    images = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ds = fl.from_dict({"id": [7, 8], "name": ["a", None], "image": images})
    frame = ds.to_polars()
    assert isinstance(frame, pl.DataFrame)
    assert frame.columns == ["id", "name", "image"]
    assert frame["id"].to_list() == [7, 8] and frame["name"].to_list() == ["a", None]
    assert frame["image"].dtype == pl.Array(pl.Float32, (3, 4))
    np.testing.assert_array_equal(frame["image"].to_numpy(), images)


# ---------------------------------------------------------------------------- to_numpy


def test_to_numpy_stack_reads_a_parquet_folder_like_pandas(float_folder):
    root, expected = float_folder
    got = fl.read_parquet(root).to_numpy(stack=True)
    assert got.flags.c_contiguous and got.dtype == np.float64
    np.testing.assert_array_equal(got, expected)
    columns = fl.read_parquet(root).to_numpy(stack=True, order="F")
    assert columns.flags.f_contiguous
    np.testing.assert_array_equal(columns, expected)


def test_to_numpy_selected_columns_and_dict_form(float_folder):
    root, expected = float_folder
    got = fl.read_parquet(root).to_numpy(columns=["c5", "c2"], stack=True)
    np.testing.assert_array_equal(got, expected[:, [5, 2]])
    arrays = fl.read_parquet(root, columns=["c1", "c129"]).to_numpy()
    assert list(arrays) == ["c1", "c129"]
    np.testing.assert_array_equal(arrays["c129"], expected[:, 129])


def test_to_numpy_runs_other_plans_through_the_engine(float_folder):
    root, expected = float_folder
    ds = fl.read_parquet(root).filter(pc.field("c0") > 0.5)
    keep = expected[:, 0] > 0.5
    np.testing.assert_array_equal(ds.to_numpy(stack=True), expected[keep])
    np.testing.assert_array_equal(ds.to_numpy(stack=True, order="F"), expected[keep])
    first = fl.read_parquet(root).limit(10).to_numpy(stack=True)
    np.testing.assert_array_equal(first, expected[:10])


def test_to_numpy_stack_takes_numeric_columns_and_promotes_mixed_dtypes():
    ds = fl.from_dict({"a": [1.0, 2.0], "s": ["x", "y"], "b": [3.0, 4.0], "i": [1, 2]})
    mixed = ds.to_numpy(stack=True)  # float64 + int64 was refused: now numpy.result_type
    assert mixed.dtype == np.float64
    np.testing.assert_array_equal(mixed, [[1.0, 3.0, 1.0], [2.0, 4.0, 2.0]])
    np.testing.assert_array_equal(ds.to_numpy(["a", "b"], stack=True), [[1.0, 3.0], [2.0, 4.0]])
    with pytest.raises(SchemaError, match="not numeric"):
        ds.to_numpy(["a", "s"], stack=True)
    with pytest.raises(SchemaError, match="nope"):
        ds.to_numpy(["nope"])
    only = fl.from_dict({"s": ["x"], "i": [5]})
    np.testing.assert_array_equal(only.to_numpy(stack=True), [[5]])


@pytest.mark.parametrize("fast", [True, False])
def test_to_numpy_stack_promotes_like_numpy_result_type(tmp_path, fast):
    table = pa.table(
        {
            "x": pa.array([0.5, 1.5, 2.5]),
            "id": pa.array([1, 2, 3], pa.int64()),
            "i8": pa.array([-1, 0, 1], pa.int8()),
            "u8": pa.array([1, 2, 250], pa.uint8()),
            "f": pa.array([True, False, True]),
            "f32": pa.array([1.25, 2.5, None], pa.float32()),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    ds = fl.read_parquet(tmp_path) if fast else fl.from_arrow(table)
    for names in (["x", "id"], ["i8", "u8"], ["f", "i8"], ["id", "f32"], ["u8", "f"]):
        got = ds.to_numpy(names, stack=True)
        want = np.result_type(*(table[n].type.to_pandas_dtype() for n in names))
        assert got.dtype == want, names
        columns = [np.asarray(table[n].to_numpy(zero_copy_only=False), np.float64) for n in names]
        np.testing.assert_array_equal(got.astype(np.float64), np.stack(columns, axis=1))
    with pytest.raises(DataError, match="'id'"):  # an int stack cannot hold a null
        fl.from_dict({"id": pa.array([1, None]), "u": [1, 2]}).to_numpy(stack=True)


@pytest.fixture
def cube_files(tmp_path):
    """Six files of 250-600 rows x 40 float64 columns in row groups of 64 rows, and one int
    column; the reference cube of the first 100 rows x 10 random columns of each."""
    rng = np.random.default_rng(7)
    frames = []
    for i in range(6):
        rows = int(rng.integers(250, 600))
        df = pd.DataFrame(rng.normal(size=(rows, 40)), columns=[f"c{j}" for j in range(40)])
        df["n"] = np.arange(rows) + 1000 * i
        pq.write_table(pa.Table.from_pandas(df), tmp_path / f"part-{i}.parquet", row_group_size=64)
        frames.append(df)
    columns = [f"c{j}" for j in rng.choice(40, 10, replace=False)]
    cube = np.stack([df.iloc[:100][columns].to_numpy() for df in frames])
    return tmp_path, columns, cube, frames


def test_to_numpy_per_file_cube_equals_the_pandas_recipe(cube_files):
    # the "speed cubing" workload: the first 100 rows x random columns of every file
    root, columns, expected, frames = cube_files
    ds = fl.read_parquet(root)
    for order in ("C", "F"):
        cube = ds.to_numpy(columns, stack=True, per_file=True, rows=100, order=order)
        assert cube.shape == (6, 100, 10) and cube.dtype == np.float64
        np.testing.assert_array_equal(cube, expected)
        block = cube[3]
        assert block.flags.c_contiguous if order == "C" else block.flags.f_contiguous
    mixed = ds.to_numpy([*columns[:2], "n"], stack=True, per_file=True, rows=3)
    assert mixed.dtype == np.float64 and mixed[2, :, 2].tolist() == [2000.0, 2001.0, 2002.0]
    arrays = ds.to_numpy(["n"], per_file=True, rows=2)
    assert arrays["n"].tolist() == [[1000 * i, 1000 * i + 1] for i in range(6)]
    written = fl.read_parquet(root).write(str(root / "out"), rows_per_shard=300)
    assert written.rows == sum(len(df) for df in frames)
    shards = fl.open(str(root / "out")).to_numpy(["n"], stack=True, per_file=True, rows=5)
    assert shards.shape == (len(fl.open(str(root / "out")).manifest.shards), 5, 1)
    assert shards[0, :, 0].tolist() == [0, 1, 2, 3, 4]


def test_to_numpy_per_file_refusals(cube_files, tmp_path):
    root, columns, _, frames = cube_files
    ds = fl.read_parquet(root)
    smallest = min(len(df) for df in frames)
    with pytest.raises(DataError, match=f"holds {smallest} rows") as info:
        ds.to_numpy(columns, stack=True, per_file=True, rows=smallest + 1)
    assert "Fix:" in str(info.value)
    with pytest.raises(DataError, match="like the first file"):
        ds.to_numpy(columns, stack=True, per_file=True)  # files of different lengths
    with pytest.raises(ConfigurationError, match="per_file=True"):
        ds.to_numpy(columns, stack=True, rows=10)
    with pytest.raises(ConfigurationError, match="as stored"):
        ds.filter(pc.field("n") > 3).to_numpy(columns, stack=True, per_file=True, rows=10)
    with pytest.raises(ConfigurationError, match="rows="):
        ds.to_numpy(columns, stack=True, per_file=True, rows=-1)
    empty = ds.to_numpy(columns, stack=True, per_file=True, rows=0)
    assert empty.shape == (6, 0, 10)


def test_to_numpy_nulls_are_nan_for_floats_and_an_error_otherwise(tmp_path):
    pq.write_table(pa.table({"f": [1.0, None], "i": [1, None]}), tmp_path / "a.parquet")
    ds = fl.read_parquet(tmp_path)
    got = ds.to_numpy(["f"], stack=True)
    assert got[0, 0] == 1.0 and np.isnan(got[1, 0])
    with pytest.raises(DataError, match=r"'i'.*null") as info:
        ds.to_numpy(["i"], stack=True)
    assert "a.parquet" in str(info.value) and "Fix:" in str(info.value)


def test_to_numpy_names_the_file_whose_types_drift(tmp_path):
    pq.write_table(pa.table({"x": [1.0, 2.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaError, match=r"b\.parquet") as info:
        fl.read_parquet(tmp_path).to_numpy(stack=True)
    assert "Fix:" in str(info.value)


def test_to_numpy_dict_keeps_tensors_and_strings():
    images = np.random.default_rng(1).random((5, 2, 3))
    ds = fl.from_dict({"img": images, "s": list("abcde"), "n": np.arange(5, dtype=np.int16)})
    arrays = ds.filter(pc.field("n") >= 0).to_numpy()
    np.testing.assert_array_equal(arrays["img"], images)
    assert arrays["s"].tolist() == list("abcde") and arrays["n"].dtype == np.int16


# ---------------------------------------------------------------------------- from_*


def test_from_dict_and_from_numpy():
    ds = fl.from_dict({"x": [1, 2, 3], "y": np.array([0.5, 1.5, 2.5])})
    assert ds.to_arrow().to_pydict() == {"x": [1, 2, 3], "y": [0.5, 1.5, 2.5]}
    with pytest.raises(ConfigurationError, match="different lengths"):
        fl.from_dict({"x": [1, 2], "y": [1]})
    with pytest.raises(ConfigurationError, match="Fix:"):
        fl.from_dict({})
    cube = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    single = fl.from_numpy(cube)
    assert single.schema().field("data").type.shape == [3, 4]
    np.testing.assert_array_equal(single.to_numpy()["data"], cube)
    joined = fl.from_numpy([cube, cube])
    assert joined.count() == 4
    named = fl.from_numpy({"a": np.arange(3), "b": np.ones((3, 2))})
    np.testing.assert_array_equal(named.to_numpy()["b"], np.ones((3, 2)))
    with pytest.raises(ConfigurationError, match="Fix:"):
        fl.from_numpy([[1, 2]])
    with pytest.raises(ConfigurationError, match="0-d"):
        fl.from_numpy({"a": np.array(1.0)})


def test_from_huggingface_uses_the_backing_arrow_table(tmp_path):
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict(
        {"text": [f"t{i}" for i in range(100)], "label": [i % 3 for i in range(100)]}
    )
    saved = tmp_path / "hf"
    hf.save_to_disk(str(saved))
    mapped = datasets.load_from_disk(str(saved))  # memory-mapped from the Arrow cache files
    ds = fl.from_huggingface(mapped)
    table = ds.to_arrow()
    assert table["label"].to_pylist() == [i % 3 for i in range(100)]
    backing = mapped.data.table.column("label").chunk(0).buffers()[1].address
    assert ds.plan.source._table.column("label").chunk(0).buffers()[1].address == backing
    picked = fl.from_huggingface(mapped.select([5, 1]).shuffle(seed=0).filter(lambda r: True))
    assert sorted(picked.to_arrow()["text"].to_pylist()) == ["t1", "t5"]
    with pytest.raises(ConfigurationError, match="one split"):
        fl.from_huggingface(datasets.DatasetDict({"train": hf}))
    with pytest.raises(ConfigurationError, match="map-style"):
        fl.from_huggingface(hf.to_iterable_dataset())


# ---------------------------------------------------------------------------- sample(n=)


def test_sample_n_gives_exactly_n_rows_the_same_for_a_seed():
    ds = fl.range(5000, rows_per_task=700)
    first = ds.sample(n=100, seed=3).to_arrow()["id"].to_pylist()
    assert len(first) == 100 == len(set(first))
    assert ds.sample(n=100, seed=3).to_arrow()["id"].to_pylist() == first
    assert set(ds.sample(n=100, seed=4).to_arrow()["id"].to_pylist()) != set(first)
    other_layout = fl.range(5000, rows_per_task=300).sample(n=100, seed=3)
    assert other_layout.to_arrow()["id"].to_pylist() == first
    assert fl.range(10).sample(n=50, seed=0).count() == 10
    with pytest.raises(ConfigurationError, match="either fraction= or"):
        ds.sample(0.5, n=3)
    with pytest.raises(ConfigurationError, match="Fix:"):
        ds.sample(n=-1)
    with pytest.raises(ConfigurationError, match="Fix:"):
        ds.sample()


# ---------------------------------------------------------------------------- repr / html


def test_repr_names_source_operators_and_schema_without_running(tmp_path):
    def explode(batch):
        raise AssertionError("repr must not run user functions")

    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "a.parquet")
    ds = fl.read_parquet(tmp_path).select(["a"]).limit(2)
    text = repr(ds)
    assert text.startswith("Dataset(parquet:") and "a.parquet" in text
    assert "Select(a)" in text and "Limit(2)" in text and "schema: 1 column: a: int64" in text
    lazy = repr(ds.map_batches(explode))
    assert "MapBatches" in lazy and "known after running" in lazy
    wide = fl.from_dict({f"c{i}": [i] for i in range(20)})
    assert "(+12 more)" in repr(wide)


def test_repr_html_shows_schema_plan_and_known_row_counts_only():
    page = fl.range(1234).select(["id"])._repr_html_()
    assert "<td>id</td><td>int64</td>" in page and "Select(id)" in page
    assert "(1,234 rows)</span>" in page
    filtered = fl.range(1234).filter(pc.field("id") > 3)._repr_html_()
    assert "rows)</span>" not in filtered and "Filter" in filtered
    assert "&lt;" in fl.from_dict({"l": [[1]]})._repr_html_()  # types are escaped


def test_repr_of_a_join_lists_its_inputs_and_runs_none_of_them():
    def explode(batch):
        raise AssertionError("repr must not run user functions")

    left = fl.from_dict({"k": [1, 2], "v": [1.0, 2.0]})
    right = fl.from_dict({"k": [1], "w": ["x"]}).map_batches(explode)
    text = repr(left.join(right, on="k"))
    assert text.startswith("Dataset(join(")
    assert "input 0: dict: 2 rows" in text and "input 1: dict: 1 rows" in text
    assert "MapBatches" in text and "known after running" in text
    page = left.sort("v")._repr_html_()
    assert "sort(" in page and "<td>v</td><td>double</td>" in page


def test_to_numpy_of_a_written_dataset_goes_through_its_checked_reads(tmp_path):
    features = np.random.default_rng(2).random((300, 4))
    images = np.arange(300 * 6, dtype=np.uint8).reshape(300, 2, 3)
    fl.from_numpy({"x": features, "img": images}).write(tmp_path / "ds", rows_per_shard=128)
    opened = fl.open(tmp_path / "ds")
    arrays = opened.to_numpy()
    np.testing.assert_array_equal(arrays["x"], features)
    np.testing.assert_array_equal(arrays["img"], images)
    flat = fl.from_dict({f"f{i}": features[:, i] for i in range(4)})
    flat.write(tmp_path / "flat", rows_per_shard=100)
    np.testing.assert_array_equal(fl.open(tmp_path / "flat").to_numpy(stack=True), features)
