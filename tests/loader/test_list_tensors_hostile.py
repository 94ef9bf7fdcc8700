"""List tensors under hostile shapes and damaged files (issue 23.11 and the list-tensor fuzz).

Everything that could allocate a claimed size or hang runs in a child process under an
address-space limit (``hostile.run_limited``), so a regression fails the test instead of
taking the machine down.
"""

from __future__ import annotations

import pytest
from hostile import run_limited

#: writes ``part-0.parquet`` (two rows of list<double>, 25-row groups of 100 rows with
#: ``rows=100``) into a fresh folder ``d`` and defines ``outcome(**loader_options)``: the
#: error's class and message, or the batch shapes
_SETUP = """
import tempfile
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from feedline.errors import FeedlineError
d = tempfile.mkdtemp()
values = [[float(i), 2.0][: 1 + i % 2] for i in range({rows})]
pq.write_table(pa.table({{"x": pa.array(values, pa.list_(pa.float64())), "id": np.arange({rows})}}),
               d + "/part-0.parquet", row_group_size=25)
def outcome(**options):
    try:
        loader = fl.read_parquet(d).loader(format="numpy", ragged="pad", drop_last=False,
                                           **options)
        return [list(b["x"].shape) for b in loader][:2]
    except FeedlineError as exc:
        return [type(exc).__name__, str(exc)]
"""

HUGE = [
    # (loader options, what the refusal must say)
    ({"shapes": {"x": (2**31,)}, "batch_size": 2}, ["'x'", "34.4 GB", "shape (2147483648,)"]),
    ({"shapes": {"x": (2**31,)}, "batch_size": 2, "cache": "memory"}, ["'x'", "34.4 GB"]),
    ({"shapes": {"x": (2**31,)}, "batch_size": 2, "cache": "none"}, ["'x'", "34.4 GB"]),
    ({"shapes": {"x": (2**31, 2**31)}, "batch_size": 1}, ["'x'", "(2147483648, 2147483648)"]),
    ({"shapes": {"x": (2**62,)}, "batch_size": 1}, ["'x'", "elements a sample"]),
    ({"shapes": {"x": (2**30,)}, "batch_size": 1, "memory_budget": "10GB"},  # 8.6 GB a row
     ["streaming holds whole row groups", "25 rows", "memory_budget=10.0 GB"]),
    ({"shapes": {"x": (2**30,)}, "batch_size": 1, "memory_budget": "10GB", "cache": "memory"},
     ["cache='memory'", "more than this host's memory"]),
    ({"shapes": {"x": (0,)}, "batch_size": 1}, ["shapes['x']=(0,)", "positive ints"]),
    ({"shapes": {"x": (-4,)}, "batch_size": 1}, ["shapes['x']=(-4,)", "positive ints"]),
    ({"shapes": {"x": (2.5,)}, "batch_size": 1}, ["shapes['x']=(2.5,)", "positive ints"]),
]  # fmt: skip


@pytest.mark.timeout(120)
def test_huge_or_invalid_shapes_are_refused_before_anything_is_allocated() -> None:
    """Issue 23.11: ``shapes={'x': (2**31,)}, ragged='pad'`` asked for 64 GiB (a raw
    ``MemoryError`` under the limit), ``(2**31, 2**31)`` raised a raw ``ValueError``."""
    cases = [options for options, _ in HUGE]
    body = _SETUP.format(rows=100) + f"return [outcome(**o) for o in {cases!r}]\n"
    result = run_limited(body, memory=3 << 30, timeout=100)
    assert result.kind == "ok", (result.kind, result.error, result.message[-1500:])
    assert isinstance(result.value, list)
    for (options, says), got in zip(HUGE, result.value, strict=True):
        assert got[0] == "ConfigurationError", (options, got)
        assert all(s in got[1] for s in says) and "Fix:" in got[1], (options, got[1])


def test_a_reasonable_padded_shape_still_loads() -> None:
    body = _SETUP.format(rows=100) + "return outcome(shapes={'x': (4,)}, batch_size=8)\n"
    result = run_limited(body, memory=3 << 30, timeout=100)
    assert (result.kind, result.value) == ("ok", [[8, 4], [8, 4]]), result.message[-1500:]


