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
