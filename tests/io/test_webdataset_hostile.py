"""WebDataset shards that are damaged or hostile: a corrupt header loses only its sample (and
is counted), a member's claimed size never chooses an allocation (a 4 GiB gzip bomb is refused
from its header), a brace pattern is counted before it is expanded, and a gzip stream whose
CRC fails never gives back values. Hostile-memory cases run in a child process under an
address-space limit (tests/hostile.py)."""

from __future__ import annotations

import gzip
import io
import itertools
import random
import struct
import tarfile
import zlib
from pathlib import Path

import pytest
from hostile import run_limited

import feedline as fl
from feedline.errors import ConfigurationError, DataError
from feedline.io.webdataset.braces import count_names, expand_urls

wds = pytest.importorskip("webdataset")
braceexpand = pytest.importorskip("braceexpand")

HERE = str(Path(__file__).parent)


def write_shard(path: Path, samples: int = 5) -> dict[str, int]:
    """Samples ``000``.. with a ``cls`` and a ``txt`` member; returns member → header offset."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for field, data in (("cls", str(i).encode()), ("txt", b"text %d" % i)):
                info = tarfile.TarInfo(f"{i:03d}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def damage(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    path.write_bytes(bytes(raw))


def keys_and_report(path: Path, **kwargs) -> tuple[list[str], fl.ExecutionReport]:
    ds = fl.read_webdataset(str(path), fields=["cls", "txt"], on_error="skip", **kwargs)
    return ds.to_arrow()["__key__"].to_pylist(), ds.analyze()


# ------------------------------------------------------------ item 3: skip loses only the damage


def test_a_corrupt_header_loses_only_its_sample_and_counts_it(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    offsets = write_shard(path)
    damage(path, offsets["002.cls"] + 148, b"garbage!")  # sample 2's first header checksum
    # WebDataset (tarfile) takes the bad header for the end: samples 2, 3 and 4 are gone
    assert [s["__key__"] for s in wds.WebDataset(str(path), shardshuffle=False)] == ["000", "001"]
    keys, report = keys_and_report(path)
    assert keys == ["000", "001", "003", "004"]
    assert report.records_skipped == 1
    (skip,) = report.skipped
    assert skip["where"] == f"{path}: byte {offsets['002.cls']}"
    assert "tar header is corrupt" in skip["reason"]
    assert "the sample '002' was dropped" in skip["reason"]
    assert f"reading resumed at byte {offsets['002.txt']}" in skip["reason"]
    with pytest.raises(DataError, match=rf"damaged at byte {offsets['002.cls']}.*Fix:"):
        fl.read_webdataset(str(path), fields=["cls", "txt"]).to_arrow()


def test_a_corrupt_header_inside_a_sample_and_in_a_gzipped_shard(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    offsets = write_shard(path)
    damage(path, offsets["002.txt"] + 148, b"bad!bad!")  # its 2nd member
    assert keys_and_report(path)[0] == ["000", "001", "003", "004"]
    gz = tmp_path / "s.tar.gz"  # damaged before it was compressed: the gzip CRC is fine
    gz.write_bytes(gzip.compress(path.read_bytes()))
    keys, report = keys_and_report(gz)
    assert keys == ["000", "001", "003", "004"] and report.records_skipped == 1


def test_when_the_damaged_members_sample_is_unknown_both_neighbours_go(tmp_path: Path) -> None:
    """A damaged name byte (the checksum still reads as a number) could have named sample 1
    or sample 2: both are dropped, never returned with a member missing."""
    path = tmp_path / "s.tar"
    offsets = write_shard(path)
    damage(path, offsets["002.cls"] + 2, b"9")  # '002.cls' -> '009.cls'; the checksum disagrees
    keys, report = keys_and_report(path)
    assert keys == ["000", "003", "004"]
    assert report.records_skipped == 2
    assert {s["reason"].split("the sample ")[1][:5] for s in report.skipped} == {"'001'", "'002'"}


def test_several_damages_a_zeroed_header_and_a_cut(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    offsets = write_shard(path, samples=8)
    damage(path, offsets["001.cls"] + 148, b"garbage!")
    # a zeroed header is not the end of the archive; its name is gone, so the samples on both
    # sides of it (4 and 5) may miss a member
    damage(path, offsets["004.txt"], bytes(512))
    # cut in the padding after sample 7's last member: no end-of-archive, so sample 7 may
    # have had more members
    path.write_bytes(path.read_bytes()[: offsets["007.txt"] + 600])
    keys, report = keys_and_report(path)
    assert keys == ["000", "002", "003", "006"]
    assert report.records_skipped == 4
    dropped = sorted(s["reason"].split("the sample ")[1][1:4] for s in report.skipped)
    assert dropped == ["001", "004", "005", "007"]
    assert "data follows the zero (end-of-archive) block" in report.skipped[1]["reason"]
    assert "without the tar end-of-archive block" in report.skipped[3]["reason"]


def test_a_gzip_stream_whose_crc_fails_never_gives_back_values(tmp_path: Path) -> None:
    plain = tmp_path / "s.tar"
    write_shard(plain)
    data = bytearray(gzip.compress(plain.read_bytes(), mtime=0))
    data[-8] ^= 0xFF  # the CRC32 of the trailer: every byte of the tar decompresses as written
    gz = tmp_path / "s.tar.gz"
    gz.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"gzip stream is damaged.*Fix:"):
        fl.read_webdataset(str(gz), fields=["cls", "txt"]).to_arrow()
    keys, report = keys_and_report(gz)
    assert keys == [] and report.records_skipped == 1
    assert "no sample of the shard was kept" in report.skipped[0]["reason"]


# ------------------------------------------------------------ item 7: members are bounded


def gzip_with_zeros(path: Path, members: list[tuple[str, bytes | int]]) -> None:
    """A ``.tar.gz`` of ``members``; an int is a member of that many zero bytes, compressed in
    16 MiB steps that each end in a full flush (so one step's output serves all)."""
    step = bytes(16 << 20)
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -15)
    zero_step = squeeze.compress(step) + squeeze.flush(zlib.Z_FULL_FLUSH)
    out = io.BytesIO()
    out.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
    crc = size = 0

    def put(data: bytes) -> None:
        nonlocal crc, size
        out.write(squeeze.compress(data) + squeeze.flush(zlib.Z_FULL_FLUSH))
        crc, size = zlib.crc32(data, crc), size + len(data)

    for name, body in members:
        info = tarfile.TarInfo(name)
        info.size = body if isinstance(body, int) else len(body)
        put(info.tobuf(tarfile.USTAR_FORMAT))
        if isinstance(body, int):
            assert body % len(step) == 0
            for _ in range(body // len(step)):
                out.write(zero_step)
                crc, size = zlib.crc32(step, crc), size + len(step)
        else:
            put(body + bytes(-len(body) % 512))
    put(bytes(1024 * 10))  # the end-of-archive blocks and padding
    out.write(squeeze.flush())
    out.write(struct.pack("<II", crc, size & 0xFFFFFFFF))
    path.write_bytes(out.getvalue())


@pytest.mark.timeout(300)
def test_a_4_gib_member_in_a_4_mb_tar_gz_is_refused_from_its_header(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    gzip_with_zeros(bomb, [("000.cls", b"0"), ("000.npy", 4 << 30), ("001.cls", b"1")])
    assert bomb.stat().st_size < 8 << 20
    outcome = run_limited(
        f"return fl.read_webdataset({str(bomb)!r}, fields=['cls', 'npy']).count()",
        memory=2 << 30,
        timeout=120,
    )
    assert outcome.kind == "feedline" and outcome.error == "DataError", outcome
    message = outcome.message
    assert "bomb.tar.gz" in message and "'000.npy'" in message and "byte 1024" in message
    assert "4,294,967,296 bytes, more than max_member_bytes=1,073,741,824" in message
    assert "Fix: pass a larger max_member_bytes=" in message


@pytest.mark.timeout(300)
def test_an_oversized_member_is_a_counted_skip_and_its_neighbours_stay(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    members = [("000.cls", b"0"), ("001.cls", b"1"), ("001.npy", 64 << 20), ("002.cls", b"2")]
    gzip_with_zeros(bomb, members)
    body = f"""
    ds = fl.read_webdataset({str(bomb)!r}, fields=['cls', 'npy'], on_error='skip',
                            max_member_bytes=16 << 20)
    report = ds.analyze()
    return [ds.to_arrow()['__key__'].to_pylist(), report.records_skipped,
            [s['reason'] for s in report.skipped]]
    """
    outcome = run_limited(body, memory=2 << 30, timeout=120)
    assert outcome.kind == "ok", outcome
    keys, skipped, reasons = outcome.value
    assert keys == ["000", "002"] and skipped == 1
    assert "claims 67,108,864 bytes, more than max_member_bytes=16,777,216" in reasons[0]
    assert "the sample '001' was dropped" in reasons[0]


def test_a_plain_tar_member_claiming_more_than_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    info = tarfile.TarInfo("000.npy")
    info.size = 4 << 30
    path.write_bytes(info.tobuf(tarfile.USTAR_FORMAT) + bytes(4096))  # the header says 4 GiB
    outcome = run_limited(
        f"return fl.read_webdataset({str(path)!r}, fields=['npy'], max_member_bytes=8 << 30)"
        ".count()",
        memory=2 << 30,
    )
    assert outcome.kind == "feedline" and outcome.error == "DataError", outcome
    assert "claims 4,294,967,296 bytes but the shard holds only 4,096 more" in outcome.message
    for bad in (0, -1, 1.5, True, "1GB"):
        with pytest.raises(ConfigurationError, match="max_member_bytes"):
            fl.read_webdataset(str(path), fields=["npy"], max_member_bytes=bad)


# ------------------------------------------------------------ item 8: brace patterns bounded


@pytest.mark.timeout(120)
def test_a_billion_name_pattern_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    pattern = str(tmp_path / "shard-{000000000..999999999}.tar")
    outcome = run_limited(f"return fl.read_webdataset({pattern!r}).count()", timeout=60)
    assert outcome.kind == "feedline" and outcome.error == "ConfigurationError", outcome
    assert "1,000,000,000 names" in outcome.message and "Fix:" in outcome.message
    with pytest.raises(ConfigurationError, match="11 names"):
        expand_urls(["a-{0..9}.tar", "b.tar"], limit=10)
    assert len(expand_urls(["a-{0..8}.tar", "b.tar"], limit=10)) == 10
    with pytest.raises(ConfigurationError, match="unbalanced"):
        fl.read_webdataset(str(tmp_path / "shard-{0..9.tar"))


PATTERNS = [
    "plain.tar",
    "s-{000000..000099}.tar",
    "s-{0..10..3}.tar",
    "s-{10..0..4}-{-2..2}.tar",
    "{a..e}{Z..X}{a..z..5}",
    "python{2.{5..7},3.{2,3}}",
    "x{,.backup}{1,2}",
    "{a,{b,c}{1..3}}-{}",
    r"{1\{2,3}",
    "a}b{c,d}",
    "{{a,b}}",
    "{07..10}{x}",
]


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.3 or depth > 2:
            parts.append(rng.choice(["a", "b-", "", ",", "..", "\\{", "0"]))
        elif kind < 0.5:
            lo, hi = rng.randint(-5, 20), rng.randint(-5, 20)
            step = f"..{rng.randint(0, 4)}" if rng.random() < 0.3 else ""
            parts.append(f"{{{lo}..{hi}{step}}}")
        elif kind < 0.6:
            parts.append(f"{{{rng.choice('aZk')}..{rng.choice('bzA')}}}")
        else:
            items = [random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3))]
            parts.append("{" + ",".join(items) + "}")
    return "".join(parts)


def test_the_count_equals_what_braceexpand_yields() -> None:
    rng = random.Random(5)
    patterns = PATTERNS + [random_pattern(rng) for _ in range(400)]
    compared = 0
    for pattern in patterns:
        try:
            counted = count_names(pattern)
        except ConfigurationError:
            with pytest.raises(braceexpand.UnbalancedBracesError):
                list(braceexpand.braceexpand(pattern))
            continue
        if counted <= 2_000:  # braceexpand builds them all: compare where that is quick
            assert counted == len(list(braceexpand.braceexpand(pattern))), pattern
            compared += 1
    assert compared > 250
    assert count_names("{0..9}" * 12) == 10**12  # counted, not built
    assert list(itertools.islice(expand_urls("s-{00..99}.tar"), 2)) == ["s-00.tar", "s-01.tar"]


def test_how_damage_marks_samples() -> None:
    """iter_samples' rule, event by event: a damage whose member is known marks its own
    sample; an unknown one the sample in progress and the first new one after it."""
    from feedline.io.webdataset.tar import Damage, Member, Sample, iter_samples

    def run(events: list) -> list[str]:
        out = []
        for item in iter_samples(iter(events), lambda _: None):
            if isinstance(item, Damage):
                out.append(f"damage@{item.offset}")
            else:
                assert isinstance(item, Sample)
                out.append(f"{item.key}{'-lost' if item.lost else ''}")
        return out

    def m(name: str) -> Member:
        return Member(name, 0, b"")

    def unknown(at: int, resumed: int | None = 1) -> Damage:
        return Damage("bad", at, resumed)

    assert run([m("a.x"), m("a.y"), unknown(5), m("a.z"), m("b.x")]) == ["a-lost", "b"]
    assert run([m("a.x"), unknown(5), m("b.x"), m("c.x")]) == ["a-lost", "b-lost", "c"]
    assert run([m("a.x"), Damage("bad", 5, 9, "b"), m("b.y"), m("c.x")]) == ["a", "b-lost", "c"]
    assert run([m("a.x"), Damage("bad", 5, 9, "a"), m("b.x")]) == ["a-lost", "b"]
    assert run([unknown(0)]) == ["damage@0"]
    assert run([unknown(0, None)]) == ["damage@0"]
    assert run([m("a.x"), unknown(5, None)]) == ["a-lost"]
    assert run([unknown(0), unknown(7), m("a.x")]) == ["damage@0", "a-lost"]
