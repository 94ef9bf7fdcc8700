"""fl.read_petastorm on a dataset written by Petastorm 0.13.1 itself (tests/fixtures/petastorm/,
made by make_fixtures.py there), and the safe reading of its pickled Unischema."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.io.petastorm.reader import PetastormSource
from feedline.io.petastorm.unischema import UNISCHEMA_KEY, parse_unischema

FIXTURES = Path(__file__).parents[1] / "fixtures" / "petastorm"
DATASET = FIXTURES / "dataset"
FIXED = ["matrix", "packed", "image_png", "gray_png"]
VARIABLE = ["seq", "points"]


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected.npz", allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _by_id(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def _nulls(expected, name: str) -> np.ndarray:
    return expected.get(f"{name}:null", np.zeros(len(expected["id"]), bool))


def _variable(expected, name: str) -> list[np.ndarray | None]:
    shapes, flat, nulls = expected[f"{name}:shape"], expected[name], _nulls(expected, name)
    out, start = [], 0
    for shape, null in zip(shapes, nulls, strict=True):
        size = int(np.prod(shape))
        out.append(None if null else flat[start : start + size].reshape(shape))
        start += 0 if null else size
    return out


def _check_fixed(table: pa.Table, expected, name: str) -> None:
    column = table[name].combine_chunks()
    assert isinstance(column.type, pa.FixedShapeTensorType), (name, column.type)
    nulls = _nulls(expected, name)
    assert column.is_null().to_numpy(zero_copy_only=False).tolist() == nulls.tolist()
    width = int(np.prod(column.type.shape))
    storage = column.storage
    flat = storage.values.slice(storage.offset * width, len(storage) * width)
    values = flat.to_numpy(zero_copy_only=False).reshape(expected[name].shape)
    assert values.dtype == expected[name].dtype, name
    np.testing.assert_array_equal(values[~nulls], expected[name][~nulls])


def _check_variable(table: pa.Table, expected, name: str) -> None:
    for got, want in zip(table[name].to_pylist(), _variable(expected, name), strict=True):
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(np.array(got, want.dtype).reshape(want.shape), want)


def test_reads_every_codec_with_the_values_petastorm_wrote(expected):
    ds = fl.read_petastorm(DATASET)
    table = _by_id(ds.to_arrow())
    assert table.num_rows == len(expected["id"]) == ds.count()
    for name in FIXED:
        _check_fixed(table, expected, name)
    for name in VARIABLE:
        _check_variable(table, expected, name)
    schema = ds.schema()
    assert schema.field("seq").type == pa.list_(pa.int64())
    assert schema.field("points").type == pa.list_(pa.list_(pa.float32()))
    assert schema.field("id").type == pa.int32() and schema.field("big").type == pa.int64()
    assert table["id"].to_pylist() == expected["id"].tolist()
    assert table["big"].to_pylist() == expected["big"].tolist()
    assert table["label"].to_pylist() == expected["label"].tolist()
    score = table["score"].to_pylist()
    nulls = _nulls(expected, "score")
    assert [s is None for s in score] == nulls.tolist()
    assert [s for s in score if s is not None] == expected["score"][~nulls].tolist()


def test_jpeg_pixels_match_petastorms_own_decoding(expected):
    table = _by_id(fl.read_petastorm(DATASET, columns=["id", "image_jpeg"]).to_arrow())
    pixels = table["image_jpeg"].combine_chunks().to_numpy_ndarray().astype(np.int16)
    # Pillow here and OpenCV in Petastorm: two libjpeg builds, allowed to differ by a level
    assert np.abs(pixels - expected["image_jpeg:petastorm"]).max() <= 2


def test_the_unischema_is_read_from_every_pickle_protocol():
    meta = pq.read_metadata(DATASET / "_common_metadata").metadata
    stored = parse_unischema(meta[UNISCHEMA_KEY])
    assert stored.name == "FixtureSchema"
    for protocol in range(6):
        again = parse_unischema((FIXTURES / f"unischema.protocol{protocol}.pickle").read_bytes())
        assert again == stored, protocol
    fields = {f.name: f for f in stored.fields}
    assert fields["points"].shape == (None, 3) and fields["points"].nullable
    assert fields["points"].dtype == np.float32 and fields["points"].codec == "NdarrayCodec"
    assert fields["image_jpeg"].codec_args == {"image_codec": "jpeg", "quality": 90}
    assert fields["id"].codec_args == {"spark_type": "IntegerType"}
    assert fields["label"].dtype.kind == "U"


class _RunsShell:
    """Unpickling this runs a shell command (what a hostile _common_metadata could hold)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _hostile_unischema(marker: Path) -> bytes:
    """The fixture's Unischema pickle (protocol 2: no frames) with an ``os.system`` call
    spliced in before its last BUILD: still a valid pickle that unpickles to the schema."""
    legit = (FIXTURES / "unischema.protocol2.pickle").read_bytes()
    evil = pickle.dumps(_RunsShell(f"touch {marker}"), protocol=2)
    assert legit.endswith(b"b.") and b"system" in evil
    return legit[:-2] + evil[2:-1] + b"0" + legit[-2:]  # call, POP the result, BUILD, STOP


