"""Bad input that used to escape as raw exceptions, or to be read wrong without a word.

CSV nulls, unterminated quotes, odd file names, damaged gzip, bad delimiters and
column_types; a full disk during a write; unknown codecs; ragged map_batches results;
2-D filter masks; non-dict records; tampered preprocessor states.
"""

from __future__ import annotations

import copy
import gzip
import json
import subprocess

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.io.csv.reader import CsvSource
from feedline.preprocess import from_state

# --------------------------------------------------------------------------- CSV: nulls


def test_empty_strings_stay_strings_unless_asked(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('n,s\n1,\n,x\n3,""\n4,NA\n')
    default = fl.read_csv(path).to_arrow()
    assert default["n"].to_pylist() == [1, None, 3, 4]  # numbers: "" is null by default
    assert default["s"].to_pylist() == ["", "x", "", "NA"]  # strings: kept as written

    nullable = fl.read_csv(path, strings_can_be_null=True).to_arrow()
    assert nullable["s"].to_pylist() == [None, "x", None, None]

    custom = fl.read_csv(path, null_values=["NA"], strings_can_be_null=True).to_arrow()
    assert custom["s"].to_pylist() == ["", "x", "", None]  # only "NA" is null now


def test_null_values_apply_to_every_range_of_a_large_file(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("id,s\n" + "".join(f"{i},{'' if i % 3 else 'v'}\n" for i in range(300)))
    ds = fl.Dataset.from_source(CsvSource(path, split_bytes=100, strings_can_be_null=True))
    values = ds.to_arrow()["s"].to_pylist()
    assert values == [None if i % 3 else "v" for i in range(300)]


# --------------------------------------------------------------------------- CSV: quotes

QUOTED = 'a,s\n1,x\n2,"unterminated\n3,y\n4,z\n'


def test_unterminated_quote_raises_naming_file_and_line(tmp_path):
    path = tmp_path / "quote.csv"
    path.write_text(QUOTED)
    with pytest.raises(fl.DataError) as info:
        fl.read_csv(path).to_arrow()
    message = str(info.value)
    assert "quote.csv" in message and "line 3" in message and "unterminated quote" in message
    assert "Fix:" in message


def test_unterminated_quote_skipped_and_counted_the_rest_is_read(tmp_path):
    path = tmp_path / "quote.csv"
    path.write_text(QUOTED)
    ds = fl.read_csv(path, on_error="skip")
    assert ds.to_arrow().to_pydict() == {"a": [1, 3, 4], "s": ["x", "y", "z"]}
    report = ds.analyze()
    assert report.records_skipped == 1
    assert report.skipped[0]["where"].endswith("quote.csv:3")
    assert "unterminated quote" in report.skipped[0]["reason"]


def test_unterminated_quote_in_a_middle_column_and_with_later_quotes(tmp_path):
    path = tmp_path / "mid.csv"
    path.write_text('a,s,b\n1,x,1\n2,"oops,2\n3,"y",3\n4,z,4\n5,"w, v",5\n')
    with pytest.raises(fl.DataError, match="line 3"):
        fl.read_csv(path).to_arrow()
    table = fl.read_csv(path, on_error="skip").to_arrow()
    assert table.to_pydict() == {"a": [1, 3, 4, 5], "s": ["x", "y", "z", "w, v"], "b": [1, 3, 4, 5]}


def test_unterminated_quote_in_an_early_block_and_in_byte_ranges(tmp_path):
    rows = [f"{i},v{i}" for i in range(200)]
    rows[50] = '50,"open'
    path = tmp_path / "blocks.csv"
    path.write_text("a,s\n" + "\n".join(rows) + "\n")
    expected = [i for i in range(200) if i != 50]
    # many small blocks: pyarrow's parser loses step with its chunker (not the last block)
    for source in (
        CsvSource(path, block_size=256, on_error="skip"),
        CsvSource(path, split_bytes=600, block_size=256, on_error="skip"),
    ):
        ds = fl.Dataset.from_source(source)
        assert ds.to_arrow()["a"].to_pylist() == expected
        assert ds.analyze().records_skipped == 1
    for source in (
        CsvSource(path, block_size=256),
        CsvSource(path, split_bytes=600, block_size=256),
    ):
        with pytest.raises(fl.DataError, match=r"blocks\.csv.*unterminated quote"):
            fl.Dataset.from_source(source).to_arrow()


def test_unterminated_quote_does_not_poison_type_inference(tmp_path):
    path = tmp_path / "types.csv"
    path.write_text('n,s\n"1,a\n2,b\n3,c\n')  # the first data row opens a quote
    ds = fl.read_csv(path, on_error="skip")
    assert ds.schema().field("n").type == pa.int64()
    assert ds.to_arrow().to_pydict() == {"n": [2, 3], "s": ["b", "c"]}


def test_unterminated_quote_in_a_gzipped_file(tmp_path):
    path = tmp_path / "quote.csv.gz"
    path.write_bytes(gzip.compress(QUOTED.encode()))
    assert fl.read_csv(path, on_error="skip").to_arrow()["a"].to_pylist() == [1, 3, 4]
    with pytest.raises(fl.DataError, match=r"quote\.csv\.gz.*line 3"):
        fl.read_csv(path).to_arrow()


def test_well_formed_quotes_are_untouched(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text('a,s\n1,"x, y"\n2,"say ""hi"""\n3,5"\n')
    assert fl.read_csv(path).to_arrow()["s"].to_pylist() == ["x, y", 'say "hi"', '5"']


def test_values_spanning_lines_need_newlines_in_values(tmp_path):
    path = tmp_path / "multi.csv"
    path.write_text('a,s\n1,"two\nlines"\n2,x\n')
    with pytest.raises(fl.DataError, match="newlines_in_values=True"):
        fl.read_csv(path).to_arrow()
    table = fl.read_csv(path, newlines_in_values=True).to_arrow()
    assert table.to_pydict() == {"a": [1, 2], "s": ["two\nlines", "x"]}


def test_quote_running_to_the_end_with_newlines_in_values(tmp_path):
    path = tmp_path / "eof.csv"
    path.write_text('a,s\n1,"two\nlines"\n2,"never closed\n3,y\n')
    with pytest.raises(fl.DataError, match=r"eof\.csv.*ends inside a quoted field.*row 2"):
        fl.read_csv(path, newlines_in_values=True).to_arrow()
    ds = fl.read_csv(path, newlines_in_values=True, on_error="skip")
    assert ds.to_arrow().to_pydict() == {"a": [1], "s": ["two\nlines"]}
    assert ds.analyze().records_skipped == 1


# --------------------------------------------------------------------------- CSV: files, options


def test_file_names_with_brackets_and_spaces_are_files_not_patterns(tmp_path):
    odd = tmp_path / "scan [1] of 2.csv"
    odd.write_text("a\n1\n2\n")
    (tmp_path / "plain.csv").write_text("a\n3\n")
    assert fl.read_csv(odd).to_arrow()["a"].to_pylist() == [1, 2]
    assert fl.read_csv(str(odd)).count() == 2
    # a pattern is still a pattern when no file has that name
    assert fl.read_csv(str(tmp_path / "p*.csv")).to_arrow()["a"].to_pylist() == [3]


@pytest.mark.parametrize(
    "damage",
    [lambda raw: raw[: len(raw) // 2], lambda raw: b"not gzip at all\n" + raw[20:]],
    ids=["truncated", "not-gzip"],
)
def test_damaged_gzip_names_the_file(tmp_path, damage):
    raw = gzip.compress(b"a,b\n" + b"1,2\n" * 5000)
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(damage(raw))
    with pytest.raises(fl.DataError) as info:
        fl.read_csv(path).to_arrow()
    assert "bad.csv.gz" in str(info.value) and "gzip" in str(info.value)
    assert "Fix:" in str(info.value)


def test_damaged_gzip_second_file_names_it(tmp_path):
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"a\n1\n"))
    raw = gzip.compress(b"a\n" + b"2\n" * 5000)
    (tmp_path / "b.csv.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(fl.DataError, match=r"b\.csv\.gz"):
        fl.read_csv(tmp_path).to_arrow()


@pytest.mark.parametrize("delimiter", ["::", "", "é", "\n", '"'])
def test_bad_delimiter_is_a_configuration_error(tmp_path, delimiter):
    (tmp_path / "a.csv").write_text("a::b\n1::2\n")
    with pytest.raises(fl.ConfigurationError, match="delimiter") as info:
        fl.read_csv(tmp_path / "a.csv", delimiter=delimiter)
    assert "Fix:" in str(info.value)


def test_column_types_naming_a_missing_column(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(fl.SchemaError) as info:
        fl.read_csv(path, column_types={"a": pa.int8(), "nope": pa.int32()}).to_arrow()
    message = str(info.value)
    assert "'nope'" in message and "['a', 'b']" in message and "Fix:" in message
    schema = pa.schema({"a": pa.int64(), "b": pa.int64()})
    with pytest.raises(fl.SchemaError, match="nope"):
        fl.read_csv(path, schema=schema, column_types={"nope": pa.int32()})
    # with a schema, column_types override its types
    both = fl.read_csv(path, schema=schema, column_types={"b": pa.string()}).to_arrow()
    assert both.to_pydict() == {"a": [1], "b": ["2"]}


# --------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs with the given options on a fresh folder (needs root; skips if not)."""
    mounted = []

    def mount(options: str):
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _big_table(rows: int) -> pa.Table:
    return pa.table({"x": np.random.default_rng(0).standard_normal(rows)})


def test_disk_full_during_a_write_is_a_storage_error(small_disk):
    disk = small_disk("size=2m")
    target = disk / "ds"
    with pytest.raises(fl.StorageError) as info:
        fl.from_arrow(_big_table(1_000_000)).write(target, compression=None)
    message = str(info.value)
    assert str(target) in message and "Fix:" in message and "space" in message
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == 28
    assert info.value.url == str(target)
    assert sorted(p.name for p in target.iterdir()) == []  # the write cleaned up after itself


def test_disk_full_keeps_the_previous_version(small_disk):
    disk = small_disk("size=2m")
    target = disk / "ds"
    fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0]})).write(target)
    with pytest.raises(fl.StorageError):
        fl.from_arrow(_big_table(1_000_000)).write(target, compression=None)
    assert fl.open(target).to_arrow()["x"].to_pylist() == [1.0, 2.0, 3.0]
    assert fl.verify(target) is not None


def test_no_free_inode_at_any_step_is_a_storage_error(small_disk):
    # with n inodes the write fails at the n-th file it creates: lock, shard, manifest...
    steps = set()
    for inodes in range(2, 12):
        target = small_disk(f"size=2m,nr_inodes={inodes}") / "ds"
        try:
            fl.from_arrow(pa.table({"x": [1, 2, 3]})).write(target)
        except fl.StorageError as exc:
            assert str(target) in str(exc) and "Fix:" in str(exc)
            steps.add(str(exc.last_error.filename).rsplit("/", 1)[-1].split("-")[0][:14])
            continue
        assert fl.open(target).count() == 3
        break
    else:
        pytest.fail("the write never succeeded")
    assert {"part", "_feedline.json"} <= {s.split(".tmp")[0] for s in steps}, steps


# --------------------------------------------------------------------------- codecs, user functions


def test_unknown_codec_fails_before_anything_is_written(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(fl.ConfigurationError, match="lz77") as info:
        fl.from_arrow(pa.table({"x": [1]})).write(target, compression="lz77")
    assert "Fix:" in str(info.value) and "zstd" in str(info.value)
    assert not target.exists()
    info = fl.from_arrow(pa.table({"x": [1]})).write(target, compression="SNAPPY")
    assert info.rows == 1


def test_map_batches_returning_ragged_columns(tmp_path):
    def ragged(batch):
        return {"a": [1, 2, 3], "b": [1]}

    with pytest.raises(fl.UserFunctionError) as info:
        fl.from_arrow(pa.table({"x": [1, 2, 3]})).map_batches(ragged).to_arrow()
    message = str(info.value)
    assert "ragged" in message and "'a': 3" in message and "'b': 1" in message
    assert "Fix:" in message


def test_map_batches_returning_a_column_arrow_cannot_hold():
    with pytest.raises(fl.UserFunctionError, match="'b'"):
        fl.range(2).map_batches(lambda b: {"a": [1, 2], "b": [1, "x"]}).to_arrow()


def test_filter_function_returning_a_2d_mask():
    ds = fl.from_arrow(pa.table({"x": [1, 2, 3]})).filter(lambda b: np.ones((3, 2), bool))
    with pytest.raises(fl.UserFunctionError, match=r"shape \(3, 2\)") as info:
        ds.to_arrow()
    assert "Fix:" in str(info.value)


# --------------------------------------------------------------------------- preprocessor inputs


@pytest.fixture(scope="module")
def fitted():
    ds = fl.from_arrow(
        pa.table({"x": [1.0, 2.0, 4.0], "c": ["a", "b", "a"], "v": [1.0, None, 3.0]})
    )
    return {
        "scaler": fl.StandardScaler("x").fit(ds),
        "minmax": fl.MinMaxScaler("x").fit(ds),
        "indexer": fl.StringIndexer("c").fit(ds),
        "onehot": fl.OneHotEncoder("c").fit(ds),
        "imputer": fl.Imputer("v").fit(ds),
        "buckets": fl.QuantileDiscretizer("x", num_buckets=3).fit(ds),
        "concat": fl.Concat(["x", "v"]).fit(ds),
    }


@pytest.mark.parametrize("record", [[1.0], 1.0, "x", None])
def test_transform_record_needs_a_dict(fitted, record):
    with pytest.raises(fl.ConfigurationError, match="dict of column") as info:
        fitted["scaler"].transform_record(record)
    assert "Fix:" in str(info.value)


def test_transform_record_with_a_value_arrow_cannot_hold(fitted):
    with pytest.raises(fl.DataError, match="transform_record"):
        fitted["scaler"].transform_record({"x": [1, "a"]})


def _tamper(state, path, value):
    state = copy.deepcopy(state)
    node = state
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return state


@pytest.mark.parametrize(
    ("name", "path", "value", "field"),
    [
        ("scaler", ["fitted", "mean", "x"], "abc", "fitted.mean.x"),
        ("scaler", ["fitted", "scale"], KeyError, "fitted.scale"),
        ("scaler", ["fitted", "scale", "x"], 0.0, "fitted.scale.x"),
        ("scaler", ["fitted", "count"], {"y": 3}, "fitted.count"),
        ("minmax", ["fitted", "min"], [0.0], "fitted.min"),
        ("indexer", ["fitted", "labels", "c"], ["a", "a"], "duplicate labels ['a']"),
        ("indexer", ["fitted", "labels", "c"], "ab", "fitted.labels.c"),
        ("onehot", ["fitted", "categories", "c"], [], "fitted.categories.c"),
        ("onehot", ["fitted", "drop", "c"], 5, "fitted.drop.c"),
        ("imputer", ["fitted", "fill", "v"], None, "fitted.fill.v"),
        ("imputer", ["fitted", "missing_fraction", "v"], 2.0, "fitted.missing_fraction.v"),
        ("buckets", ["fitted", "splits", "x"], [3.0, 1.0], "fitted.splits.x"),
        ("concat", ["fitted", "layout", 1, "offset"], 7, "fitted.layout[1].offset"),
        ("concat", ["fitted", "layout"], [], "fitted.layout"),
        ("scaler", ["fitted"], [1, 2], "fitted"),
        ("scaler", ["params"], ["x"], "params"),
        ("scaler", ["params", "colums"], ["x"], "colums"),
    ],
)
def test_tampered_state_is_a_format_error_naming_the_field(fitted, name, path, value, field):
    state = _tamper(fitted[name].state, path, value)
    with pytest.raises(fl.FormatError) as info:
        from_state(state)
    assert field in str(info.value) and "Fix:" in str(info.value)


def test_nan_statistics_in_a_saved_state_are_refused(fitted):
    text = json.dumps(fitted["scaler"].state).replace('"mean": {"x": ', '"mean": {"x": NaN, "y": ')
    with pytest.raises(fl.FormatError, match=r"NaN or infinity at state\.fitted\.mean\.x"):
        from_state(json.loads(text))
    with pytest.raises(fl.FormatError, match="type="):
        from_state({"type": ["StandardScaler"], "params": {}})


def test_state_is_a_copy_and_a_nan_one_cannot_be_saved(fitted):
    scaler = fitted["scaler"]
    state = scaler.state
    state["fitted"]["mean"]["x"] = 99.0
    assert scaler.fitted["mean"]["x"] != 99.0
    broken = copy.copy(scaler)
    broken.fitted = copy.deepcopy(scaler.fitted)
    broken.fitted["var"]["x"] = float("nan")
    with pytest.raises(fl.FormatError, match=r"state\.fitted\.var\.x"):
        broken.state  # noqa: B018 - the property raises


def test_a_sound_state_still_round_trips(fitted):
    for preprocessor in fitted.values():
        again = from_state(json.loads(json.dumps(preprocessor.state)))
        assert again.state == preprocessor.state


# --------------------------------------------------------------------------- CSV: type inference


def test_types_inferred_from_samples_across_the_file(tmp_path):
    # 4 MB: the first 1.3 MB hold integers and an empty column; later rows decimals and text
    rows = [f"{i},,{i % 7}" if i < 150_000 else f"{i}.5,late,{i % 7}" for i in range(300_000)]
    path = tmp_path / "late.csv"
    path.write_text("n,note,k\n" + "\n".join(rows) + "\n")
    assert path.stat().st_size > 2 << 20
    ds = fl.Dataset.from_source(CsvSource(path, block_size=1 << 20))
    schema = ds.schema()
    assert schema.field("n").type == pa.float64()
    assert schema.field("note").type == pa.string()
    assert schema.field("k").type == pa.int64()
    table = ds.to_arrow()
    assert table.num_rows == 300_000
    assert table["n"][299_999].as_py() == 299_999.5
    assert table["note"][0].as_py() == "" and table["note"][299_999].as_py() == "late"


def test_a_line_longer_than_a_parse_block_is_still_read(tmp_path):
    long_value = "x" * (3 << 20)  # longer than the 2 MB parse block
    rows = [f"{i},v{i}" for i in range(2000)]
    rows[1500] = f"1500,{long_value}"
    path = tmp_path / "long.csv"
    path.write_text("a,s\n" + "\n".join(rows) + "\n")
    for source in (CsvSource(path), CsvSource(path, split_bytes=1 << 20)):
        table = fl.Dataset.from_source(source).to_arrow()
        assert table["a"].to_pylist() == list(range(2000))
        assert len(table["s"][1500].as_py()) == 3 << 20 and table["s"][1999].as_py() == "v1999"
