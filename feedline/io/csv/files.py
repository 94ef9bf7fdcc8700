"""The bytes of CSV files: opening (gzip too), the first block, byte ranges cut at line
starts, header names, and the error for a damaged or truncated file."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from feedline.errors import DataError
from feedline.io.storage.paths import Location

__all__ = [
    "READ_ERRORS",
    "data_lines",
    "first_block",
    "header_of",
    "line_start",
    "open_file",
    "read_error",
    "read_line_range",
]

#: what a damaged file raises while it is decompressed or parsed
READ_ERRORS = (pa.ArrowInvalid, EOFError, zlib.error, gzip.BadGzipFile)


def read_error(exc: BaseException, where: str, at: str) -> DataError:
    """The :class:`DataError` for a CSV file that cannot be decompressed or parsed.

    Examples
    --------
    >>> print(read_error(EOFError("ended early"), "a.csv.gz", "its first block"))
    Cannot decompress the CSV file 'a.csv.gz' (its first block): EOFError: ended early. ...
    """
    if isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile):
        return DataError(
            f"Cannot decompress the CSV file {where!r} ({at}): {type(exc).__name__}: {exc}. The "
            "gzip data is damaged or truncated. Fix: restore or re-compress the file (`gzip -t` "
            "checks it), or leave it out of the input."
        )
    return DataError(
        f"Cannot parse the CSV file {where!r} ({at}): {exc}. Fix: correct the file, pass "
        "schema=/column_types= with wider types, newlines_in_values=True when quoted values "
        "span lines, or on_error='skip' for rows with a wrong number of fields."
    )


def first_block(handle: Any, size: int) -> bytes:
    """About ``size`` bytes from the start of a file, ending at a line end.

    Examples
    --------
    >>> import io
    >>> first_block(io.BytesIO(b"a,b\\n1,2\\n3,4\\n"), 9)
    b'a,b\\n1,2\\n'
    """
    data = handle.read(size)
    if len(data) < size:
        return data
    cut = data.rfind(b"\n")
    return data + handle.readline() if cut < 0 else data[: cut + 1]


def header_of(data: bytes, delimiter: str) -> list[str]:
    """The column names on the first line of ``data``."""
    first = next(iter(data.splitlines(keepends=True)), b"")
    parse = pacsv.ParseOptions(delimiter=delimiter)
    return pacsv.read_csv(pa.BufferReader(first), parse_options=parse).column_names


def data_lines(handle: Any) -> Iterator[bytes]:
    """The lines of an open CSV file after its header (blank lines before it skipped)."""
    lines = iter(handle)
    for line in lines:
        if line.strip(b"\r\n"):
            break
    yield from lines


def read_line_range(
    loc: Location, start: int, end: int, delimiter: str = ","
) -> tuple[list[str], pa.Buffer | None]:
    """The header names and the bytes of the lines that *start* in ``[start, end)``.

    Line 0 (the header) is excluded. Returns ``None`` data when no line starts in the range.
    """
    with loc.fs.open(loc.path, "rb") as handle:
        first = handle.readline()
        parse = pacsv.ParseOptions(delimiter=delimiter)
        names = pacsv.read_csv(pa.BufferReader(first), parse_options=parse).column_names
        begin = line_start(handle, max(start, len(first)))
        if begin >= end:
            return names, None
        stop = line_start(handle, end)
        handle.seek(begin)
        return names, pa.py_buffer(handle.read(stop - begin))


def line_start(handle: Any, position: int) -> int:
    """The offset of the first line that starts at or after ``position`` (or the end).

    Examples
    --------
    >>> import io
    >>> [line_start(io.BytesIO(b"ab\\ncd\\n"), p) for p in (0, 1, 3, 4, 6)]
    [0, 3, 3, 6, 6]
    """
    if position <= 0:
        return 0
    handle.seek(position - 1)
    if handle.read(1) != b"\n":
        handle.readline()
    return handle.tell()


def open_file(loc: Location) -> Any:
    """``loc`` opened for binary reading, decompressed when its name ends with ``.gz``."""
    compression = "gzip" if loc.path.endswith(".gz") else None
    return loc.fs.open(loc.path, "rb", compression=compression)
