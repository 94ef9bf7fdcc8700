"""The lazy Dataset: laziness, immutability, pushdown, schema, count, limit, sample, map_batches."""

from __future__ import annotations

import threading
import traceback
from collections import Counter

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import feedline as fl
import feedline.engines.protocol as engine_base
from feedline.io.parquet import ParquetSource


class Calls:
    """A map_batches function that counts its calls and the rows it sees."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        with self.lock:
            self.sizes.append(batch.num_rows)
        return batch


def exploding_function(batch: pa.RecordBatch) -> pa.RecordBatch:
    raise ValueError("kaboom from the user function")


@pytest.fixture
def sorted_parquet(tmp_path):
    """One Parquet file, ids 0..9999 sorted, 20 row groups of 500 rows."""
    path = tmp_path / "sorted.parquet"
    ids = np.arange(10_000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "v": ids * 3}), path, row_group_size=500)
    return path


# --------------------------------------------------------------------------- laziness


def test_building_explaining_and_typed_schema_never_call_the_function(sorted_parquet):
    ds = fl.read_parquet(sorted_parquet).map_batches(
        exploding_function, output_schema=pa.schema([("id", pa.int64())])
    )
    ds = ds.select(["id"]).filter(pc.field("id") > 3).limit(5)
    text = ds.explain()
    assert "exploding_function" in text
    assert ds.schema() == pa.schema([("id", pa.int64())])
    iterator = ds.iter_batches()  # creating the iterator runs nothing either
    with pytest.raises(fl.UserFunctionError):
        next(iterator)


@pytest.mark.parametrize(
    "terminal",
    [
        lambda ds: ds.to_arrow(),
        lambda ds: ds.count(),
        lambda ds: ds.take(1),
        lambda ds: list(ds.iter_batches(4)),
        lambda ds: ds.analyze(),
        lambda ds: ds.write(ds.target),
    ],
    ids=["to_arrow", "count", "take", "iter_batches", "analyze", "write"],
)
def test_user_function_error_at_terminal_call(sorted_parquet, tmp_path, terminal):
    ds = fl.read_parquet(sorted_parquet).map_batches(exploding_function)
    ds.target = tmp_path / "out"  # where the write goes (plain attribute on this instance)
    with pytest.raises(fl.UserFunctionError) as info:
        terminal(ds)
    error = info.value
    assert "exploding_function" in str(error)
    assert "sorted.parquet" in str(error)
    assert "Fix:" in str(error)
    cause = error.__cause__
    assert isinstance(cause, ValueError)
    assert str(cause) == "kaboom from the user function"
    frames = [frame.name for frame in traceback.extract_tb(cause.__traceback__)]
    assert frames[-1] == "exploding_function"
    assert not (tmp_path / "out" / "_feedline.json").exists()


def test_constructor_error_is_a_user_function_error():
    class Model:
        def __init__(self, path: str) -> None:
            raise FileNotFoundError(path)

        def __call__(self, batch):
            return batch

    ds = fl.range(10).map_batches(Model, fn_constructor_kwargs={"path": "weights.bin"})
    with pytest.raises(fl.UserFunctionError, match="Model") as info:
        ds.to_arrow()
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert "Fix:" in str(info.value)


def test_unfitted_preprocessor_is_fitted_only_at_execution():
    fits = []

    class Shift:
        def __init__(self, offset=None):
            self.offset = offset

        @property
        def is_fitted(self):
            return self.offset is not None

        def fit(self, ds):
            fits.append(1)
            return Shift(int(pc.min(ds.to_arrow()["id"]).as_py()) + 100)

        def transform_batch(self, batch, report=None, where=""):
            shifted = pc.add(batch["id"], self.offset)
            return pa.record_batch({"id": shifted})

    ds = fl.range(5).filter(pc.field("id") >= 2).transform(Shift())
    assert fits == []
    assert ds.to_arrow()["id"].to_pylist() == [104, 105, 106]
    assert fits == [1]
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.range(5).transform(object())


# --------------------------------------------------------------------------- immutability


def test_every_method_returns_a_new_dataset():
    class Fitted:
        is_fitted = True

        def transform_batch(self, batch, report=None, where=""):
            return batch

    base = fl.range(20)
    before = base.plan
    derived = {
        "select": base.select(["id"]),
        "filter": base.filter(pc.field("id") > 4),
        "filter_fn": base.filter(lambda b: pc.greater(b["id"], 4)),
        "map_batches": base.map_batches(lambda b: b, batch_size=3),
        "transform": base.transform(Fitted()),
        "limit": base.limit(3),
        "sample": base.sample(0.5, seed=1),
    }
    for name, ds in derived.items():
        assert isinstance(ds, fl.Dataset), name
        assert ds is not base, name
        assert len(ds.plan.ops) == 1, name
    assert base.plan is before
    assert base.plan.ops == ()
    assert base.to_arrow()["id"].to_pylist() == list(range(20))
    chained = base.limit(10).limit(3)
    assert base.limit(10).count() == 10
    assert chained.count() == 3


# --------------------------------------------------------------------------- pushdown


def test_expression_filter_is_pushed_down_and_skips_row_groups(sorted_parquet):
    ds = fl.read_parquet(sorted_parquet).filter(pc.field("id") >= 9_000)
    text = ds.explain()
    assert "predicate: (id >= 9000)" in text
    report = ds.analyze()
    assert report.row_groups_total == 20
    assert report.row_groups_skipped == 18
    assert report.row_groups_read == 2
    assert report.rows_out == 1_000
    table = ds.to_arrow()
    assert table["id"].to_pylist() == list(range(9_000, 10_000))
    assert table["v"].to_pylist() == [3 * i for i in range(9_000, 10_000)]
    analyzed = ds.explain(analyze=True)
    assert "row_groups_skipped: 18" in analyzed


def test_pushed_filter_and_select_combine(sorted_parquet):
    ds = (
        fl.read_parquet(sorted_parquet)
        .select(["id", "v"])
        .filter(pc.field("id") < 700)
        .filter(pc.field("v") >= 30)
        .select(["v"])
    )
    text = ds.explain()
    assert "columns: ['v']" in text
    assert "(id < 700)" in text and "(v >= 30)" in text
    report = ds.analyze()
    assert report.row_groups_skipped == 18
    assert ds.to_arrow().to_pydict() == {"v": [3 * i for i in range(10, 700)]}


def test_callable_filter_works_and_is_not_pushed(sorted_parquet):
    def keep_tail(batch):
        return pc.greater_equal(batch["id"], 9_000)

    ds = fl.read_parquet(sorted_parquet).filter(keep_tail)
    text = ds.explain()
    assert "predicate: none" in text
    assert "keep_tail" in text
    report = ds.analyze()
    assert report.row_groups_skipped == 0
    assert report.row_groups_read == 20
    assert report.function_calls >= 1
    assert ds.to_arrow()["id"].to_pylist() == list(range(9_000, 10_000))


def test_filter_after_map_batches_is_not_pushed(sorted_parquet):
    ds = (
        fl.read_parquet(sorted_parquet)
        .map_batches(lambda b: {"id": pc.negate(b["id"])})
        .filter(pc.field("id") > -3)
    )
    assert "predicate: none" in ds.explain()
    assert ds.analyze().row_groups_skipped == 0
    assert sorted(ds.to_arrow()["id"].to_pylist()) == [-2, -1, 0]


def test_filter_on_missing_column_is_a_schema_error():
    with pytest.raises(fl.SchemaError, match="Fix:"):
        fl.range(5).select(["id"]).filter(pc.field("nope") > 1).to_arrow()


def test_callable_filter_must_return_one_boolean_per_row():
    with pytest.raises(fl.UserFunctionError, match="boolean"):
        fl.range(5).filter(lambda b: pc.greater(b["id"], 1).slice(1)).to_arrow()


# --------------------------------------------------------------------------- count / schema


def test_count_from_metadata_does_not_read(sorted_parquet, monkeypatch):
    def no_reading(self, columns, predicate):
        raise AssertionError("count() read the data")

    monkeypatch.setattr(ParquetSource, "read_tasks", no_reading)
    ds = fl.read_parquet(sorted_parquet)
    assert ds.count() == 10_000
    assert ds.select(["v"]).count() == 10_000
    assert ds.limit(42).count() == 42
    assert ds.limit(20_000).select(["id"]).count() == 10_000


def test_count_of_huge_range_is_instant():
    assert fl.range(10**12).count() == 10**12
    assert fl.range(10**12).limit(7).count() == 7


def test_count_with_user_functions_runs_them():
    calls = Calls()
    assert fl.range(1000, rows_per_task=100).map_batches(calls).count() == 1000
    assert sum(calls.sizes) == 1000
    assert fl.range(100).filter(lambda b: pc.less(b["id"], 10)).count() == 10
    assert fl.range(100).filter(pc.field("id") < 10).count() == 10


def test_schema_without_user_functions_comes_from_metadata(sorted_parquet):
    ds = fl.read_parquet(sorted_parquet).select(["v", "id"]).filter(pc.field("id") > 0).limit(3)
    assert ds.schema() == pa.schema([("v", pa.int64()), ("id", pa.int64())])
    with pytest.raises(fl.SchemaError, match="nope"):
        fl.read_parquet(sorted_parquet).select(["nope"]).schema()


def test_schema_of_map_without_output_schema_is_sampled():
    calls = Calls()

    def add_square(batch):
        calls(batch)
        ids = batch["id"].to_numpy()
        return {"id": ids, "square": (ids**2).astype(np.float32), "tag": ["x"] * len(ids)}

    ds = fl.range(10**9).map_batches(add_square)  # sampling must not touch a billion rows
    schema = ds.schema()
    assert schema.names == ["id", "square", "tag"]
    assert schema.field("square").type == pa.float32()
    assert schema.field("tag").type == pa.string()
    assert len(calls.sizes) == 1
    assert 0 < calls.sizes[0] <= 16


def test_schema_with_output_schema_after_sampled_map():
    calls = Calls()
    ds = (
        fl.range(50)
        .map_batches(calls)
        .map_batches(exploding_function, output_schema=pa.schema([("z", pa.int8())]))
    )
    assert ds.schema() == pa.schema([("z", pa.int8())])
    assert calls.sizes == []


# --------------------------------------------------------------------------- limit / take / sample


def test_limit_and_take_stop_early(parquet_folder):
    folder = parquet_folder(n_files=40, rows=50)
    engine = fl.LocalEngine(parallelism=2)
    ds = fl.read_parquet(folder)
    report = ds.limit(5).analyze(engine=engine)
    assert report.rows_out == 5
    assert report.files_read <= 4  # at most the tasks already running, not all 40
    assert ds.take(3, engine=engine) == [{"id": i, "x": i / 2} for i in range(3)]
    assert ds.limit(120).to_arrow(engine=engine)["id"].to_pylist() == list(range(120))


def test_limit_then_more_operators():
    calls = Calls()
    ds = fl.range(10_000, rows_per_task=1_000).limit(2_500).map_batches(calls).limit(30)
    assert ds.to_arrow()["id"].to_pylist() == list(range(30))
    assert sum(calls.sizes) < 10_000
    assert fl.range(10).limit(0).to_arrow().num_rows == 0


def test_sample_is_deterministic_per_seed_and_close_to_fraction():
    source = fl.range(100_000, rows_per_task=5_000)
    first = source.sample(0.1, seed=7).to_arrow()["id"].to_pylist()
    again = source.sample(0.1, seed=7).to_arrow()["id"].to_pylist()
    other = source.sample(0.1, seed=8).to_arrow()["id"].to_pylist()
    assert first == again
    assert first != other
    assert 9_000 < len(first) < 11_000  # ~10 standard deviations of slack
    assert first == sorted(first) and len(set(first)) == len(first)
    unordered = sorted(
        i
        for b in source.sample(0.1, seed=7).iter_batches(preserve_order=False)
        for i in b["id"].to_pylist()
    )
    assert unordered == first
    assert source.sample(0.0).count() == 0
    assert source.sample(1.0).count() == 100_000


# --------------------------------------------------------------------------- map_batches


def test_map_batches_dict_with_2d_numpy_gives_fixed_shape_tensor():
    def embed(batch):
        ids = batch["id"].to_numpy()
        return {"id": ids, "vec": np.stack([ids, ids * 10, ids * 100], axis=1).astype(np.float32)}

    table = fl.range(50, rows_per_task=16).map_batches(embed, batch_size=7).to_arrow()
    column = table["vec"]
    assert column.type.extension_name == "arrow.fixed_shape_tensor"
    assert column.type.shape == [3]
    assert column.type.value_type == pa.float32()
    array = column.combine_chunks().to_numpy_ndarray()
    ids = np.arange(50, dtype=np.float32)
    np.testing.assert_array_equal(array, np.stack([ids, ids * 10, ids * 100], axis=1))


def test_map_batches_3d_numpy_keeps_shape():
    def image(batch):
        n = batch.num_rows
        return {"img": np.arange(n * 2 * 3, dtype=np.uint8).reshape(n, 2, 3)}

    table = fl.range(4).map_batches(image).to_arrow()
    assert table["img"].type.shape == [2, 3]
    np.testing.assert_array_equal(
        table["img"].combine_chunks().to_numpy_ndarray(),
        np.arange(24, dtype=np.uint8).reshape(4, 2, 3),
    )


def test_map_batches_pandas_polars_and_table_returns():
    as_pandas = fl.range(6).map_batches(
        lambda b: pd.DataFrame({"half": b["id"].to_numpy() / 2}), batch_size=4
    )
    assert as_pandas.to_arrow().to_pydict() == {"half": [i / 2 for i in range(6)]}
    as_polars = fl.range(3).map_batches(lambda b: pl.DataFrame({"s": [str(i) for i in b["id"]]}))
    assert as_polars.to_arrow()["s"].to_pylist() == ["0", "1", "2"]
    as_table = fl.range(3).map_batches(
        lambda b: pa.Table.from_batches([b]).append_column("one", pa.array([1] * b.num_rows))
    )
    assert as_table.to_arrow().column_names == ["id", "one"]


def test_map_batches_fn_kwargs_and_bad_return():
    def scale(batch, factor):
        return {"id": pc.multiply(batch["id"], factor)}

    ds = fl.range(4).map_batches(scale, fn_kwargs={"factor": 3})
    assert ds.to_arrow()["id"].to_pylist() == [0, 3, 6, 9]
    with pytest.raises(fl.UserFunctionError, match="returned list"):
        fl.range(4).map_batches(lambda b: [1, 2]).to_arrow()


def test_map_batches_batch_size_is_respected_within_each_task():
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def record(batch):
        with lock:
            seen.append((batch["id"][0].as_py(), batch.num_rows))
        return batch

    rows_per_task = 250
    ds = fl.range(1_000, rows_per_task=rows_per_task).map_batches(record, batch_size=60)
    assert ds.to_arrow()["id"].to_pylist() == list(range(1_000))
    per_task: dict[int, list[tuple[int, int]]] = {}
    for first, rows in seen:
        per_task.setdefault(first // rows_per_task, []).append((first, rows))
    assert sorted(per_task) == [0, 1, 2, 3]
    for batches in per_task.values():
        sizes = [rows for _, rows in sorted(batches)]
        assert sizes[:-1] == [60] * (len(sizes) - 1)
        assert 0 < sizes[-1] <= 60
        assert sum(sizes) == rows_per_task


def test_map_batches_class_constructed_once_per_worker():
    constructed = Counter()
    lock = threading.Lock()

    class Model:
        def __init__(self, scale):
            with lock:
                constructed[threading.get_ident()] += 1
            self.scale = scale

        def __call__(self, batch):
            return {"y": pc.multiply(batch["id"], self.scale)}

    engine = fl.LocalEngine(parallelism=3)
    ds = fl.range(3_000, rows_per_task=100).map_batches(
        Model, batch_size=25, fn_constructor_kwargs={"scale": 2}
    )
    assert ds.to_arrow(engine=engine)["y"].to_pylist() == [2 * i for i in range(3_000)]
    assert 1 <= sum(constructed.values()) <= engine.parallelism
    assert set(constructed.values()) == {1}


@pytest.mark.parametrize(
    "call",
    [
        lambda: fl.range(3).select([]),
        lambda: fl.range(3).select([1]),
        lambda: fl.range(3).filter(5),
        lambda: fl.range(3).map_batches(5),
        lambda: fl.range(3).map_batches(lambda b: b, batch_size=0),
        lambda: fl.range(3).map_batches(lambda b: b, fn_constructor_kwargs={"a": 1}),
        lambda: fl.range(3).limit(-1),
        lambda: fl.range(3).sample(1.5),
        lambda: fl.range(3).iter_batches(0),
    ],
)
def test_bad_arguments_raise_configuration_errors(call):
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        call()


# --------------------------------------------------------------------------- terminal calls


def test_iter_batches_exact_sizes_and_to_pandas():
    sizes = [b.num_rows for b in fl.range(1_000, rows_per_task=64).iter_batches(300)]
    assert sizes == [300, 300, 300, 100]
    df = fl.range(3).to_pandas()
    assert list(df["id"]) == [0, 1, 2]


def test_to_arrow_of_an_empty_result_keeps_the_schema():
    table = fl.range(10).filter(pc.field("id") > 100).to_arrow()
    assert table.num_rows == 0
    assert table.schema.names == ["id"]


def test_repr_lists_the_plan():
    text = repr(fl.range(3).select(["id"]).limit(2))
    assert text.startswith("Dataset(") and "Select(id)" in text and "Limit(2)" in text


# ------------------------------------------------------------------ the stored preprocessor


def test_preprocessor_of_a_written_dataset_is_the_fitted_pipeline(tmp_path):
    table = pa.table({"price": [1.0, 2.0, 6.0], "cat": ["a", "b", "a"]})
    scaler, indexer = fl.StandardScaler("price"), fl.StringIndexer("cat")
    fl.from_arrow(table).transform(scaler).transform(indexer).write(tmp_path / "ds")
    stored = fl.open(tmp_path / "ds").preprocessor
    assert isinstance(stored, fl.Chain) and stored.is_fitted  # two transforms: one chain
    written = fl.open(tmp_path / "ds").to_arrow().to_pylist()
    assert [stored.transform_record(r) for r in table.to_pylist()] == written
    # the user's objects stay unfitted, and the error says where the fitted copy is
    assert not scaler.is_fitted
    with pytest.raises(fl.ConfigurationError) as info:
        scaler.transform_record({"price": 1.0})
    message = str(info.value)
    assert "fl.open(path).preprocessor" in message and "p = p.fit(ds)" in message
    assert "Fix:" in message


def test_preprocessor_is_none_without_a_stored_pipeline(tmp_path):
    assert fl.range(3).preprocessor is None  # never written
    assert fl.range(3).transform(fl.StandardScaler("id")).preprocessor is None
    fl.range(3).write(tmp_path / "plain")
    assert fl.open(tmp_path / "plain").preprocessor is None
    fl.range(3).transform(fl.StandardScaler("id")).write(tmp_path / "one")
    one = fl.open(tmp_path / "one").preprocessor
    assert isinstance(one, fl.StandardScaler) and one.transform_record({"id": 1}) == {"id": 0.0}


# ------------------------------------------------------------------ one class, its seams


def test_dataset_is_one_class():
    assert fl.Dataset.__mro__ == (fl.Dataset, object)


def test_aggregate_samples_and_selects_columns(tmp_path):
    out = tmp_path / "ds"
    # shuffled: a sample of 2 row groups of sorted ids is not representative (it grows)
    fl.range(1000).with_columns(y=pc.field("id") * 2).random_shuffle(seed=0).write(
        out, rows_per_shard=500, row_group_rows=100
    )
    ds = fl.open(out)
    names: set[tuple[str, ...]] = set()

    def partial(batch: pa.RecordBatch) -> int:
        names.add(tuple(batch.schema.names))
        return batch.num_rows

    assert ds.aggregate(partial, lambda a, b: a + b, fraction=0.2, columns=["y"]) == 200
    assert names == {("y",)}
    assert ds.aggregate(partial, lambda a, b: a + b, fraction=1.0) == 1000
    for fraction in (1.5, -0.1):
        with pytest.raises(fl.ConfigurationError, match="Fix:"):
            ds.aggregate(partial, lambda a, b: a + b, fraction=fraction)
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        ds.aggregate(partial, lambda a, b: a + b, columns=[])


def test_a_terminal_call_resolves_its_engine_once(tmp_path, monkeypatch):
    """write (with the fits it triggers and stats=True), count, to_arrow, aggregate, stats:
    each builds its engine from the name once and hands that engine down."""
    (tmp_path / "counted_engine.py").write_text(
        "from feedline.engines.local.engine import LocalEngine\n"
        "made = []\n"
        "def make():\n"
        "    made.append(1)\n"
        "    return LocalEngine()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(engine_base._REGISTRY, "counted", ("counted_engine:make", None, None))
    import counted_engine

    def pipeline() -> fl.Dataset:  # two unfitted preprocessors: two fits before the pass
        table = pa.table({"x": [1.0, 2.0, 3.0, 4.0], "c": ["a", "b", "a", "c"]})
        return (
            fl.from_arrow(table).transform(fl.StandardScaler("x")).transform(fl.StringIndexer("c"))
        )

    calls = {
        "write": lambda: pipeline().write(tmp_path / "out", engine="counted", stats=True),
        "count": lambda: pipeline().sort("x").count(engine="counted"),
        "to_arrow": lambda: pipeline().to_arrow(engine="counted"),
        "to_numpy": lambda: pipeline().to_numpy(["x"], engine="counted"),
        "iter_batches": lambda: list(pipeline().iter_batches(engine="counted")),
        "aggregate": lambda: pipeline().aggregate(len, max, "counted", fraction=0.5),
        "stats": lambda: fl.stats(pipeline(), engine="counted"),
        "fit": lambda: fl.MinMaxScaler("x").fit(pipeline(), engine="counted"),
    }
    for name, call in calls.items():
        before = len(counted_engine.made)
        call()
        assert len(counted_engine.made) - before == 1, name
    fitted = fl.open(tmp_path / "out").preprocessor
    assert [type(step).__name__ for step in fitted.steps] == ["StandardScaler", "StringIndexer"]
