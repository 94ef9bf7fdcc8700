"""Real data in, the same data out: every Arrow type × every source → write → every reader.

Each source builds one table holding every type it can carry (a null in every column),
writes it with ``Dataset.write`` and opens it again; each (source, type, reader) is one test:

- ``to_arrow``: ``fl.open(p).to_arrow()`` gives the source's own Arrow data back, types and
  values, including the types Parquet stores as others (``timestamp[s]``, ``date64``,
  ``time32[s]``, dictionaries of non-strings: see :mod:`feedline.arrow.parquet_types`);
- ``to_pandas``: ``fl.open(p).to_pandas()`` equals pyarrow's own conversion of that data;
- ``pandas.read_parquet`` / ``polars.read_parquet`` of the folder equal what they give for
  the same table written by ``pq.write_table`` (or fail the same way where they cannot read
  a type): the shards are plain Parquet, with true pandas metadata; numeric tensor columns
  are the documented exception (stored as fixed-size binary, :mod:`feedline.arrow.tensor_codec`:
  those readers get each row's bytes);
- ``loader``: numeric, boolean and fixed-shape columns come out of the numpy loader
  unchanged (from a null-free copy); every other type is refused with a
  :class:`FeedlineError` naming the column and ending in a fix, and nulls with a
  :class:`DataError` naming the column.

Sources carry what they can: ``fl.from_arrow`` and ``fl.read_parquet`` every type;
``fl.from_pandas`` the frame ``table.to_pandas()`` makes of each type and ``fl.from_polars``
the frame ``polars.from_arrow`` makes (their own Arrow conversion is the reference);
``fl.read_csv`` the flat scalar types it parses (with ``schema=``); ``fl.read_jsonl`` the
types JSON text carries (with ``schema=``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from polars.exceptions import PanicException

import feedline as fl
from feedline.arrow.tensor_codec import is_tensor_type
from feedline.errors import DataError, FeedlineError, SchemaError

D, T = dt.datetime, dt.time
PARIS = "Europe/Paris"


def _tensor(rows: list[Any]) -> pa.Array:
    kind = pa.fixed_shape_tensor(pa.float32(), (2, 2))
    flat = [None if r is None else list(np.asarray(r, np.float32).ravel()) for r in rows]
    return pa.ExtensionArray.from_storage(kind, pa.array(flat, pa.list_(pa.float32(), 4)))


#: name -> the column (row 1 is null in every column)
COLUMNS: dict[str, pa.Array] = {
    "int8": pa.array([-8, None, 7], pa.int8()),
    "int16": pa.array([-16, None, 300], pa.int16()),
    "int32": pa.array([-32, None, 70_000], pa.int32()),
    "int64": pa.array([-(2**40), None, 2**62], pa.int64()),
    "uint8": pa.array([0, None, 255], pa.uint8()),
    "uint16": pa.array([0, None, 65_535], pa.uint16()),
    "uint32": pa.array([0, None, 2**32 - 1], pa.uint32()),
    "uint64": pa.array([0, None, 2**63 + 5], pa.uint64()),
    "float16": pa.array(np.array([1.5, 0, -2.25], np.float16), mask=np.array([0, 1, 0], bool)),
    "float32": pa.array([1.25, None, -3.5], pa.float32()),
    "float64": pa.array([0.1, None, -1e300], pa.float64()),
    "bool": pa.array([True, None, False]),
    "string": pa.array(["héllo", None, ""], pa.string()),
    "large_string": pa.array(["a", None, "ü" * 3], pa.large_string()),
    "binary": pa.array([b"\x00\xff", None, b""], pa.binary()),
    "large_binary": pa.array([b"ab", None, b"\x01"], pa.large_binary()),
    "dictionary": pa.array(["cat", None, "cat"]).dictionary_encode(),
    "dictionary_int8_large_string": pa.array(["a", None, "b"], pa.large_string())
    .dictionary_encode()
    .cast(pa.dictionary(pa.int8(), pa.large_string())),
    "dictionary_of_ints": pa.array([10, None, 10], pa.int64()).dictionary_encode(),
    "timestamp_s": pa.array([D(2024, 1, 1, 10, 0, 5), None, D(1969, 12, 31)], pa.timestamp("s")),
    "timestamp_ms": pa.array(
        [D(2024, 1, 1, 0, 0, 0, 1000), None, D(2000, 2, 29)], pa.timestamp("ms")
    ),
    "timestamp_us": pa.array([D(2024, 1, 1, 0, 0, 0, 7), None, D(1900, 1, 1)], pa.timestamp("us")),
    "timestamp_ns": pa.array([1_700_000_000_123_456_789, None, 0], pa.timestamp("ns")),
    "timestamp_s_utc": pa.array(
        [D(2024, 6, 1, 12), None, D(2024, 12, 1)], pa.timestamp("s", "UTC")
    ),
    "timestamp_ms_tz": pa.array(
        [D(2024, 6, 1, 12), None, D(2024, 12, 1)], pa.timestamp("ms", PARIS)
    ),
    "timestamp_us_tz": pa.array(
        [D(2024, 3, 31, 1, 30), None, D(2024, 1, 1)], pa.timestamp("us", PARIS)
    ),
    "timestamp_ns_tz": pa.array([1_700_000_000_123_456_789, None, 0], pa.timestamp("ns", "UTC")),
    "date32": pa.array([dt.date(2024, 2, 29), None, dt.date(1970, 1, 1)], pa.date32()),
    "date64": pa.array([dt.date(2024, 2, 29), None, dt.date(1960, 5, 1)], pa.date64()),
    "time32_s": pa.array([T(10, 0, 5), None, T(23, 59, 59)], pa.time32("s")),
    "time32_ms": pa.array([T(10, 0, 5, 1000), None, T(0)], pa.time32("ms")),
    "time64_us": pa.array([T(10, 0, 5, 7), None, T(0)], pa.time64("us")),
    "time64_ns": pa.array([36_005_000_000_001, None, 0], pa.time64("ns")),
    "duration_s": pa.array([5, None, -3], pa.duration("s")),
    "duration_ms": pa.array([5, None, -3], pa.duration("ms")),
    "duration_us": pa.array([5, None, -3], pa.duration("us")),
    "duration_ns": pa.array([5, None, -3], pa.duration("ns")),
    "decimal128": pa.array(
        [decimal.Decimal("1.25"), None, decimal.Decimal("-99999999.99")], pa.decimal128(10, 2)
    ),
    "decimal256": pa.array(
        [decimal.Decimal("1" * 39 + ".5"), None, decimal.Decimal("0.0")], pa.decimal256(40, 1)
    ),
    "list": pa.array([[1, 2], None, []], pa.list_(pa.int32())),
    "list_with_null_items": pa.array([[1, None], None, [3]], pa.list_(pa.int64())),
    "large_list": pa.array([[1.5], None, [2.0, 3.0]], pa.large_list(pa.float32())),
    "fixed_size_list": pa.array(
        [[1.0, 2.0, 3.0], None, [4.0, 5.0, 6.0]], pa.list_(pa.float32(), 3)
    ),
    "list_of_timestamp_s": pa.array([[D(2024, 1, 1)], None, []], pa.list_(pa.timestamp("s"))),
    "struct": pa.array(
        [{"a": 1, "b": "x", "t": D(2024, 1, 1, 1)}, None, {"a": None, "b": None, "t": None}],
        pa.struct([("a", pa.int32()), ("b", pa.string()), ("t", pa.timestamp("s"))]),
    ),
    "map": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
    "fixed_shape_tensor": _tensor([[[1, 2], [3, 4]], None, [[5, 6], [7, 8]]]),
    "null": pa.nulls(3),
}
NAMES = list(COLUMNS)

#: the types a CSV file carries (parsed back with schema=)
CSV_TYPES = {
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
    "float64", "bool", "string", "large_string", "dictionary", "timestamp_s", "timestamp_ms",
    "timestamp_us", "timestamp_ns", "timestamp_s_utc", "timestamp_ns_tz", "date32", "date64",
    "time32_s", "time32_ms", "time64_us", "time64_ns", "decimal128", "null",
}  # fmt: skip
#: the types newline-delimited JSON carries (parsed back with schema=)
JSONL_TYPES = {
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
    "float64", "bool", "string", "large_string", "timestamp_s", "timestamp_s_utc", "list",
    "list_with_null_items", "struct", "null",
}  # fmt: skip
SOURCES = ["from_arrow", "from_pandas", "from_polars", "read_csv", "read_jsonl", "read_parquet"]
CARRIES = {
    "from_arrow": set(NAMES),
    # pandas holds times as datetime.time (µs) and maps as lists of pairs Arrow cannot infer
    "from_pandas": set(NAMES) - {"time64_ns", "map"},
    "from_polars": set(NAMES) - {"float16", "map", "null", "decimal256"},
    "read_csv": CSV_TYPES,
    "read_jsonl": JSONL_TYPES,
    "read_parquet": set(NAMES),
}
READERS = ["to_arrow", "to_pandas", "pandas.read_parquet", "polars.read_parquet", "loader"]


def _table(names: list[str], rows: list[int] | None = None) -> pa.Table:
    table = pa.table({n: COLUMNS[n] for n in names})
    return table if rows is None else table.take(rows)


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _source(kind: str, table: pa.Table, folder: Path) -> tuple[fl.Dataset, pa.Table]:
    """The dataset ``kind`` makes of ``table``, and the Arrow data it should give back."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "from_arrow":
        return fl.from_arrow(table), table
    if kind == "from_pandas":
        frame = table.to_pandas()
        return fl.from_pandas(frame), pa.Table.from_pandas(frame, preserve_index=False)
    if kind == "from_polars":
        frame = pl.from_arrow(table)
        return fl.from_polars(frame), frame.to_arrow()
    if kind == "read_parquet":
        pq.write_table(table, folder / "input.parquet")
        return fl.read_parquet(folder / "input.parquet"), pq.read_table(folder / "input.parquet")
    if kind == "read_csv":  # the reference: pyarrow's reading of the file (null strings are "")
        path = folder / "input.csv"
        pacsv.write_csv(table, path)
        types = pacsv.ConvertOptions(column_types=table.schema)
        return fl.read_csv(path, schema=table.schema), pacsv.read_csv(path, convert_options=types)
    if kind == "read_jsonl":
        path = folder / "input.jsonl"
        lines = [json.dumps(_json_value(row)) for row in table.to_pylist()]
        path.write_text("\n".join(lines) + "\n")
        parse = pajson.ParseOptions(explicit_schema=table.schema)
        return fl.read_jsonl(path, schema=table.schema), pajson.read_json(path, parse_options=parse)
    raise AssertionError(kind)


