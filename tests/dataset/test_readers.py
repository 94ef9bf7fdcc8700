"""Every reader on small files the tests create: parquet, csv, jsonl, text, images, frames."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

import feedline as fl
import feedline.io.text_files as text_module
from feedline.io.csv.reader import CsvSource

# --------------------------------------------------------------------------- parquet


def test_read_parquet_file_folder_glob_and_list(parquet_folder):
    folder = parquet_folder(n_files=3, rows=10)
    files = sorted(folder.glob("*.parquet"))
    expected = list(range(30))

    assert fl.read_parquet(files[1]).to_arrow()["id"].to_pylist() == list(range(10, 20))
    assert fl.read_parquet(folder).to_arrow()["id"].to_pylist() == expected
    assert fl.read_parquet(str(folder / "part-*.parquet")).to_arrow()["id"].to_pylist() == expected
    assert fl.read_parquet([files[2], files[0]]).to_arrow()["id"].to_pylist() == [
        *range(20, 30),
        *range(10),
    ]


def test_read_parquet_folder_skips_hidden_and_underscore_files(parquet_folder):
    folder = parquet_folder(n_files=2, rows=5)
    (folder / "_SUCCESS").write_text("")
    (folder / ".hidden").mkdir()
    pq.write_table(pa.table({"other": ["x"]}), folder / ".hidden" / "junk.parquet")
    (folder / "notes.txt").write_text("not parquet")
    assert fl.read_parquet(folder).count() == 10
    assert fl.read_parquet(folder).to_arrow().num_rows == 10


def test_read_parquet_columns(parquet_folder):
    folder = parquet_folder(n_files=2, rows=4)
    ds = fl.read_parquet(folder, columns=["x"])
    assert ds.schema().names == ["x"]
    table = ds.to_arrow()
    assert table.column_names == ["x"]
    assert table["x"].to_pylist() == [i / 2 for i in range(8)]
    assert fl.read_parquet(folder, columns=["x", "id"]).to_arrow().column_names == ["x", "id"]


def test_read_parquet_missing_column_and_path(parquet_folder, tmp_path):
    folder = parquet_folder(n_files=1, rows=4)
    with pytest.raises(fl.SchemaError, match="nope"):
        fl.read_parquet(folder, columns=["nope"]).to_arrow()
    with pytest.raises(fl.DataError, match="does not exist"):
        fl.read_parquet(tmp_path / "missing.parquet")
    with pytest.raises(fl.DataError, match="matched no"):
        fl.read_parquet(str(tmp_path / "nothing-*.parquet"))


def test_read_parquet_corrupt_file_names_it(tmp_path):
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), good)
    bad = tmp_path / "b.parquet"
    bad.write_bytes(good.read_bytes()[:-12])
    with pytest.raises(fl.DataError, match=r"b\.parquet"):
        fl.read_parquet([good, bad]).to_arrow()


def test_mixed_parquet_schemas_name_both_files(tmp_path):
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "one.parquet")
    pq.write_table(pa.table({"a": [1.5, 2.5]}), tmp_path / "two.parquet")
    with pytest.raises(fl.SchemaError) as info:
        fl.read_parquet(tmp_path).to_arrow()
    message = str(info.value)
    assert "one.parquet" in message and "two.parquet" in message
    assert "Fix:" in message


# --------------------------------------------------------------------------- csv


def test_read_csv_infers_types(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("i,f,s,b\n1,1.5,x,true\n2,,y,false\n3,3.5,,true\n")
    table = fl.read_csv(path).to_arrow()
    assert table.schema.field("i").type == pa.int64()
    assert table.schema.field("f").type == pa.float64()
    assert table.schema.field("s").type == pa.string()
    assert table.schema.field("b").type == pa.bool_()
    assert table.to_pydict() == {
        "i": [1, 2, 3],
        "f": [1.5, None, 3.5],
        "s": ["x", "y", ""],
        "b": [True, False, True],
    }


def test_read_csv_schema_and_column_types(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("a,b\n1,2\n3,4\n")
    schema = pa.schema([("a", pa.int8()), ("b", pa.string())])
    table = fl.read_csv(path, schema=schema).to_arrow()
    assert table.schema == schema
    assert table.to_pydict() == {"a": [1, 3], "b": ["2", "4"]}

    ds = fl.read_csv(path, column_types={"a": pa.float32()})
    assert ds.schema().field("a").type == pa.float32()
    assert ds.schema().field("b").type == pa.int64()
    assert ds.to_arrow()["a"].type == pa.float32()


def test_read_csv_gzip_and_delimiter(tmp_path):
    with gzip.open(tmp_path / "a.csv.gz", "wt") as handle:
        handle.write("a,b\n1,x\n2,y\n")
    assert fl.read_csv(tmp_path / "a.csv.gz").to_arrow().to_pydict() == {
        "a": [1, 2],
        "b": ["x", "y"],
    }
    (tmp_path / "t.tsv").write_text("a\tb\n5\tz\n")
    assert fl.read_csv(tmp_path / "t.tsv", delimiter="\t").take(1) == [{"a": 5, "b": "z"}]


def test_read_csv_on_error_skip_counts_rows(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,b,c\n1,x,1.5\n2,y\n3,z,3.5,extra\n4,w,4.5\n")
    ds = fl.read_csv(path, on_error="skip")
    assert ds.to_arrow()["a"].to_pylist() == [1, 4]
    report = ds.analyze()
    assert report.records_skipped == 2
    assert len(report.skipped) == 2
    assert all("bad.csv" in entry["where"] for entry in report.skipped)
    reasons = sorted(entry["reason"] for entry in report.skipped)
    assert reasons == ["expected 3 fields, got 2", "expected 3 fields, got 4"]


def test_read_csv_skipped_rows_reach_the_write_report(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n3\n5,6\n")
    info = fl.read_csv(path, on_error="skip").write(tmp_path / "out")
    assert info.rows == 2
    assert info.report["records_skipped"] == 1
    manifest = json.loads((tmp_path / "out" / "_feedline.json").read_text())
    assert manifest["write"]["report"]["records_skipped"] == 1


def test_read_csv_on_error_raise_names_the_file(tmp_path):
    (tmp_path / "a.csv").write_text("a,b\n1,2\n")
    (tmp_path / "b.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(fl.DataError) as info:
        fl.read_csv(tmp_path).to_arrow()
    assert "b.csv" in str(info.value)
    assert "Fix:" in str(info.value)
    # a bad row in the first file is reported too (while inferring the schema)
    (tmp_path / "a.csv").write_text("a,b\n1\n")
    with pytest.raises(fl.DataError, match=r"a\.csv"):
        fl.read_csv(tmp_path / "a.csv").to_arrow()


def test_read_csv_bad_value_for_declared_type_names_the_file(tmp_path):
    path = tmp_path / "vals.csv"
    path.write_text("a\n1\nnot-a-number\n")
    with pytest.raises(fl.DataError, match=r"vals\.csv"):
        fl.read_csv(path, column_types={"a": pa.int64()}).to_arrow()


def test_large_csv_read_as_byte_ranges_keeps_every_row_in_order(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("id,name,v\n" + "".join(f"{i},n{i},{i / 3}\n" for i in range(500)))
    source = CsvSource(path, split_bytes=97)
    assert len(source.read_tasks(None, None)) > 50
    ds = fl.Dataset.from_source(source)
    table = ds.to_arrow()
    assert table["id"].to_pylist() == list(range(500))
    assert table["name"].to_pylist() == [f"n{i}" for i in range(500)]
    tail = ds.filter(pc.field("id") >= 495).select(["name"]).to_arrow()
    assert tail.to_pydict() == {"name": [f"n{i}" for i in range(495, 500)]}


def test_read_csv_rejects_unknown_on_error(tmp_path):
    (tmp_path / "a.csv").write_text("a\n1\n")
    with pytest.raises(fl.ConfigurationError, match="on_error"):
        fl.read_csv(tmp_path / "a.csv", on_error="ignore")


@pytest.mark.parametrize(
    "second",
    ["a,c\n1,2\n", "a,b,c\n1,2,3\n", "a\n1\n", "b,a\n1,2\n"],
    ids=["renamed", "extra", "missing", "reordered"],
)
def test_csv_files_with_different_columns_name_both_files(tmp_path, second):
    (tmp_path / "first.csv").write_text("a,b\n1,2\n")
    (tmp_path / "second.csv").write_text(second)
    with pytest.raises(fl.SchemaError) as info:
        fl.read_csv(tmp_path).to_arrow()
    message = str(info.value)
    assert "first.csv" in message and "second.csv" in message


# --------------------------------------------------------------------------- jsonl


def test_read_jsonl(tmp_path):
    path = tmp_path / "a.jsonl"
    rows = [{"a": 1, "s": "x", "l": [1, 2]}, {"a": 2, "s": None, "l": []}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = fl.read_jsonl(path).to_arrow()
    assert table.to_pylist() == rows
    assert table.schema.field("a").type == pa.int64()
    assert pa.types.is_list(table.schema.field("l").type)
    assert fl.read_jsonl(path, columns=["s"]).to_arrow().to_pydict() == {"s": ["x", None]}


def test_read_jsonl_gzip_and_many_files(tmp_path):
    for i in range(3):
        with gzip.open(tmp_path / f"p{i}.jsonl.gz", "wt") as handle:
            handle.write(f'{{"id": {2 * i}}}\n{{"id": {2 * i + 1}}}\n')
    assert fl.read_jsonl(tmp_path).to_arrow()["id"].to_pylist() == list(range(6))


def test_read_jsonl_invalid_line_names_the_file(tmp_path):
    (tmp_path / "good.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "broken.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(fl.FeedlineError, match=r"broken\.jsonl"):
        fl.read_jsonl(tmp_path).to_arrow()


def test_read_jsonl_schema_drift_names_both_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "b.jsonl").write_text('{"a": 1, "b": 2}\n')
    with pytest.raises(fl.SchemaError) as info:
        fl.read_jsonl(tmp_path).to_arrow()
    assert "a.jsonl" in str(info.value) and "b.jsonl" in str(info.value)


# --------------------------------------------------------------------------- text


def test_read_text_per_line_crlf_and_no_trailing_newline(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"first\r\nsecond\r\n\r\nfourth")
    assert fl.read_text(path).to_arrow()["text"].to_pylist() == ["first", "second", "", "fourth"]
    path.write_bytes(b"one\ntwo\n")
    assert fl.read_text(path).to_arrow()["text"].to_pylist() == ["one", "two"]
    path.write_bytes(b"")
    assert fl.read_text(path).to_arrow().num_rows == 0


def test_read_text_lines_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "_CHUNK_BYTES", 3)
    lines = ["alpha", "", "b", "gamma delta", "é€", "last"]
    (tmp_path / "a.txt").write_bytes("\r\n".join(lines).encode())
    assert fl.read_text(tmp_path / "a.txt").to_arrow()["text"].to_pylist() == lines


def test_read_text_per_file_and_include_paths(tmp_path):
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    (tmp_path / "b.txt").write_text("solo")
    table = fl.read_text(tmp_path, per="file", include_paths=True).to_arrow()
    assert table.column_names == ["text", "path"]
    assert table["text"].to_pylist() == ["hello\nworld\n", "solo"]
    assert [p.rsplit("/", 1)[-1] for p in table["path"].to_pylist()] == ["a.txt", "b.txt"]

    lines = fl.read_text(tmp_path, include_paths=True).to_arrow()
    assert lines["text"].to_pylist() == ["hello", "world", "solo"]
    assert [p.rsplit("/", 1)[-1] for p in lines["path"].to_pylist()] == ["a.txt", "a.txt", "b.txt"]
    assert fl.read_text(tmp_path).schema().names == ["text"]


@pytest.mark.parametrize("per", ["line", "file"])
def test_read_text_invalid_utf8_names_the_file(tmp_path, per):
    (tmp_path / "ok.txt").write_text("fine\n")
    (tmp_path / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(fl.DataError) as info:
        fl.read_text(tmp_path, per=per).to_arrow()
    assert "latin.txt" in str(info.value)
    assert "Fix:" in str(info.value)
    assert fl.read_text(tmp_path / "latin.txt", encoding="latin-1").take(1) == [{"text": "café"}]


def test_read_text_rejects_unknown_per(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(fl.ConfigurationError):
        fl.read_text(tmp_path / "a.txt", per="word")


# --------------------------------------------------------------------------- images


@pytest.fixture
def image_tree(tmp_path):
    """``images/{cat,dog}/<label>_<i>.png``: real PNGs of distinct sizes, plus a stray file."""
    root = tmp_path / "images"
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (4 + i, 3), (10 * i, 20, 30)).save(root / label / f"{label}_{i}.png")
    (root / "cat" / "README.md").write_text("not an image")
    return root


def test_read_images_label_from_parent_folder(image_tree):
    ds = fl.read_images(image_tree)
    assert ds.schema().names == ["path", "label", "bytes"]
    assert ds.count() == 6
    table = ds.to_arrow()
    assert table["label"].to_pylist() == ["cat"] * 3 + ["dog"] * 3
    names = [p.rsplit("/", 1)[-1] for p in table["path"].to_pylist()]
    assert names == [f"{label}_{i}.png" for label in ("cat", "dog") for i in range(3)]
    for path, blob in zip(table["path"].to_pylist(), table["bytes"].to_pylist(), strict=True):
        with open(path, "rb") as handle:
            assert blob == handle.read()
        image = Image.open(io.BytesIO(blob))
        assert image.format == "PNG"
        assert image.size == (4 + int(path[-5]), 3)


def test_read_images_label_regex_and_none(image_tree):
    by_regex = fl.read_images(image_tree, label=r"_(\d+)\.png$").to_arrow()
    assert by_regex["label"].to_pylist() == ["0", "1", "2"] * 2
    whole_match = fl.read_images(image_tree, label=r"dog|cat").to_arrow()
    assert whole_match["label"].to_pylist() == ["cat"] * 3 + ["dog"] * 3

    unlabeled = fl.read_images(image_tree, label=None)
    assert unlabeled.schema().names == ["path", "bytes"]
    assert unlabeled.to_arrow().column_names == ["path", "bytes"]


def test_read_images_label_errors(image_tree):
    with pytest.raises(fl.ConfigurationError, match="regular expression"):
        fl.read_images(image_tree, label="(unclosed")
    with pytest.raises(fl.DataError, match="does not match"):
        fl.read_images(image_tree, label=r"zebra_(\d)").to_arrow()


def test_read_images_select_skips_bytes(image_tree):
    table = fl.read_images(image_tree).select(["label", "path"]).to_arrow()
    assert table.column_names == ["label", "path"]
    assert table.num_rows == 6


# --------------------------------------------------------------------------- in memory


def test_from_arrow_table_and_record_batch():
    table = pa.table({"a": [1, 2, 3], "b": ["x", None, "z"]})
    assert fl.from_arrow(table).to_arrow().equals(table)
    batch = table.to_batches()[0]
    assert fl.from_arrow(batch).to_arrow().to_pydict() == table.to_pydict()
    assert fl.from_arrow(table).count() == 3
    with pytest.raises(fl.ConfigurationError):
        fl.from_arrow({"a": [1]})


def test_from_pandas_drops_default_index_keeps_named_one():
    df = pd.DataFrame({"a": [1, 2], "s": ["x", "y"]}, index=[10, 11])
    table = fl.from_pandas(df).to_arrow()
    assert table.column_names == ["a", "s"]
    assert table.to_pydict() == {"a": [1, 2], "s": ["x", "y"]}
    named = fl.from_pandas(df.rename_axis("key")).to_arrow()
    assert named["key"].to_pylist() == [10, 11]
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.from_pandas([1, 2])


def test_from_polars_dataframe_and_lazyframe():
    df = pl.DataFrame({"a": [1, 2, 3], "s": ["x", "y", None]})
    assert fl.from_polars(df).to_arrow().to_pydict() == {"a": [1, 2, 3], "s": ["x", "y", None]}
    lazy = df.lazy().filter(pl.col("a") > 1)
    assert fl.from_polars(lazy).to_arrow()["a"].to_pylist() == [2, 3]
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.from_polars(pd.DataFrame({"a": [1]}))


def test_range():
    assert fl.range(5).to_arrow()["id"].to_pylist() == [0, 1, 2, 3, 4]
    assert fl.range(5).schema().field("id").type == pa.int64()
    many = fl.range(1000, rows_per_task=7)
    assert many.to_arrow()["id"].to_pylist() == list(range(1000))
    assert fl.range(0).count() == 0
    assert fl.range(0).to_arrow().num_rows == 0
    with pytest.raises(fl.ConfigurationError):
        fl.range(-1)


# --------------------------------------------------------------------------- pushdown per source


def _sources(tmp_path):
    table = pa.table({"x": [1, 2, 3, 4], "y": ["a", "b", "c", "d"]})
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text("x,y\n1,a\n2,b\n3,c\n4,d\n")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    return {
        "parquet": fl.read_parquet(tmp_path / "t.parquet"),
        "csv": fl.read_csv(tmp_path / "t.csv"),
        "jsonl": fl.read_jsonl(tmp_path / "t.jsonl"),
        "arrow": fl.from_arrow(table),
        "pandas": fl.from_pandas(table.to_pandas()),
    }


@pytest.mark.parametrize("kind", ["parquet", "csv", "jsonl", "arrow", "pandas"])
def test_filter_on_a_column_that_is_then_dropped(tmp_path, kind):
    ds = _sources(tmp_path)[kind]
    # both operators are pushed into the reader: the predicate reads a column not selected
    filtered = ds.filter(pc.field("x") > 2).select(["y"])
    assert "predicate: (x > 2)" in filtered.explain()
    assert filtered.to_arrow().to_pydict() == {"y": ["c", "d"]}
    reordered = ds.select(["y", "x"]).filter(pc.field("y") == "b").to_arrow()
    assert reordered.to_pydict() == {"y": ["b"], "x": [2]}


def test_numpy_column_from_arrow_keeps_values():
    values = np.linspace(0, 1, 11)
    table = fl.from_arrow(pa.table({"v": values})).to_arrow()
    np.testing.assert_array_equal(table["v"].to_numpy(), values)
