"""The local engine lets DuckDB scan plain inputs itself, shares one DuckDB database per
execution, and computes only the columns needed: same rows as the streamed path."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.engines.local.duckdb_inputs import register_direct
from feedline.engines.local.relational import _inputs
from feedline.errors import DataError, SchemaError
from feedline.io.source import ExecutionReport
from feedline.plan.direct_inputs import plain_parquet
from feedline.plan.plan import Select


def _facts(n: int = 3000, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 50, n)
    seconds = rng.integers(0, 10**6, n)
    return pa.table(
        {
            "k": pa.array(keys, mask=rng.random(n) < 0.05),
            "v": pa.array(rng.standard_normal(n), mask=rng.random(n) < 0.05),
            "s": pa.array([f"s{x}" for x in rng.integers(0, 400, n)]),
            "t": pa.array(
                [dt.datetime(2026, 1, 1) + dt.timedelta(seconds=int(x)) for x in seconds],
                pa.timestamp("us"),
            ),
        }
    )


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    facts, dims = tmp_path / "facts", tmp_path / "dims"
    facts.mkdir()
    dims.mkdir()
    table = _facts()
    for part in range(3):
        pq.write_table(table.slice(part * 1000, 1000), facts / f"part-{part}.parquet")
    pq.write_table(pa.table({"k": np.arange(0, 60, 2), "d": np.arange(30) * 1.5}),
                   dims / "part-0.parquet")  # fmt: skip
    return facts, dims


def _streamed(ds: fl.Dataset) -> fl.Dataset:
    """The same rows through the engine's batch stage (no direct scan possible)."""
    return ds.map_batches(lambda batch: batch)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(c, "ascending") for c in table.column_names])