def test_a_hostile_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    plain = pickle.dumps(_RunsShell(f"touch {marker}"))
    with pytest.raises(fl.FormatError, match=r"(posix|os)\.system") as info:
        parse_unischema(plain)
    assert "Fix:" in str(info.value)
    hidden = _hostile_unischema(marker)
    with pytest.raises(fl.FormatError, match="system"):
        parse_unischema(hidden)
    assert not marker.exists()
    pickle.loads(plain)  # the control: unpickling the payload does run the command
    assert marker.exists()


def test_a_refused_unischema_falls_back_to_the_bytes_with_a_warning(tmp_path, expected):
    marker = tmp_path / "ran"
    root = shutil.copytree(DATASET, tmp_path / "ds")
    schema = pq.read_schema(DATASET / "_common_metadata")
    meta = dict(schema.metadata) | {UNISCHEMA_KEY: _hostile_unischema(marker)}
    pq.write_metadata(schema.with_metadata(meta), root / "_common_metadata")
    with pytest.warns(RuntimeWarning, match="refused"):
        ds = fl.read_petastorm(root, columns=["id", *FIXED])
    table = _by_id(ds.to_arrow())
    for name in FIXED:
        _check_fixed(table, expected, name)
    assert not marker.exists()
    assert "refused" in ds.explain()


def test_without_metadata_codecs_are_detected_from_the_bytes(tmp_path, expected):
    root = shutil.copytree(DATASET, tmp_path / "ds")
    (root / "_common_metadata").unlink()
    source = PetastormSource(root)
    assert source.unischema is None
    assert {n: p.codec for n, p in source.plans.items() if p.codec} == {
        "matrix": "npy",
        "seq": "npy",
        "points": "npy",
        "packed": "npz",
        "image_png": "image",
        "image_jpeg": "image",
        "gray_png": "image",
    }
    table = _by_id(fl.read_petastorm(root, columns=["id", *FIXED]).to_arrow())
    for name in FIXED:
        _check_fixed(table, expected, name)
    # the first value's shape is required of all: variable shapes name the row and the fix
    with pytest.raises(fl.DataError, match=r"row group \d+, row \d+.*'seq'.*Fix:"):
        fl.read_petastorm(root, columns=["seq"]).to_arrow()


def _corrupt_copy(tmp_path: Path, row: int = 1) -> tuple[Path, Path]:
    """A copy of the dataset whose first file has a truncated ``matrix`` value at ``row``."""
    root = shutil.copytree(DATASET, tmp_path / "ds")
    first = sorted(root.glob("part-*.parquet"))[0]
    table = pq.read_table(first)
    values = table["matrix"].to_pylist()
    values[row] = values[row][:-5]
    table = table.set_column(
        table.schema.get_field_index("matrix"),
        table.schema.field("matrix"),
        pa.array(values, pa.binary()),
    )
    pq.write_table(table, first, row_group_size=2)
    return root, first


def test_a_corrupt_value_names_file_row_group_row_and_column(tmp_path):
    root, first = _corrupt_copy(tmp_path, row=3)
    with pytest.raises(fl.DataError) as info:
        fl.read_petastorm(root).to_arrow()
    message = str(info.value)
    for part in (
        first.name,
        "row group 1",
        "row 1",
        "row 3 of the file",
        "'matrix'",
        "NdarrayCodec",
        "Fix:",
    ):
        assert part in message, (part, message)