# --------------------------------------------------------------------------- the fuzz pass

#: the data, written once per child: list<uint8> images (a given shape), ragged list<int32>
#: (padded or cut to 4, null rows padded) and nested list<list<float32>>; ``expected``
#: holds what the loader must give for each id
_DATA = """
import os, random, shutil, tempfile, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from feedline.errors import FeedlineError
N = 60
rng = np.random.default_rng(0)
img = rng.integers(0, 256, (N, 2, 3, 4), dtype=np.uint8)
rag = [list(range(int(k))) if i % 7 else None for i, k in enumerate(rng.integers(0, 7, N))]
nest = rng.normal(size=(N, 3, 2)).astype(np.float32)
table = pa.table({
    "id": np.arange(N),
    "img": pa.array(list(img.reshape(N, -1)), pa.list_(pa.uint8())),
    "rag": pa.array(rag, pa.list_(pa.int32())),
    "nest": pa.array([[list(r) for r in m] for m in nest], pa.list_(pa.list_(pa.float32()))),
})
padded = np.zeros((N, 4), np.int32)
for i, r in enumerate(rag):
    padded[i, : min(4, len(r or []))] = (r or [])[:4]
OPTIONS = {"shapes": {"img": (2, 3, 4), "rag": (4,), "nest": (3, 2)},
           "ragged": {"rag": "pad_or_truncate"}, "batch_size": 7, "shuffle": False,
           "drop_last": False, "format": "numpy"}

def right(batches):
    ids = np.concatenate([b["id"] for b in batches]) if batches else np.zeros(0, np.int64)
    if sorted(ids.tolist()) != list(range(N)):
        return False
    return all(np.array_equal(b["img"], img[b["id"]]) and np.array_equal(b["rag"], padded[b["id"]])
               and np.array_equal(b["nest"], nest[b["id"]]) for b in batches)

def fuzz(original, open_data, cases, seconds, seed, verify=None):
    shards = sorted(os.path.join(d, f) for d, _, fs in os.walk(original) for f in fs
                    if f.endswith(".parquet"))
    prng, counts, bad, deadline = random.Random(seed), {"cases": 0}, [], time.monotonic() + seconds
    for k in range(cases):
        if time.monotonic() > deadline:
            break
        counts["cases"] += 1
        case = tempfile.mkdtemp()
        shutil.rmtree(case)
        shutil.copytree(original, case)
        shard = shards[prng.randrange(len(shards))].replace(original, case)
        data = bytearray(open(shard, "rb").read())
        if prng.random() < 0.75:
            for _ in range(prng.choice([1, 1, 2, 8])):
                data[prng.randrange(len(data))] ^= prng.randrange(1, 256)
            how = "flip"
        else:
            data = data[: prng.randrange(len(data))]
            how = "cut"
        open(shard, "wb").write(bytes(data))
        cache = ("memory", "none")[k % 2]
        try:
            outcome = "right" if right(list(open_data(case).loader(cache=cache, **OPTIONS))) \\
                else "WRONG"
        except FeedlineError:
            outcome = "error"
        if outcome == "WRONG":
            bad.append([k, how, cache])
        counts[outcome] = counts.get(outcome, 0) + 1
        if verify is not None:
            try:
                verify(case)
                counts["verify passed"] = counts.get("verify passed", 0) + 1
                bad.append([k, how, "verify passed"])
            except fl.IntegrityError:
                counts["verify caught"] = counts.get("verify caught", 0) + 1
        shutil.rmtree(case)
    return {"counts": counts, "bad": bad[:20]}
"""


