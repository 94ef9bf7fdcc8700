"""Hostile Petastorm schemas: the pickled Unischema is walked with bounded work and shown with a
bounded repr (a few KiB of shared nested lists, a reused dict or a shared nested tuple key
never expand), and its shapes are checked (positive sizes or None, a bounded product) before
any Arrow type is made from them. The bombs run in a child process under an address-space
limit and a timeout (tests/hostile.py)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hostile import run_limited

import feedline as fl
from feedline.io.petastorm.unischema import MAX_OPCODES, UNISCHEMA_KEY, parse_unischema

FIXTURES = Path(__file__).parents[1] / "fixtures" / "petastorm"
DATASET = FIXTURES / "dataset"
HERE = str(Path(__file__).parent)


def text(value: str) -> bytes:
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def get(index: int) -> bytes:
    return b"j" + struct.pack("<I", index)  # LONG_BINGET


def put(index: int) -> bytes:
    return b"r" + struct.pack("<I", index)  # LONG_BINPUT


def one_field_unischema(shape_ops: bytes, codec: bytes = b"N") -> bytes:
    """A protocol-2 pickle of a Unischema with one field ``f`` whose shape is ``shape_ops``."""
    return (
        b"\x80\x02cpetastorm.unischema\nUnischema\n)\x81}("
        + text("_name") + text("S") + text("_fields")
        + b"ccollections\nOrderedDict\n)R(" + text("f")
        + b"cpetastorm.unischema\nUnischemaField\n(" + text("f") + b"cnumpy\nint32\n"
        + shape_ops + codec + b"\x89t\x81uub."
    )  # fmt: skip


def memo_bomb(depth: int) -> bytes:
    """Opcodes of a list nested ``depth`` deep, each level holding the one below twice (via the
    memo): a few bytes per level, 2**depth leaves once expanded."""
    ops = b"]" + put(0) + b"0"
    for level in range(1, depth + 1):
        ops += b"(" + get(level - 1) * 2 + b"l" + put(level) + b"0"
    return ops + get(depth)


def reused_dict_bomb(items: int, builds: int) -> bytes:
    """A Unischema object whose state is one memoised dict of ``items`` keys, BUILT again and
    again: each BUILD merges the whole dict (``items * builds`` work for a few MB)."""
    head = b"\x80\x02cpetastorm.unischema\nUnischema\n)\x81" + put(0) + b"0"
    pairs = b"".join(b"J" + struct.pack("<i", k) + b"N" for k in range(items))
    table = b"}" + put(1) + b"(" + pairs + b"u0"
    return head + table + (get(0) + get(1) + b"b0") * builds + get(0) + b"."


def tuple_key_bomb(depth: int) -> bytes:
    """A dict whose key is a tuple nested ``depth`` deep, each level holding the one below
    twice: hashing it visits 2**depth tuples."""
    ops = b"\x80\x02)" + put(0) + b"0"
    for level in range(1, depth + 1):
        ops += get(level - 1) * 2 + b"\x86" + put(level) + b"0"
    return ops + b"}" + get(depth) + b"Ns."


# ------------------------------------------------------------------ item 9: bounded walk and repr


@pytest.mark.timeout(200)
def test_a_memo_bomb_is_refused_with_a_bounded_message() -> None:
    bomb = one_field_unischema(memo_bomb(400))
    assert len(bomb) < 8 << 10
    body = f"""
    import sys
    sys.path[:0] = [{HERE!r}, {str(Path(HERE).parent)!r}]
    from test_petastorm_hostile import one_field_unischema, memo_bomb
    from feedline.io.petastorm.unischema import parse_unischema
    parse_unischema(one_field_unischema(memo_bomb(400)))
    """
    outcome = run_limited(body, memory=2 << 30, timeout=60)
    assert outcome.kind == "feedline" and outcome.error == "FormatError", outcome
    assert "the field 'f' has the shape (" in outcome.message and "..." in outcome.message
    assert len(outcome.message) < 600 and "Fix:" in outcome.message


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("bomb", "says"),
    [
        ("reused_dict_bomb(100_000, 200_000)", "more than 4,000,000 values"),
        ("tuple_key_bomb(80)", "a dict key is not a plain value"),
    ],
)
def test_work_bombs_are_refused_quickly(bomb: str, says: str) -> None:
    body = f"""
    import sys
    sys.path[:0] = [{HERE!r}, {str(Path(HERE).parent)!r}]
    from test_petastorm_hostile import reused_dict_bomb, tuple_key_bomb
    from feedline.io.petastorm.unischema import parse_unischema
    parse_unischema({bomb})
    """
    outcome = run_limited(body, memory=2 << 30, timeout=60)
    assert outcome.kind == "feedline" and outcome.error == "FormatError", outcome
    assert says in outcome.message


def test_too_many_opcodes_and_bounded_values_in_every_message() -> None:
    with pytest.raises(fl.FormatError, match=f"more than {MAX_OPCODES:,} opcodes"):
        parse_unischema(b"\x80\x02" + b"N0" * MAX_OPCODES + b"N.")
    nested = memo_bomb(60)
    for codec in (nested, b"cpetastorm.codecs\nCompressedImageCodec\n)\x81}" + text("_image_codec")
                  + nested + b"sb"):  # fmt: skip
        with pytest.raises(fl.FormatError) as info:
            parse_unischema(one_field_unischema(b"K\x02\x85", codec=codec))
        assert len(str(info.value)) < 600


def test_a_hostile_unischema_in_the_metadata_falls_back_to_the_data(tmp_path: Path) -> None:
    root = shutil.copytree(DATASET, tmp_path / "ds")
    schema = pq.read_schema(DATASET / "_common_metadata")
    bomb = one_field_unischema(memo_bomb(400))
    pq.write_metadata(schema.with_metadata({UNISCHEMA_KEY: bomb}), root / "_common_metadata")
    body = f"""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fl.read_petastorm({str(root)!r}, columns=["id", "matrix"])
        rows = ds.count()
    return [rows, [str(w.message)[:300] for w in caught]]
    """
    outcome = run_limited(body, memory=2 << 30, timeout=60)
    assert outcome.kind == "ok", outcome
    rows, warned = outcome.value
    assert rows == 36 and any("the field 'f' has the shape" in w for w in warned), warned


# ------------------------------------------------------------------ item 11: shapes are checked


def fixture_pickle_with_matrix_shape(shape_ops: bytes) -> bytes:
    """The fixture's protocol-2 Unischema pickle with the ``matrix`` field's shape replaced."""
    legit = (FIXTURES / "unischema.protocol2.pickle").read_bytes()
    start = legit.index(b"cnumpy\nfloat32\nq/K\x04K\x03\x86") + len(b"cnumpy\nfloat32\nq/")
    return legit[:start] + shape_ops + legit[start + 5 :]


SHAPES = {
    "(2**20, 2**20)": b"J\x00\x00\x10\x00J\x00\x00\x10\x00\x86",
    "(4, -3)": b"K\x04J\xfd\xff\xff\xff\x86",
    "(4, 0)": b"K\x04K\x00\x86",
    "(4, True)": b"K\x04\x88\x86",
    "(4, 3.0)": b"K\x04G@\x08\x00\x00\x00\x00\x00\x00\x86",
    "33 dimensions": b"(" + b"K\x01" * 33 + b"t",
}


def test_the_patched_fixture_pickle_still_parses_when_the_shape_is_fine() -> None:
    schema = parse_unischema(fixture_pickle_with_matrix_shape(b"K\x02K\x06\x86"))
    assert schema.field("matrix").shape == (2, 6)
    assert schema.field("points").shape == (None, 3)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_bad_shape_is_refused_naming_the_field(shape: str) -> None:
    with pytest.raises(fl.FormatError, match=r"the field 'matrix' has the shape .*Fix:"):
        parse_unischema(fixture_pickle_with_matrix_shape(SHAPES[shape]))


def test_an_oversized_shape_never_reaches_arrow(tmp_path: Path) -> None:
    root = shutil.copytree(DATASET, tmp_path / "ds")
    schema = pq.read_schema(DATASET / "_common_metadata")
    meta = dict(schema.metadata)
    meta[UNISCHEMA_KEY] = fixture_pickle_with_matrix_shape(SHAPES["(2**20, 2**20)"])
    pq.write_metadata(schema.with_metadata(meta), root / "_common_metadata")
    with pytest.warns(RuntimeWarning, match=r"'matrix' has the shape \(1048576, 1048576\): "
                      r"1,099,511,627,776 elements"):  # fmt: skip
        ds = fl.read_petastorm(root, columns=["id", "matrix"])
    # the codec and the shape come from the stored bytes instead: (4, 3), as written
    assert ds.schema().field("matrix").type.shape == [4, 3]
    assert ds.count() == 36
