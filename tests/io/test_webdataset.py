"""``fl.read_webdataset``: shards written by WebDataset's own ``ShardWriter``/``TarWriter``
(real JPEGs cut from scikit-learn's sample photographs) read back with feedline, rows equal to
what ``webdataset.WebDataset`` yields; images decoded and augmented by the loader; damaged
shards and bad members raise with shard, member and byte offset, or are skipped and counted."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import warnings
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, DataError, SchemaError

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")
datasets = pytest.importorskip("sklearn.datasets")

N, PER_SHARD = 14, 5  # 3 shards: 5 + 5 + 4 samples
PATTERN = "train-{000000..000002}.tar"


def photos(n: int) -> list[bytes]:
    """``n`` distinct JPEGs: 64×48 windows of the two sample photographs, re-encoded."""
    images = datasets.load_sample_images().images
    out = []
    for i in range(n):
        pixels = images[i % 2][25 * i : 25 * i + 48, 30 * i : 30 * i + 64]
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(pixels)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def sample(i: int, jpg: bytes) -> dict:
    record = {
        "__key__": f"{i:06d}",
        "jpg": jpg,
        "cls": i % 3,
        "json": {"i": i, "tag": f"t{i}"},
        "seg.npy": np.full((2, 3), i, np.int16),
    }  # fmt: skip (written by np.save)
    if i % 4:  # every fourth sample has no caption
        record["txt"] = f"photo number {i}"
    return record


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Three shards written by webdataset.ShardWriter; returns their folder."""
    folder = tmp_path / "shards"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i, jpg in enumerate(photos(N)):
            sink.write(sample(i, jpg))
    return folder


def webdataset_rows(urls: str) -> list[dict]:
    """What WebDataset itself yields (its basic decoders: cls → int, txt → str, json → dict,
    npy → array, here as a list)."""
    rows = []
    for s in wds.WebDataset(urls, shardshuffle=False).decode():
        s.pop("__local_path__", None)
        if "seg.npy" in s:
            s["seg.npy"] = s["seg.npy"].tolist()
        rows.append(s)
    return rows


def as_webdataset(row: dict) -> dict:
    """A feedline row in WebDataset's shape: missing fields absent, JSON and npy parsed."""
    out = {k: v for k, v in row.items() if v is not None}
    out["json"] = json.loads(out["json"])
    out["seg.npy"] = np.load(io.BytesIO(out["seg.npy"])).tolist()
    return out


def test_rows_equal_what_webdataset_yields(shards: Path) -> None:
    urls = str(shards / PATTERN)
    ds = fl.read_webdataset(urls)
    schema = ds.schema()
    assert schema.names == ["__key__", "__url__", "cls", "jpg", "json", "seg.npy", "txt"]
    assert [schema.field(n).type for n in ("cls", "jpg", "json", "seg.npy", "txt")] == [
        pa.int64(), pa.binary(), pa.string(), pa.binary(), pa.string()]  # fmt: skip
    rows = ds.to_arrow().to_pylist()
    want = webdataset_rows(urls)
    assert len(rows) == len(want) == N
    assert [as_webdataset(r) for r in rows] == want
    assert sum(r["txt"] is None for r in rows) == len(range(0, N, 4))  # missing → null
    assert rows[7]["__url__"] == str(shards / "train-000001.tar")
    report = ds.analyze()
    assert report.files_read == 3 and report.rows_read == N and report.records_skipped == 0


def test_fields_choose_and_type_the_columns(shards: Path) -> None:
    urls = str(shards / PATTERN)
    chosen = fl.read_webdataset(urls, fields=["jpg", "cls"])
    assert chosen.schema().names == ["__key__", "__url__", "jpg", "cls"]
    assert chosen.count() == N  # every sample is a row, whatever fields it has
    struct = pa.struct([("i", pa.int64()), ("tag", pa.string())])
    typed = fl.read_webdataset(urls, fields={"json": struct, "cls": "string", "seg.npy": None})
    table = typed.to_arrow()
    assert table.schema.field("json").type == struct
    assert table["json"].to_pylist() == [{"i": i, "tag": f"t{i}"} for i in range(N)]
    assert table["cls"].to_pylist() == [str(i % 3) for i in range(N)]
    projected = fl.read_webdataset(urls, ["__key__", "txt"]).to_arrow()
    assert projected.column_names == ["__key__", "txt"]
    assert projected["txt"].to_pylist() == [None if i % 4 == 0 else f"photo number {i}"
                                            for i in range(N)]  # fmt: skip
    with pytest.raises(ConfigurationError, match="Fix:"):
        fl.read_webdataset(urls, fields={"jpg": "complex128"})


