"""Large cache arrays: anonymous memory whose pages the kernel populates row range by range."""

from __future__ import annotations

import mmap
import platform
import re
import sys

import numpy as np
import pytest

from feedline.loader.data.bulk_arrays import LARGE, empty, prefault


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def test_small_arrays_are_plain_numpy_arrays() -> None:
    a = empty((10, 3), np.float32)
    assert a.shape == (10, 3) and a.dtype == np.float32 and a.base is None
    prefault(a, 0, 10)  # nothing to do


def _kernel() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(found[1]), int(found[2])) if found else (0, 0)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _kernel() < (5, 14),
    reason="MADV_POPULATE_WRITE needs Linux 5.14",
)
def test_prefault_populates_exactly_the_rows_asked_for() -> None:
    rows, width = 4 * LARGE // 4096, 4096
    a = empty((rows, width), np.uint8)
    before = rss()
    prefault(a, rows // 4, rows // 2)  # a quarter of the array: LARGE bytes
    grown = rss() - before
    assert 0.9 * LARGE <= grown <= 1.1 * LARGE
    a[:] = 7  # still an ordinary writable array
    assert int(a[rows - 1, width - 1]) == 7
