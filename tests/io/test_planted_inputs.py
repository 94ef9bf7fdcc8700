"""Input folders with a FIFO or device planted among the data files (issue 23, item 12).

Reading a FIFO blocks forever and a device streams without end: the readers refuse both
with a DataError naming the file, and the tests carry a timeout so a regression fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.errors import DataError, FormatError


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader, suffix", [("parquet", ".parquet"), ("csv", ".csv")])
def test_a_fifo_in_an_input_folder_is_refused_not_waited_on(
    tmp_path: Path, reader: str, suffix: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    if reader == "parquet":
        pq.write_table(pa.table({"a": [1, 2]}), folder / "a.parquet")
    else:
        (folder / "a.csv").write_text("a\n1\n2\n")
    os.mkfifo(folder / f"b{suffix}")
    read = fl.read_parquet if reader == "parquet" else fl.read_csv
    with pytest.raises(DataError, match=r"b\.(parquet|csv)' is a FIFO"):
        read(str(folder)).to_arrow()


@pytest.mark.timeout(60)
def test_a_device_named_explicitly_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="character device"):
        fl.read_csv("/dev/zero").to_arrow()


@pytest.mark.timeout(60)
def test_a_manifest_that_is_a_symlink_loop_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "ds"
    fl.from_arrow(pa.table({"a": [1, 2]})).write(str(path))
    manifest = path / "_feedline.json"
    manifest.unlink()
    manifest.symlink_to(manifest)
    with pytest.raises(FormatError, match="symbolic link loop"):
        fl.open(str(path))