@pytest.mark.timeout(200)
def test_fuzzing_a_written_dataset_of_list_tensors_gives_right_data_or_feedline_errors() -> None:
    """Byte flips and cuts of a feedline dataset's shard, read through the loader (memory and
    streaming, shapes= and ragged=): every read gives the right values or a FeedlineError
    (the manifest's footer digest and size, the pages' CRC-32), never a raw exception, a hang
    or a wrong value; and ``fl.verify`` (the shards' sha256) catches every damage."""
    body = (
        _DATA
        + """
original = tempfile.mkdtemp() + "/ds"
fl.from_arrow(table).write(original, row_group_rows=20)
assert right(list(fl.open(original).loader(**OPTIONS)))
return fuzz(original, fl.open, cases=1500, seconds=45, seed=23, verify=fl.verify)
"""
    )
    result = run_limited(body, memory=3 << 30, timeout=180)
    assert result.kind == "ok", (result.kind, result.error, result.message[-2000:])
    counts, bad = result.value["counts"], result.value["bad"]
    assert bad == [] and "WRONG" not in counts, counts
    assert counts["cases"] >= 100 and counts["error"] > 0 and counts["right"] > 0, counts
    assert counts["verify caught"] == counts["cases"], counts


@pytest.mark.timeout(200)
@pytest.mark.parametrize("checksums", [True, False], ids=["page-crc", "no-crc"])
def test_fuzzing_a_plain_parquet_file_of_list_tensors_raises_no_raw_error(checksums) -> None:
    """The same damage to a plain Parquet file (no manifest). With page checksums (pyarrow's
    and Spark's ``write_page_checksum``) every read is right or a FeedlineError, as above;
    without them a flipped value in a page is undetectable by anyone (it decodes to another
    value), so only that check is waived: still no raw exception, crash or hang."""
    body = (
        _DATA
        + f"""
original = tempfile.mkdtemp()
pq.write_table(table, original + "/part-0.parquet", row_group_size=20,
               write_page_checksum={checksums})
return fuzz(original, fl.read_parquet, cases=1500, seconds=45, seed=24)
"""
    )
    result = run_limited(body, memory=3 << 30, timeout=180)
    assert result.kind == "ok", (result.kind, result.error, result.message[-2000:])
    counts = result.value["counts"]
    assert counts["cases"] >= 100 and counts["error"] > 0 and counts["right"] > 0, counts
    if checksums:
        assert "WRONG" not in counts, result.value


@pytest.mark.timeout(120)
def test_an_undefined_codec_in_a_plain_parquet_footer_is_a_data_error() -> None:
    """Found by the fuzz pass: a plain Parquet footer whose column chunk's codec is not one
    Parquet defines made pyarrow abort the whole process (``std::terminate``) when the loader
    read the chunk; it is refused with a DataError naming the file (feedline.store.footers)."""
    body = """
import io, tempfile
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
folder = tempfile.mkdtemp()
path = folder + "/part-0.parquet"
rows = [[1, 2], [3, 4]]
pq.write_table(pa.table({"id": [0, 1], "v": pa.array(rows, pa.list_(pa.int32()))}), path)
data = bytes(open(path, "rb").read())
start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")

def codecs(blob):
    try:
        meta = pq.ParquetFile(io.BytesIO(blob)).metadata
    except OSError:  # not a codec field: the change broke the footer
        return []
    return [meta.row_group(0).column(j).compression for j in range(meta.num_columns)]

for at in range(start, len(data) - 9):  # a codec field: i32 (0x15), SNAPPY (zigzag 2)
    gzip = data[: at + 1] + b"\\x04" + data[at + 2 :]  # GZIP, as pyarrow must then say
    if data[at : at + 2] == b"\\x15\\x02" and codecs(gzip).count("GZIP") == 1:
        break
else:
    raise AssertionError("no codec field found")
open(path, "wb").write(data[: at + 1] + b"\\x7f" + data[at + 2 :])  # codec -64
loader = fl.read_parquet(folder).loader(batch_size=2, shuffle=False, format="numpy",
                                        shapes={"v": (2,)})
return [b["v"].tolist() for b in loader]
"""
    result = run_limited(body, memory=3 << 30, timeout=100)
    assert (result.kind, result.error) == ("feedline", "DataError"), (result.kind, result.stderr)
    assert "codec is -64" in result.message and "part-0.parquet" in result.message