def test_on_error_skip_drops_the_row_and_counts_it(tmp_path, expected):
    root, first = _corrupt_copy(tmp_path, row=3)
    ds = fl.read_petastorm(root, on_error="skip")
    table = ds.to_arrow()
    assert table.num_rows == len(expected["id"]) - 1
    report = ds.analyze()
    assert report.records_skipped == 1
    assert first.name in report.skipped[0]["where"] and "matrix" in report.skipped[0]["reason"]
    info = ds.write(tmp_path / "out")
    assert info.report["records_skipped"] == 1


def test_fixed_shapes_load_as_tensors_and_variable_ones_are_refused(tmp_path, expected):
    out = tmp_path / "out"
    source = fl.read_petastorm(DATASET)
    source.write(out)
    ds = fl.open(out)
    assert ds.to_arrow().sort_by("id").equals(source.to_arrow().sort_by("id"))  # nulls too
    assert isinstance(ds.schema().field("image_png").type, pa.FixedShapeTensorType)
    columns = ["id", "matrix", "image_png", "image_jpeg"]
    loader = ds.loader(
        batch_size=8, shuffle=False, drop_last=False, format="numpy", columns=columns
    )
    batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    order = np.argsort(ids)
    assert ids[order].tolist() == expected["id"].tolist()
    for name in ("matrix", "image_png"):
        stacked = np.concatenate([b[name] for b in batches])[order]
        assert stacked.shape == expected[name].shape and stacked.dtype == expected[name].dtype
        np.testing.assert_array_equal(stacked, expected[name])
    with pytest.raises((fl.SchemaError, fl.DataError), match="seq"):
        list(ds.loader(batch_size=8, shuffle=False, format="numpy", columns=["seq"]))


def test_reads_from_an_fsspec_url(expected):
    fs = fsspec.filesystem("memory")
    base = "/petastorm-fixture"
    for path in DATASET.iterdir():
        fs.pipe(f"{base}/{path.name}", path.read_bytes())
    try:
        ds = fl.read_petastorm(f"memory://{base}", columns=["id", "matrix", "points"])
        table = _by_id(ds.to_arrow())
        _check_fixed(table, expected, "matrix")
        _check_variable(table, expected, "points")
        assert ds._plan.source.unischema is not None
    finally:
        fs.rm(base, recursive=True)


def test_a_predicate_filters_decoded_rows(expected):
    ds = fl.read_petastorm(DATASET).filter(pc.field("id") >= 30).select(["id", "matrix"])
    table = _by_id(ds.to_arrow())
    assert table["id"].to_pylist() == list(range(30, 36))
    np.testing.assert_array_equal(
        table["matrix"].combine_chunks().to_numpy_ndarray(), expected["matrix"][30:]
    )


def test_bad_arguments_and_missing_columns_raise_with_a_fix(tmp_path):
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.read_petastorm(DATASET, on_error="ignore")
    with pytest.raises(fl.SchemaError, match="nope"):
        fl.read_petastorm(DATASET, columns=["nope"]).to_arrow()
    root = shutil.copytree(DATASET, tmp_path / "ds")
    last = sorted(root.glob("part-*.parquet"))[-1]
    pq.write_table(pq.read_table(last).drop_columns(["score"]), last)
    with pytest.raises(fl.SchemaError, match=r"drift.*Fix:"):
        fl.read_petastorm(root).to_arrow()


def test_damaged_schema_pickles_raise_format_errors_only():
    """Random byte changes and truncations: parsed or refused, never another exception."""
    for protocol in range(6):
        legit = (FIXTURES / f"unischema.protocol{protocol}.pickle").read_bytes()
        rng = np.random.default_rng(protocol)
        refused = 0
        for _ in range(400):
            data = bytearray(legit)
            for _ in range(int(rng.integers(1, 4))):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
            if rng.random() < 0.2:
                data = data[: int(rng.integers(1, len(data)))]
            try:
                parse_unischema(bytes(data))
            except fl.FormatError as exc:
                refused += 1
                assert "Fix:" in str(exc)
        assert refused > 0