def _outcome(read: Any) -> Any:
    try:
        return read()
    except (Exception, PanicException) as exc:  # noqa: BLE001 - recorded, checked by the test
        return exc


def _run(kind: str, root: Path) -> dict[str, Any]:
    """Write what source ``kind`` makes of the table (and of its null-free rows)."""
    names = [n for n in NAMES if n in CARRIES[kind]]
    ds, expected = _source(kind, _table(names), root / "in")
    dense_ds, dense = _source(kind, _table(names, [0, 2]), root / "in_dense")
    out, dense_out = root / "out", root / "dense"
    ds.write(out, rows_per_shard=2)
    dense_ds.write(dense_out)
    pq.write_table(expected, root / "reference.parquet")
    return {
        "reference": root / "reference.parquet",
        "expected": expected,
        "dense": dense,
        "path": out,
        "dense_path": dense_out,
        "to_arrow": _outcome(lambda: fl.open(out).to_arrow()),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per source: what it should give back and what every reader got (or the exception)."""
    return {
        kind: _outcome(lambda: _run(kind, tmp_path_factory.mktemp(kind)))  # noqa: B023
        for kind in SOURCES
    }


def _reraise(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value


CELLS = [(s, n, r) for s in SOURCES for n in NAMES if n in CARRIES[s] for r in READERS]


@pytest.mark.parametrize(("source", "name", "reader"), CELLS)
def test_roundtrip(written: dict[str, dict[str, Any]], source: str, name: str, reader: str):
    result = _reraise(written[source])
    expected: pa.Table = result["expected"]
    if reader == "to_arrow":
        got = _reraise(result["to_arrow"])
        assert got.schema.field(name).type == expected.schema.field(name).type
        assert got.column(name).to_pylist() == expected.column(name).to_pylist()
        assert got.column(name).equals(expected.column(name))
    elif reader == "to_pandas":
        _same_outcome(
            lambda: fl.open(result["path"]).select([name]).to_pandas()[name],
            lambda: expected.select([name]).to_pandas()[name],
            pd.testing.assert_series_equal,
        )
    elif reader != "loader" and is_tensor_type(expected.schema.field(name).type):
        _check_tensor_bytes(result, name, reader)
    elif reader == "pandas.read_parquet":
        _same_outcome(
            lambda: pd.read_parquet(result["path"], columns=[name])[name],
            lambda: pd.read_parquet(result["reference"], columns=[name])[name],
            pd.testing.assert_series_equal,
        )
    elif reader == "polars.read_parquet":
        _same_outcome(
            lambda: pl.read_parquet(str(result["path"] / "*.parquet"), columns=[name])[name],
            lambda: pl.read_parquet(result["reference"], columns=[name])[name],
            _assert_polars_equal,
        )
    else:
        _check_loader(result, name)


def _check_tensor_bytes(result: dict[str, Any], name: str, reader: str) -> None:
    """Tensor columns are stored as fixed-size binary (a documented choice of feedline's
    writer, :mod:`feedline.arrow.tensor_codec`): other readers get each row's elements as
    little-endian bytes in C order."""
    column = result["expected"].column(name).combine_chunks()
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    dtype = np.dtype(storage.type.value_type.to_pandas_dtype()).newbyteorder("<")
    rows = storage.to_pylist()
    want = [None if row is None else np.asarray(row, dtype).tobytes() for row in rows]
    if reader == "pandas.read_parquet":
        got = pd.read_parquet(result["path"], columns=[name])[name].tolist()
    else:
        got = pl.read_parquet(str(result["path"] / "*.parquet"), columns=[name])[name].to_list()
    assert got == want


def _same_outcome(read: Any, reference: Any, check: Any) -> None:
    """``read()`` gives what ``reference()`` gives for the same data, or fails the same way.

    The reference is the library's own conversion of the same data without feedline in
    between (pyarrow → pandas; a file written by ``pq.write_table`` for pandas and Polars):
    where that library cannot convert a type, reading the dataset must fail the same way.
    """
    want = _outcome(reference)
    if isinstance(want, BaseException):
        with pytest.raises(type(want)):
            read()
        return
    check(read(), want)


def _assert_polars_equal(got: pl.Series, want: pl.Series) -> None:
    assert got.dtype == want.dtype
    assert got.to_list() == want.to_list()


def _check_loader(result: dict[str, Any], name: str) -> None:
    dense: pa.Table = result["dense"]
    kind = dense.schema.field(name).type
    with_nulls = result["expected"].column(name).null_count > 0
    if _tensor_like(kind) and (not _is_list(kind) or _one_shape(dense.column(name))):
        loader = fl.open(result["dense_path"]).loader(
            batch_size=2, shuffle=False, format="numpy", columns=[name], drop_last=False
        )
        (batch,) = list(loader)
        want = _numpy(dense.column(name))
        np.testing.assert_array_equal(batch[name], want)
        assert batch[name].dtype == want.dtype
        if with_nulls:
            loader = fl.open(result["path"]).loader(
                batch_size=3, shuffle=False, format="numpy", columns=[name], drop_last=False
            )
            with pytest.raises(DataError, match=f"{name}.*Fix:"):
                list(loader)
    else:
        with pytest.raises(FeedlineError, match=f"'{name}'.*Fix:"):
            loader = fl.open(result["dense_path"]).loader(
                batch_size=2, shuffle=False, format="numpy", columns=[name], drop_last=False
            )
            list(loader)


def _is_list(kind: pa.DataType) -> bool:
    types = pa.types
    return types.is_fixed_size_list(kind) or types.is_list(kind) or types.is_large_list(kind)


def _one_shape(column: pa.ChunkedArray) -> bool:
    """Every row of a (nested) list column has the same shape and no row is null."""
    rows = column.to_pylist()
    return None not in rows and len({str(np.shape(np.array(r, dtype=object))) for r in rows}) <= 1


def _tensor_like(kind: pa.DataType) -> bool:
    """Loadable as a tensor: tensors, numbers, and (nested) lists of numbers (one length a row)."""
    if isinstance(kind, pa.FixedShapeTensorType):
        return True
    while _is_list(kind):
        kind = kind.value_type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    array = column.combine_chunks()
    if isinstance(array, pa.ExtensionArray):
        return array.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(array.type):
        return array.flatten().to_numpy().reshape(len(array), array.type.list_size)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = array
        while not (
            pa.types.is_integer(values.type)
            or pa.types.is_floating(values.type)
            or pa.types.is_boolean(values.type)
        ):
            values = values.flatten()
        return np.array(array.to_pylist(), dtype=values.to_numpy(zero_copy_only=False).dtype)
    return array.to_numpy(zero_copy_only=False)


# --- the reported cases, one by one -------------------------------------------------------


def test_convert_csv_with_a_datetime_column_reads_back(tmp_path: Path) -> None:
    """`feedline convert` of a CSV with a datetime column: every read gives timestamp[s]."""
    from feedline.cli.main import main

    (tmp_path / "data.csv").write_text(
        "id,signup,other\n1,2024-01-01 10:00:00,1.5\n2,2024-02-01 11:30:05,2.5\n"
    )
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "data.csv"), str(out), "--quiet"]) == 0
    assert main(["verify", str(out)]) == 0
    ds = fl.open(out)
    table = ds.to_arrow()
    assert table.schema.field("signup").type == pa.timestamp("s")
    assert table["signup"].to_pylist() == [D(2024, 1, 1, 10), D(2024, 2, 1, 11, 30, 5)]
    assert ds.take(1)[0]["signup"] == D(2024, 1, 1, 10)
    assert ds.select(["other"]).to_arrow()["other"].to_pylist() == [1.5, 2.5]
    assert fl.stats(ds).rows == 2
    assert ds.filter(pc.field("signup") > D(2024, 1, 15)).count() == 1


STORED_AS_OTHERS = [
    pa.array([D(2024, 1, 1, 10, 0, 5), None, D(1969, 7, 20)], pa.timestamp("s")),
    pa.array([D(2024, 1, 1, 10, 0, 5), None, D(1969, 7, 20)], pa.timestamp("s", "Asia/Tokyo")),
    pa.array([dt.date(2024, 1, 1), None, dt.date(1900, 3, 1)], pa.date64()),
    pa.array([T(10, 0, 5), None, T(0, 0, 1)], pa.time32("s")),
    pa.array([[D(2024, 1, 1, 0, 0, 1)], None, []], pa.list_(pa.timestamp("s"))),
    pa.array(
        [{"t": D(2024, 1, 1, 0, 0, 1)}, None, {"t": None}], pa.struct([("t", pa.timestamp("s"))])
    ),
    pa.array([5, None, 5]).dictionary_encode().cast(pa.dictionary(pa.int16(), pa.int64())),
    pa.array(["a", None, "a"])
    .dictionary_encode()
    .cast(pa.dictionary(pa.int8(), pa.large_string())),
]


@pytest.mark.parametrize("column", STORED_AS_OTHERS, ids=lambda c: str(c.type))
def test_types_parquet_stores_as_others_come_back_as_written(tmp_path: Path, column) -> None:
    """Before: SchemaError (schema drift between a shard and itself) on every read."""
    table = pa.table({"x": column, "other": [1, 2, 3]})
    fl.from_arrow(table).write(tmp_path / "ds", rows_per_shard=2)
    back = fl.open(tmp_path / "ds")
    assert back.schema() == table.schema
    got = back.to_arrow()
    assert got.schema == table.schema
    assert got["x"].to_pylist() == column.to_pylist()
    assert back.select(["other"]).to_arrow()["other"].to_pylist() == [1, 2, 3]


def test_schema_drift_names_the_shard_and_the_manifest(tmp_path: Path) -> None:
    from feedline.store.manifest import MANIFEST_NAME, Manifest

    out = tmp_path / "ds"
    fl.from_arrow(pa.table({"x": [1, 2]})).write(out)
    (shard,) = sorted(out.glob("part-*.parquet"))
    manifest = Manifest.from_json((out / MANIFEST_NAME).read_text(), "test")
    manifest.schema = pa.schema({"x": pa.string()})  # the shard holds int64: drift
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    with pytest.raises(SchemaError) as error:
        fl.open(out).to_arrow()
    message = str(error.value)
    assert message.count(shard.name) == 1 and "the manifest" in message and "Fix:" in message


def test_schema_drift_between_plain_files_names_both(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": ["1"]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaError) as error:
        fl.read_parquet(tmp_path).to_arrow()
    message = str(error.value)
    assert "b.parquet' has schema" in message and "the first file" in message
    assert message.count("a.parquet") == 1 and "Fix:" in message


def test_a_type_parquet_cannot_store_is_refused_before_writing(tmp_path: Path) -> None:
    table = pa.table({"ok": [1], "gap": pa.array([(1, 2, 3)], pa.month_day_nano_interval())})
    with pytest.raises(SchemaError, match=r"gap: month_day_nano_interval.*Fix:"):
        fl.from_arrow(table).write(tmp_path / "ds")
    assert not (tmp_path / "ds" / "_feedline.json").exists()


def test_from_pandas_names_a_column_arrow_cannot_convert() -> None:
    frame = pd.DataFrame({"ok": [1, 2], "pairs": [[("k", 1)], [("j", 2)]]})
    with pytest.raises(SchemaError, match=r"'pairs'.*Fix:"):
        fl.from_pandas(frame)


def _word_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def test_pandas_metadata_does_not_survive_indexer_and_tokenizer(tmp_path: Path) -> None:
    """from_pandas → StringIndexer/Tokenize → write: pandas and feedline read it back."""
    frame = pd.DataFrame({"cat": ["a", "b", "a"], "text": ["hello world", "world", ""],
                          "n": [1, 2, 3]})  # fmt: skip
    ds = fl.from_pandas(frame).transform(
        fl.Chain([fl.StringIndexer("cat"), fl.Tokenize("text", _word_tokenizer(), max_length=8)])
    )
    ds.write(tmp_path / "ds")
    want = ds.to_arrow()
    assert want.schema.field("text").type == pa.fixed_shape_tensor(pa.int32(), [8])
    tokens = want["text"].combine_chunks().to_numpy_ndarray().tolist()
    for got in (fl.open(tmp_path / "ds").to_pandas(), pd.read_parquet(tmp_path / "ds"),
                ds.to_pandas()):  # fmt: skip
        assert got["cat"].dtype == np.int64
        assert got["cat"].tolist() == want["cat"].to_pylist()
        assert got["n"].tolist() == [1, 2, 3]
        if got["text"].dtype == object and isinstance(got["text"][0], bytes):
            continue  # pandas.read_parquet: tensors are stored as bytes (io/tensor_codec.py)
        assert [list(v) for v in got["text"]] == tokens


TRANSFORMS = {  # each changes the columns or their types, or (filter) only the rows
    "map_batches": lambda ds: ds.map_batches(
        lambda b: b.set_column(0, "a", pa.array([len(s) for s in b["a"].to_pylist()]))
    ),
    "select": lambda ds: ds.select(["key", "b"]),
    "rename": lambda ds: ds.map_batches(_swap_a_and_b),
    "add_column": lambda ds: ds.map_batches(lambda b: b.append_column("c", pc.add(b["b"], 1))),
    "filter": lambda ds: ds.filter(pc.field("key") > 10),
    "transform": lambda ds: ds.transform(fl.StringIndexer("a")),
}


def _swap_a_and_b(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Rename a <-> b keeping the schema metadata (as a hand-written rename would)."""
    fields = [f.with_name({"a": "b", "b": "a"}.get(f.name, f.name)) for f in batch.schema]
    schema = pa.schema(fields, batch.schema.metadata)
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_pandas_metadata_follows_the_columns_through_transforms(tmp_path: Path, name) -> None:
    """An entry whose column changed type or name goes; the rest (and the index) stay."""
    frame = pd.DataFrame(
        {"a": ["x", "yy", "x"], "b": pd.array([1, None, 3], dtype="Int64")},
        index=pd.Index([10, 20, 30], name="key"),
    )
    ds = TRANSFORMS[name](fl.from_pandas(frame))
    table = ds.to_arrow()
    want = table.to_pandas()
    ds.write(tmp_path / "ds")
    for got in (ds.to_pandas(), fl.open(tmp_path / "ds").to_pandas(),
                pd.read_parquet(tmp_path / "ds")):  # fmt: skip
        pd.testing.assert_frame_equal(got, want)
    assert want.index.name == "key"  # the index column is still there: restored as the index
    for column in want.columns:
        plain = pa.table({column: table[column]}).to_pandas()[column].dtype  # no metadata
        if column == "b" and name != "rename":
            assert str(want[column].dtype) == "Int64"  # unchanged column: its dtype is kept
        else:
            assert want[column].dtype == plain  # a new, renamed or retyped column: as Arrow says


@pytest.mark.parametrize(
    ("column", "hint"),
    [
        (pa.array([D(2024, 1, 1)], pa.timestamp("s")), "pc.cast(col, pa.int64())"),
        (pa.array([dt.date(2024, 1, 1)], pa.date32()), "days since the epoch"),
        (pa.array([decimal.Decimal("1.5")], pa.decimal128(4, 1)), "pa.float64()"),
        (pa.array(["a"]).dictionary_encode(), "fl.StringIndexer"),
        (pa.array([["a", "b"]], pa.list_(pa.string())), "lists of numbers load as tensors"),
        (pa.array([{"a": 1}]), "pc.struct_field"),
        (pa.array([b"x"], pa.large_binary()), "strings='list'"),
        (pa.array(["x"], pa.string_view()), "strings='list'"),
    ],
    ids=lambda v: str(v.type) if isinstance(v, pa.Array) else "",
)
def test_loader_refusal_says_what_to_do_for_the_type(tmp_path: Path, column, hint) -> None:
    fl.from_arrow(pa.table({"col": column})).write(tmp_path / "ds")
    with pytest.raises(SchemaError, match=r"'col'") as error:
        list(fl.open(tmp_path / "ds").loader(batch_size=1, format="numpy", columns=["col"]))
    assert hint in str(error.value) and "Fix:" in str(error.value)