def test_gzipped_shards_globs_and_fsspec_urls(shards: Path, tmp_path: Path) -> None:
    want = fl.read_webdataset(str(shards / PATTERN)).to_arrow().drop_columns(["__url__"])
    gz = tmp_path / "gz"
    gz.mkdir()
    memory = fsspec.filesystem("memory")
    for i in range(3):
        data = (shards / f"train-{i:06d}.tar").read_bytes()
        (gz / f"train-{i:06d}.tar.gz").write_bytes(gzip.compress(data))
        memory.pipe(f"/wds-test/train-{i:06d}.tgz", data)
    for urls in (str(gz / "train-{000000..000002}.tar.gz"), str(gz), str(gz / "*.tar.gz"),
                 "memory://wds-test/train-{000000..000002}.tgz"):  # fmt: skip
        got = fl.read_webdataset(urls).to_arrow()
        assert got.drop_columns(["__url__"]).equals(want), urls
    memory.rm("/wds-test", recursive=True)


def test_shards_on_s3(shards: Path, s3_bucket) -> None:
    """A real S3 API (moto on loopback): brace pattern, retrying filesystem, same rows."""
    fs = s3_bucket.fs()
    for i in range(3):
        fs.put(str(shards / f"train-{i:06d}.tar"), f"{s3_bucket.url}/wds/train-{i:06d}.tar")
    got = fl.read_webdataset(f"{s3_bucket.url}/wds/{PATTERN}",
                             storage_options=s3_bucket.storage_options).to_arrow()  # fmt: skip
    want = fl.read_webdataset(str(shards / PATTERN)).to_arrow()
    assert got.drop_columns(["__url__"]).equals(want.drop_columns(["__url__"]))
    assert got["__url__"][0].as_py() == f"{s3_bucket.url}/wds/train-000000.tar"


def test_loader_decodes_and_augments_the_encoded_images(shards: Path) -> None:
    ds = fl.read_webdataset(str(shards / PATTERN), fields=["jpg", "cls"])
    train = fl.ImageTransform("jpg", size=32)
    kwargs = {"batch_size": 4, "seed": 0, "columns": ["jpg", "cls"], "transform": train}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ds.loader(**kwargs, num_workers=2) as loader:
            first, second = list(loader), list(loader)
        again = list(ds.loader(**kwargs))
    assert len(first) == N // 4 and all(b["jpg"].shape == (4, 3, 32, 32) for b in first)
    assert str(first[0]["jpg"].dtype) == "torch.float32"
    for a, b in zip(first, again, strict=True):  # the same seed: the same crops and flips
        assert (a["jpg"] == b["jpg"]).all() and (a["cls"] == b["cls"]).all()
    assert not all((a["jpg"] == b["jpg"]).all() for a, b in zip(first, second, strict=True))
    # evaluation: no randomness, so each tensor equals the transform of WebDataset's own bytes
    evaluate = fl.ImageTransform("jpg", train=False, size=32, normalize=False)
    loader = ds.loader(batch_size=5, shuffle=False, columns=["jpg", "cls"], transform=evaluate,
                       format="numpy", drop_last=False)  # fmt: skip
    images = np.concatenate([b["jpg"] for b in loader])
    reference = [evaluate({"jpg": s["jpg"]})["jpg"] for s in wds.WebDataset(
        str(shards / PATTERN), shardshuffle=False)]  # fmt: skip
    assert images.dtype == np.uint8 and images.shape == (N, 3, 32, 32)
    np.testing.assert_array_equal(images, np.stack(reference))


# ------------------------------------------------------------------ damage and bad members


def member_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """member name → (header offset, data offset) in the tar at ``path``."""
    with tarfile.open(path) as tar:
        return {m.name: (m.offset, m.offset_data) for m in tar.getmembers()}


def damaged(shards: Path, how: str) -> int:
    """Damage the middle shard at sample 7's image; returns that member's header offset."""
    path = shards / "train-000001.tar"
    data = bytearray(path.read_bytes())
    header, body = member_offsets(path)["000007.jpg"]
    if how == "cut inside a member":
        data = data[: body + 100]
    elif how == "cut at a member boundary":
        data = data[:header]
    elif how == "corrupt header":
        data[header + 148 : header + 156] = b"garbage!"  # the header checksum field
    path.write_bytes(bytes(data))
    return header


HOW = ["cut inside a member", "cut at a member boundary", "corrupt header"]


@pytest.mark.parametrize("how", HOW)
def test_damaged_shard_raises_naming_shard_member_and_offset(shards: Path, how: str) -> None:
    header = damaged(shards, how)
    with pytest.raises(DataError, match="Fix:") as caught:
        fl.read_webdataset(str(shards / PATTERN)).to_arrow()
    message = str(caught.value)
    assert f"train-000001.tar' is damaged at byte {header}" in message
    if how == "cut inside a member":
        assert f"byte {header}, member '000007.jpg'" in message


@pytest.mark.parametrize("how", HOW)
def test_damaged_shard_skip_drops_only_the_damaged_sample(shards: Path, how: str) -> None:
    header = damaged(shards, how)
    ds = fl.read_webdataset(str(shards / PATTERN), on_error="skip")
    keys = ds.to_arrow()["__key__"].to_pylist()
    # sample 7 holds the damage and is dropped; a shard cut there has nothing after it, but
    # past a corrupt header reading resumes: samples 8 and 9 come back; shard 2 is whole
    after = [8, 9] if how == "corrupt header" else []
    assert keys == [f"{i:06d}" for i in [*range(7), *after, *range(10, N)]]
    report = ds.analyze()
    assert report.records_skipped == 1
    assert report.skipped[0]["where"].startswith(str(shards / "train-000001.tar"))
    assert f"byte {header}" in report.skipped[0]["where"]
    assert "the sample '000007' was dropped" in report.skipped[0]["reason"]


