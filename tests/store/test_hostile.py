"""Hostile input: opening a dataset never runs its code, never escapes its folder, and any
damaged or malicious manifest or Parquet file raises a FeedlineError (never another type,
never a crash or a hang). Fuzzed with hypothesis, deterministically (``derandomize``).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import copy
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.store.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=5_000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _table(n: int = 40) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "s": [f"row {i}" for i in range(n)],
            "v": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int32())),
        }
    )


@pytest.fixture
def dataset(tmp_path) -> Path:
    out = tmp_path / "ds"
    fl.from_arrow(_table()).write(out, rows_per_shard=20, row_group_rows=10)
    return out


def _doc(out: Path) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


def _put(out: Path, doc_or_text) -> None:
    text = doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text)
    (out / MANIFEST_NAME).write_text(text)


def _open_and_read(out: Path) -> None:
    """What a user does: open, count, read. Only FeedlineErrors may escape."""
    ds = fl.open(out)
    ds.count()
    ds.to_arrow()


# --------------------------------------------------------------------------- manifest fields


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(doc):
        target = doc
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


FIELD_MUTATIONS = {
    "shards-object": _set("shards", {"a": 1}),
    "shards-string": _set("shards", "part-00000.parquet"),
    "shard-not-object": _set("shards", 0, ["p", 1]),
    "rows-float": _set("shards", 0, "rows", 20.0),
    "rows-string": _set("shards", 0, "rows", "20"),
    "rows-bool": _set("shards", 0, "rows", True),
    "rows-negative": _set("shards", 0, "rows", -20),
    "rows-huge": _set("shards", 0, "rows", 2**80),
    "rows-null": _set("shards", 0, "rows", None),
    "bytes-negative": _set("shards", 0, "bytes", -1),
    "bytes-list": _set("shards", 0, "bytes", [1]),
    "groups-string": _set("shards", 0, "row_groups", "1010"),
    "groups-floats": _set("shards", 0, "row_groups", [10.0, 10.0]),
    "groups-negative": _set("shards", 0, "row_groups", [30, -10]),
    "groups-nested": _set("shards", 0, "row_groups", [[10], [10]]),
    "groups-too-many": _set("shards", 0, "row_groups", [0] * 100_000 + [10, 10]),
    "checksum-int": _set("shards", 0, "checksum", 5),
    "checksum-md5": _set("shards", 0, "checksum", "md5:abc"),
    "checksum-short": _set("shards", 0, "checksum", "sha256:abc"),
    "path-nul": _set("shards", 0, "path", "part\x00.parquet"),
    "path-backslash": _set("shards", 0, "path", "..\\..\\etc\\passwd"),
    "path-dot": _set("shards", 0, "path", "./part.parquet"),
    "path-double-slash": _set("shards", 0, "path", "a//part.parquet"),
    "path-trailing-slash": _set("shards", 0, "path", "folder/"),
    "path-long": _set("shards", 0, "path", "x" * 5_000),
    "path-int": _set("shards", 0, "path", 7),
    "path-url": _set("shards", 0, "path", "file:///etc/passwd"),
    "path-newline": _set("shards", 0, "path", "a\nb.parquet"),
    "lineage-list": _set("lineage", [["source", "x"]]),
    "preprocessors-object": _set("preprocessors", {"type": "StandardScaler"}),
    "preprocessors-of-ints": _set("preprocessors", [1, 2]),
    "statistics-string": _set("statistics", "many"),
    "write-int": _set("write", 5),
    "created-object": _set("created", {"when": "now"}),
    "total-rows-string": _set("rows", "40"),
    "total-rows-float": _set("rows", 40.0),
    "schema-list": _set("schema", []),
    "schema-ipc-int": _set("schema", "arrow_ipc", 5),
    "schema-ipc-not-base64": _set("schema", "arrow_ipc", "%%%"),
    "schema-ipc-garbage": _set("schema", "arrow_ipc", base64.b64encode(b"\xff" * 64).decode()),
    "schema-ipc-truncated": lambda doc: doc["schema"].update(
        arrow_ipc=base64.b64encode(base64.b64decode(doc["schema"]["arrow_ipc"])[:40]).decode()
    ),
    "duplicate-shard": lambda doc: doc["shards"].append(copy.deepcopy(doc["shards"][0])),
}


@pytest.mark.parametrize("change", FIELD_MUTATIONS.values(), ids=FIELD_MUTATIONS.keys())
def test_mistyped_manifest_fields_are_format_errors(dataset, change):
    doc = _doc(dataset)
    change(doc)
    _put(dataset, doc)
    with pytest.raises(fl.FormatError, match="Fix:") as info:
        fl.open(dataset)
    assert MANIFEST_NAME in str(info.value)
    assert len(str(info.value)) < 2_000  # a hostile value is not echoed in full


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"format": "feedline", "format_version": NaN}', id="nan"),
        pytest.param('{"format": "feedline", "format_version": 1, "rows": Infinity}', id="inf"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="deeply-nested-list"),
        pytest.param('{"a":' * 50_000 + "1" + "}" * 50_000, id="deeply-nested-object"),
        pytest.param(
            '{"format": "feedline", "format_version": ' + "9" * 5_000 + "}", id="huge-int"
        ),
        pytest.param("\ufeff{}", id="bom"),
        pytest.param("\xff\xfe", id="not-utf8"),
    ],
)
def test_malformed_json_is_a_format_error(dataset, text):
    (dataset / MANIFEST_NAME).write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(fl.FormatError, match="Fix:"):
        fl.open(dataset)


def test_nan_in_shard_sizes_is_a_format_error(dataset):
    text = (dataset / MANIFEST_NAME).read_text()
    doc = _doc(dataset)
    rows = doc["shards"][0]["rows"]
    _put(dataset, text.replace(f'"rows": {rows},', '"rows": NaN,', 1))
    with pytest.raises(fl.FormatError, match="NaN"):
        fl.open(dataset)


def test_oversize_manifest_is_refused_without_reading_it(dataset):
    with open(dataset / MANIFEST_NAME, "r+b") as handle:
        handle.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(fl.FormatError, match="limit"):
        fl.open(dataset)
    with pytest.raises(fl.FormatError, match="limit"):
        Manifest.from_json(b" " * (MAX_MANIFEST_BYTES + 1), "in memory")


def test_a_manifest_that_is_a_folder_is_a_format_error(dataset):
    (dataset / MANIFEST_NAME).unlink()
    (dataset / MANIFEST_NAME).mkdir()
    with pytest.raises(fl.FormatError):
        fl.open(dataset)


def test_absurd_row_counts_are_bounded(dataset):
    doc = _doc(dataset)
    doc["shards"][0]["rows"] = 2**53 + 1
    doc["shards"][0]["row_groups"] = [2**53 + 1]
    del doc["rows"]
    _put(dataset, doc)
    with pytest.raises(fl.FormatError):
        fl.open(dataset)


def _claim_rows(doc, rows, groups):
    doc["shards"][0].update(rows=rows, row_groups=groups)
    doc.pop("rows", None)


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(lambda d: _claim_rows(d, 2**53, [2**53]), id="2**53-rows"),
        pytest.param(lambda d: _claim_rows(d, 2**53, [10, 2**53 - 10]), id="2**53-rows-2-groups"),
        pytest.param(lambda d: _claim_rows(d, 20, [5, 15]), id="other-row-groups"),
        pytest.param(lambda d: _claim_rows(d, 40, [20, 20]), id="more-rows"),
        pytest.param(lambda d: d["shards"][0].update(bytes=2**53), id="2**53-bytes"),
        pytest.param(
            lambda d: d["shards"][0].update(bytes=d["shards"][0]["bytes"] - 1), id="one-byte-less"
        ),
    ],
)
def test_manifest_sizes_are_checked_against_the_footers_before_any_allocation(dataset, claim):
    """A manifest within the parser's bounds but lying about its shards (rows, row groups,
    bytes) raises IntegrityError on open, from the footers: never a MemoryError in the
    loader, which sizes its arrays from the manifest."""
    doc = _doc(dataset)
    claim(doc)
    _put(dataset, doc)
    with pytest.raises(fl.IntegrityError, match=r"part-00000.*the manifest says") as info:
        loader = fl.open(dataset).loader(
            batch_size=8, columns=["id"], cache="memory", format="numpy"
        )
        list(loader)
    assert "Fix:" in str(info.value)


def test_footers_are_read_in_parallel_and_the_first_bad_shard_is_named(tmp_path):
    out = tmp_path / "many"
    fl.from_arrow(_table(200)).write(out, rows_per_shard=5)
    doc = _doc(out)
    assert len(doc["shards"]) == 40
    for index in (7, 30):
        doc["shards"][index].update(rows=6, row_groups=[6])
    doc["shards"][8].update(rows=4, row_groups=[4])
    del doc["rows"]
    _put(out, doc)
    with pytest.raises(fl.IntegrityError, match=re.escape(doc["shards"][7]["path"])):
        fl.open(out)


def test_a_shard_path_through_a_symlinked_folder_stays_a_relative_path(dataset, tmp_path):
    # symlinks inside the folder are the owner's business; the manifest itself cannot
    # name anything outside it
    doc = _doc(dataset)
    doc["shards"][0]["path"] = "sub/" + doc["shards"][0]["path"]
    _put(dataset, doc)
    with pytest.raises(fl.IntegrityError, match=r"sub/part-00000.*missing"):
        fl.open(dataset).to_arrow()


# --------------------------------------------------------------------------- manifest vs shards


def test_manifest_schema_not_matching_the_shards(dataset):
    doc = _doc(dataset)
    other = pa.schema({"id": pa.string(), "s": pa.string(), "v": pa.list_(pa.int32())})
    doc["schema"]["arrow_ipc"] = base64.b64encode(other.serialize().to_pybytes()).decode()
    _put(dataset, doc)
    with pytest.raises(fl.SchemaError, match="part-00000"):
        fl.open(dataset).to_arrow()


def test_a_shard_with_other_rows_than_the_manifest_says(dataset):
    doc = _doc(dataset)
    shard = dataset / doc["shards"][1]["path"]
    pq.write_table(_table(25), shard, row_group_size=5)  # same schema, 25 rows, not 20
    # caught on open, from the footer (its size, digest and rows differ from the manifest's)
    with pytest.raises(fl.IntegrityError, match=r"part-00001.*the manifest says"):
        fl.open(dataset).to_arrow()
    pq.write_table(_table(15), shard)
    with pytest.raises(fl.IntegrityError, match=r"part-00001.*the manifest says"):
        fl.open(dataset).to_arrow()
    with pytest.raises(fl.IntegrityError):
        fl.verify(dataset)


def _footer_claims(path: Path, length: int) -> None:
    data = bytearray(path.read_bytes())
    data[-8:-4] = struct.pack("<I", length)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("length", [0xFFFFFFF0, 2**31 - 1, 0])
@pytest.mark.parametrize("with_manifest", [True, False])
def test_parquet_footer_claiming_gigabytes(dataset, length, with_manifest):
    shard = dataset / _doc(dataset)["shards"][0]["path"]
    _footer_claims(shard, length)
    if not with_manifest:  # a plain Parquet folder
        (dataset / MANIFEST_NAME).unlink()
        for other in dataset.glob("part-*"):
            other.rename(dataset / other.name.replace("part-", "plain-"))
    with pytest.raises(fl.DataError, match="-00000"):
        _open_and_read(dataset)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-1], id="last-byte-cut"),
        pytest.param(lambda b: b[: len(b) // 2], id="half"),
        pytest.param(lambda b: b[:4], id="magic-only"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"PAR1" + b"\x00" * 100 + b"PAR1", id="zero-footer"),
        pytest.param(lambda b: os.urandom(len(b)), id="noise"),
    ],
)
def test_truncated_or_garbage_shards(dataset, damage):
    shard = dataset / _doc(dataset)["shards"][1]["path"]
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(fl.FeedlineError, match="part-00001"):
        _open_and_read(dataset)
    with pytest.raises(fl.IntegrityError):
        fl.verify(dataset)


# --------------------------------------------------------------------------- no code runs


class _Trap:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling this creates the marker file


def test_pickle_payloads_in_schemas_never_run(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Trap(str(marker)))
    metadata = {
        b"ARROW:extension:name": b"arrow.py_extension_type",
        b"ARROW:extension:metadata": payload,
    }
    schema = pa.schema([pa.field("id", pa.int64(), metadata=metadata)], metadata={b"x": payload})
    out = tmp_path / "ds"
    fl.from_arrow(pa.table({"id": [1, 2]})).write(out)
    doc = _doc(out)
    doc["schema"]["arrow_ipc"] = base64.b64encode(schema.serialize().to_pybytes()).decode()
    _put(out, doc)
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.Table.from_pydict({"id": [1, 2]}, schema=schema), plain / "a.parquet")
    for folder in (out, plain):
        with contextlib.suppress(fl.FeedlineError):
            _open_and_read(folder)
    assert not marker.exists()


READ_PATH_MODULES = [
    "store/dataset_files.py",
    "store/manifest.py",
    "store/commit.py",
    "store/write_lock.py",
    "store/shards.py",
    "store/footers.py",
    "store/shard_source.py",
    "io/parquet.py",
    "io/storage/paths.py",
]


@pytest.mark.parametrize("module", READ_PATH_MODULES)
def test_the_read_path_has_no_code_loading(module):
    tree = ast.parse((REPO / "feedline" / module).read_text())
    banned = {"pickle", "cloudpickle", "marshal", "shelve", "dill", "importlib", "runpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not banned & {n.split(".")[0] for n in names}, ast.dump(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"eval", "exec", "compile", "__import__"}, node.lineno


# --------------------------------------------------------------------------- fuzz: manifests

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc[:3]):
            yield from _paths(value, (*prefix, index))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, bytes]:
    out = tmp_path_factory.mktemp("fuzz") / "ds"
    fl.from_arrow(_table()).write(out, rows_per_shard=20, row_group_rows=10)
    return out, (out / MANIFEST_NAME).read_bytes()


def _only_feedline_errors(out: Path) -> None:
    try:
        _open_and_read(out)
    except fl.FeedlineError as exc:
        assert "Fix:" in str(exc), exc


@FUZZ
@given(data=st.data())
def test_fuzz_manifest_json_fields(pristine, data):
    out, original = pristine
    doc = json.loads(original)
    paths = list(_paths(doc))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths[1:]))
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            if data.draw(st.booleans()) and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                target[path[-1]] = data.draw(_json)
        except (KeyError, IndexError, TypeError):
            continue
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    try:
        _only_feedline_errors(out)
    finally:
        (out / MANIFEST_NAME).write_bytes(original)


@FUZZ
@given(data=st.data())
def test_fuzz_manifest_bytes(pristine, data):
    out, original = pristine
    raw = bytearray(original)
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    (out / MANIFEST_NAME).write_bytes(bytes(raw))
    try:
        _only_feedline_errors(out)
    finally:
        (out / MANIFEST_NAME).write_bytes(original)


@FUZZ
@given(text=st.binary(max_size=300) | st.text(max_size=300))
def test_fuzz_manifest_parser(text):
    try:
        Manifest.from_json(text, "fuzz")
    except fl.FormatError as exc:
        assert "Fix:" in str(exc)


# --------------------------------------------------------------------------- fuzz: Parquet

#: run in a child process: a crash (segfault) or a hang of pyarrow fails the test instead
#: of killing the test run; faulthandler bounds every case at 20 s
PARQUET_FUZZ = textwrap.dedent(
    """
    import faulthandler, json, sys
    from pathlib import Path
    import pyarrow as pa, pyarrow.parquet as pq
    from hypothesis import HealthCheck, given, settings, strategies as st
    import feedline as fl

    root = Path(sys.argv[1])
    table = pa.table({"id": pa.array(range(60), pa.int64()),
                      "s": [f"row {i}" for i in range(60)],
                      "v": pa.array([[i, i] for i in range(60)], pa.list_(pa.int32()))})
    fl.from_arrow(table).write(root / "ds", row_group_rows=20)
    shard = next((root / "ds").glob("part-*.parquet"))
    original = shard.read_bytes()
    (root / "plain").mkdir()
    counts = {}

    @settings(max_examples=int(sys.argv[2]), derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def fuzz(data):
        raw = bytearray(original)
        where = data.draw(st.sampled_from(["anywhere", "footer"]))
        low = 0 if where == "anywhere" else max(0, len(raw) - 400)
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(low, len(raw) - 1))] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        shard.write_bytes(bytes(raw))
        (root / "plain" / "a.parquet").write_bytes(bytes(raw))
        for folder in (root / "ds", root / "plain"):
            faulthandler.dump_traceback_later(20, exit=True)
            try:
                ds = fl.open(folder)
                ds.count()
                ds.to_arrow()
                counts["read"] = counts.get("read", 0) + 1
            except fl.FeedlineError as exc:
                assert "Fix:" in str(exc), exc
                counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
            finally:
                faulthandler.cancel_dump_traceback_later()

    fuzz()
    print("COUNTS", json.dumps(counts), flush=True)
    """
)


@pytest.mark.slow
def test_fuzz_parquet_shards_in_a_child_process(tmp_path):
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PARQUET_FUZZ, str(tmp_path), "200"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the Parquet fuzz hung: {str(exc.stdout)[-2000:]} {str(exc.stderr)[-2000:]}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the fuzz child died ({proc.returncode}):\n{output[-4000:]}"
    counts = json.loads(output.split("COUNTS", 1)[1].splitlines()[0])
    assert counts.get("DataError", 0) > 50, counts  # most mutations are caught, not ignored