def _same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Equal up to row order; floating aggregates up to summation order (DuckDB adds in
    parallel, in any order, on either path)."""
    keys = [(c, "ascending") for c, t in zip(a.column_names, a.schema.types, strict=True)
            if not pa.types.is_floating(t)]  # fmt: skip
    a, b = a.sort_by(keys), b.sort_by(keys)
    for name, kind in zip(a.column_names, a.schema.types, strict=True):
        if pa.types.is_floating(kind):
            x, y = a[name].to_numpy(zero_copy_only=False), b[name].to_numpy(zero_copy_only=False)
            if not np.allclose(x, y, rtol=1e-12, atol=0, equal_nan=True):
                return False
        elif not a[name].equals(b[name]):
            return False
    return True


def test_direct_parquet_scan_gives_the_streamed_rows(folders) -> None:
    facts_dir, dims_dir = folders
    facts, dims = fl.read_parquet(facts_dir), fl.read_parquet(dims_dir)
    assert plain_parquet(facts.plan) is not None
    assert plain_parquet(_streamed(facts).plan) is None
    cases = [
        lambda f, d: f.sort(["v", "s", "t", "k"], descending=[True, False, False, False]),
        lambda f, d: f.groupby("k").agg(n=("*", "count"), m=("v", "mean"), u=("s", "n_unique")),
        lambda f, d: f.join(d, on="k", how="inner"),
        lambda f, d: f.join(d, on="k", how="outer"),
        lambda f, d: f.join(d, on="k", how="anti"),
        lambda f, d: f.unique(["s"]).select(["s"]),
        lambda f, d: f.union(f),
    ]
    for make in cases:
        direct = make(facts, dims).to_arrow()
        streamed = make(_streamed(facts), _streamed(dims)).to_arrow()
        assert direct.schema == streamed.schema
        assert _same_rows(direct, streamed)
    # a sort is byte-equal in order too (its keys are unique here)
    by = ["v", "s", "t", "k"]
    assert facts.sort(by).to_arrow().equals(_streamed(facts).sort(by).to_arrow())


def test_direct_scan_of_an_arrow_table_and_its_report(folders) -> None:
    table = _facts()
    con = duckdb.connect()
    report = ExecutionReport()
    scan = register_direct(con, "input_0", fl.from_arrow(table).select(["k", "v"]).plan, report)
    assert scan is not None and scan.schema.names == ["k", "v"] and report.rows_read == 3000
    assert con.sql("SELECT count(*), count(k) FROM input_0").fetchall() == [
        (3000, table["k"].length() - table["k"].null_count)]  # fmt: skip
    files = ExecutionReport()
    parquet = register_direct(con, "input_1", fl.read_parquet(folders[0]).plan, files)
    assert parquet is not None and len(parquet.files) == 3
    assert (files.files_read, files.rows_read) == (3, 3000)


def test_drifting_files_still_raise_the_drift_error(folders, tmp_path: Path) -> None:
    facts_dir, _ = folders
    pq.write_table(pa.table({"k": pa.array([1], pa.int32()), "v": [1.0], "s": ["x"],
                             "t": pa.array([0], pa.timestamp("us"))}),
                   facts_dir / "part-9.parquet")  # fmt: skip
    assert plain_parquet(fl.read_parquet(facts_dir).plan) is None
    with pytest.raises(SchemaError, match="Schema drift"):
        fl.read_parquet(facts_dir).sort("v").to_arrow()


def test_a_corrupt_file_read_by_duckdb_raises_data_error(tmp_path: Path) -> None:
    n = 200_000
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"k": np.arange(n) % 100, "v": np.random.default_rng(0).random(n)}),
                   path, compression="none")  # fmt: skip
    data = bytearray(path.read_bytes())
    for i in range(1000, len(data) - 20_000, 7919):  # data pages, not the footer
        data[i] = (data[i] + 77) % 256
    path.write_bytes(bytes(data))
    assert plain_parquet(fl.read_parquet(tmp_path).plan) is not None
    with pytest.raises(DataError, match=r"corrupt.*Fix:"):
        fl.read_parquet(tmp_path).sort("v").to_arrow()


def test_nested_operators_share_one_duckdb_database(monkeypatch) -> None:
    opened = []
    connect = duckdb.connect

    def counting(*args, **kwargs):
        con = connect(*args, **kwargs)
        opened.append(con)
        return con

    monkeypatch.setattr(duckdb, "connect", counting)
    ds = fl.range(1000).repartition(3).sort("id", descending=True)
    ds = (
        ds.groupby([])
        .agg(n=("*", "count"), top=("id", "max"))
        .union(fl.range(1).groupby([]).agg(n=("*", "count"), top=("id", "max")))
    )
    assert sorted(ds.to_arrow().to_pylist(), key=lambda r: r["n"]) == [
        {"n": 1, "top": 0}, {"n": 1000, "top": 999}]  # fmt: skip
    assert len(opened) == 1


def test_only_the_columns_an_operator_uses_are_read() -> None:
    ds = fl.from_arrow(_facts())
    grouped = ds.groupby("k").agg(m=("v", "mean"), n=("*", "count"))
    (plan,) = _inputs(grouped.plan.source)
    # the mean's exact partials (feedline.plan.exact_aggregates) travel with the columns
    assert plan.ops[-1] == Select(("k", "v", "__feedline_exact_v"))
    counted = ds.groupby("k").agg(top=("v", "max"), n=("*", "count"))
    (plan,) = _inputs(counted.plan.source)
    assert plan.ops[-1] == Select(("k", "v"))
    semi = ds.join(ds, on="k", how="semi")
    left, right = _inputs(semi.plan.source)
    assert not left.ops and right.ops[-1] == Select(("k",))
    # a projection after the operator is computed by DuckDB: same values
    assert ds.sort("v").select(["v"]).to_arrow().equals(ds.sort("v").to_arrow().select(["v"]))


def test_the_schema_after_an_operator_is_learnt_without_running_it_on_all_rows() -> None:
    seen = []

    def counted(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.num_rows)
        return batch

    ds = fl.range(300_000).map_batches(counted).sort("id", descending=True)
    ds = ds.join(fl.range(10).groupby("id").agg(n=("*", "count")), on="id", how="left")
    ds = ds.map_batches(lambda b: b.append_column("twice", pa.compute.multiply(b["id"], 2)))
    assert ds.schema().names == ["id", "n", "twice"]
    assert ds.schema().field("twice").type == pa.int64()
    assert 0 < sum(seen) < 200_000  # a sample (and read-ahead), not all 300 000 rows