def test_webdataset_itself_silently_drops_a_shard_cut_at_a_member_boundary(shards: Path) -> None:
    """Why feedline checks the end-of-archive block: tarfile (and so WebDataset) takes a
    missing header for the end of the archive, losing the rest of the shard without a word."""
    damaged(shards, "cut at a member boundary")
    rows = webdataset_rows(str(shards / PATTERN))
    # samples 8 and 9 are gone, and sample 7 comes out with its label but no image
    assert [r["__key__"] for r in rows] == [f"{i:06d}" for i in [*range(8), *range(10, N)]]
    assert sorted(rows[7]) == ["__key__", "__url__", "cls"]
    with pytest.raises(DataError, match="end-of-archive"):
        fl.read_webdataset(str(shards / PATTERN)).to_arrow()


def test_truncated_gzip_and_not_a_tar(shards: Path, tmp_path: Path) -> None:
    data = gzip.compress((shards / "train-000000.tar").read_bytes())
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.tar\.gz.*gzip stream is damaged.*Fix:"):
        fl.read_webdataset(str(cut), fields=["cls"]).to_arrow()
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar file at all" * 40)
    with pytest.raises(DataError, match=r"junk\.tar.*byte 0.*Fix:"):
        fl.read_webdataset(str(junk))
    ds = fl.read_webdataset([str(junk), str(shards / "train-000000.tar")], on_error="skip")
    assert ds.count() == PER_SHARD and ds.analyze().records_skipped == 1


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """A tar of exactly these members (WebDataset's TarWriter cannot write duplicates)."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_bad_member_raises_or_skips_the_sample(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    with wds.TarWriter(str(path)) as sink:
        for i in range(4):
            sink.write({"__key__": f"k{i}", "cls": b"x" if i == 2 else str(i).encode(),
                        "txt": b"\xff\xfe" if i == 3 else b"ok"})  # fmt: skip
    offsets = member_offsets(path)
    with pytest.raises(DataError, match="Fix:") as caught:
        fl.read_webdataset(str(path)).to_arrow()
    assert f"member 'k2.cls' of the shard '{path}' (byte {offsets['k2.cls'][0]})" in str(
        caught.value)  # fmt: skip
    ds = fl.read_webdataset(str(path), on_error="skip")
    assert ds.to_arrow()["__key__"].to_pylist() == ["k0", "k1"]
    report = ds.analyze()
    assert report.records_skipped == 2
    assert [e["where"].split(": ", 1)[1] for e in report.skipped] == [
        f"member 'k2.cls' at byte {offsets['k2.cls'][0]}",
        f"member 'k3.txt' at byte {offsets['k3.txt'][0]}"]  # fmt: skip
    # as binary, the same members read fine
    raw = fl.read_webdataset(str(path), fields={"cls": "binary", "txt": "binary"}).to_arrow()
    assert raw["cls"].to_pylist() == [b"0", b"1", b"x", b"3"]


def test_duplicate_fields_unlisted_fields_and_stray_members(tmp_path: Path) -> None:
    path = tmp_path / "odd.tar"
    write_tar(path, [("a.cls", b"1"), ("a.cls", b"2"), ("b.cls", b"3"), ("README", b"hi"),
                     ("__meta__", b"{}"), ("c.cls", b"4"), ("c.extra", b"late")])  # fmt: skip
    with pytest.raises(DataError, match="'cls' appears twice"):
        fl.read_webdataset(str(path), infer_samples=2).to_arrow()
    with pytest.raises(SchemaError, match=r"field 'extra'.*Fix:"):
        fl.read_webdataset(str(path), infer_samples=2, on_error="skip").to_arrow()
    ds = fl.read_webdataset(str(path), fields=["cls"], on_error="skip")
    assert ds.to_arrow()["cls"].to_pylist() == [3, 4]  # listed fields: 'extra' is ignored
    report = ds.analyze()
    assert report.records_skipped == 1 and report.counters == {
        "webdataset_members_without_field": 1}  # fmt: skip
    assert fl.read_webdataset(str(path), on_error="skip").schema().names[2:] == ["cls", "extra"]


def test_decode_images_preprocessor_on_the_image_field(shards: Path) -> None:
    ds = fl.read_webdataset(str(shards / PATTERN), fields=["jpg", "cls"])
    decoded = ds.transform(fl.DecodeImages("jpg", size=16, path_column="__key__")).to_arrow()
    assert isinstance(decoded.schema.field("jpg").type, pa.FixedShapeTensorType)
    pixels = decoded["jpg"].combine_chunks().to_numpy_ndarray()
    assert pixels.shape == (N, 16, 16, 3) and pixels.dtype == np.uint8 and pixels.std() > 10
