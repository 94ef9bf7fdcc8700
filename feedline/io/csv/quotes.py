"""Unterminated quotes in CSV files: spotting them, and reading a file around them.

pyarrow's parser lets a quoted value run over line ends even with ``newlines_in_values``
off. When a closing quote is missing, the value swallows the lines after it, up to the end
of the file (or the parser loses step with its line chunker and stops). With
``newlines_in_values=False`` every record is one line, so a parsed value holding a line
break, or an invalid row whose text holds one, means that a quote was left open. The file
is then read again line by line: a line that ends inside a quote is reported (or skipped)
and the other lines are parsed as usual, so no record is swallowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from feedline.errors import DataError
from feedline.io.csv.files import read_error

__all__ = [
    "OpenQuote",
    "QuoteScanner",
    "RowLog",
    "first_line_break",
    "has_line_break",
    "last_record_check",
    "line_chunks",
    "lost_step",
    "read_lines",
]

_BATCH_ROWS = 64 * 1024
_QUOTE_FIX = 'close the quote (a quote inside a quoted value is written "")'


class OpenQuote(Exception):
    """Internal signal: a quote was left open around data row ``row``; read again by line."""

    def __init__(self, row: int) -> None:
        super().__init__(row)
        self.row = row


class RowLog:
    """Rows the parser skipped during one read, kept until the read ends (a re-read around
    an open quote replaces them), and whether an invalid row held a line break.

    Examples
    --------
    >>> log = RowLog(None, "a.csv", line_offset=10)
    >>> log.add(2, "expected 2 fields, got 1")
    >>> log.rows
    [('a.csv:12', 'expected 2 fields, got 1')]
    """

    def __init__(self, report: Any, where: str, line_offset: int = 0) -> None:
        self.report, self.where, self.line_offset = report, where, line_offset
        self.rows: list[tuple[str, str]] = []
        self.broken = False

    def add(self, number: int | None, reason: str) -> None:
        """Note a skipped row (``number``: its line in the parsed text, if known)."""
        where = self.where if number is None else f"{self.where}:{number + self.line_offset}"
        self.rows.append((where, reason))

    def flush(self) -> None:
        """Count the noted rows in the execution report."""
        if self.report is not None:
            for where, reason in self.rows:
                self.report.record_skip(where, reason)
        self.rows = []


def lost_step(exc: BaseException, log: RowLog) -> bool:
    """True when pyarrow failed because a quoted value ran over line ends."""
    return log.broken or "out of sync with chunker" in str(exc)


_TEXT_TYPES = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def has_line_break(text: str | bytes | None) -> bool:
    """True when ``text`` holds a CR or LF.

    Examples
    --------
    >>> has_line_break("a,b"), has_line_break('"a\\nb,c'), has_line_break(None)
    (False, True, False)
    """
    if not text:
        return False
    if isinstance(text, str):
        return "\n" in text or "\r" in text
    return b"\n" in text or b"\r" in text


def first_line_break(batch: pa.RecordBatch) -> int | None:
    """The first row of ``batch`` with a CR or LF in a text column, or ``None``.

    The values' bytes are searched at once (``bytes.find``); only a column that holds a
    line break is searched row by row.

    Examples
    --------
    >>> first_line_break(pa.record_batch({"n": [1, 2], "s": ["a", "b\\nc"]}))
    1
    >>> first_line_break(pa.record_batch({"s": ["a", None, ""]})) is None
    True
    """
    first: int | None = None
    for column in batch.columns:
        if not any(check(column.type) for check in _TEXT_TYPES) or not _has_break(column):
            continue
        for row, value in enumerate(column.to_pylist()):
            if has_line_break(value):
                first = row if first is None else min(first, row)
                break
    return first


def _has_break(column: pa.Array) -> bool:
    offsets_buffer, data = column.buffers()[1:3]
    if data is None or len(column) == 0:
        return False
    width = (
        8 if pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type) else 4
    )
    view = memoryview(offsets_buffer).cast("B")
    start = int.from_bytes(view[column.offset * width : (column.offset + 1) * width], "little")
    stop_at = (column.offset + len(column)) * width
    stop = int.from_bytes(view[stop_at : stop_at + width], "little")
    values = memoryview(data)[start:stop].tobytes()
    return values.find(b"\n") >= 0 or values.find(b"\r") >= 0


class QuoteScanner:
    """Tells whether a CSV line ends inside a quoted field, by pyarrow's rules.

    A quote opens a field only at its start; inside it, ``""`` is a quote and a lone ``"``
    closes it; after the closing quote, characters up to the delimiter are kept as they are.

    Examples
    --------
    >>> scan = QuoteScanner(",")
    >>> [scan.is_open(line) for line in (b'1,"a,b",c', b'5"x,y', b'2,"oops', b'"a""')]
    [False, False, True, True]
    """

    def __init__(self, delimiter: str, quote: str = '"') -> None:
        d, q = re.escape(delimiter.encode()), re.escape(quote.encode())
        # a quoted field: quote, (non-quote | doubled quote)*, a lone closing quote, the rest
        quoted = q + rb"(?:[^" + q + rb"]|" + q + q + rb")*" + q + rb"(?!" + q + rb")"
        quoted += rb"[^" + d + rb"]*"
        plain = rb"[^" + q + d + rb"][^" + d + rb"]*"
        field = rb"(?:" + quoted + rb"|" + plain + rb")?"
        self._closed = re.compile(field + rb"(?:" + d + field + rb")*")
        self._quote = quote.encode()

    def is_open(self, line: bytes) -> bool:
        """True when ``line`` (without or with its line end) ends inside a quoted field."""
        line = line.rstrip(b"\r\n")
        return self._quote in line and self._closed.fullmatch(line) is None


def line_chunks(
    lines: Iterable[bytes],
    scanner: QuoteScanner,
    on_open: Callable[[int, bytes], None],
    chunk_bytes: int,
    first_number: int = 1,
) -> Iterator[tuple[int, bytes]]:
    """Runs of consecutive lines that close their quotes, as ``(first line number, bytes)``.

    ``on_open(number, line)`` is called for each line left inside a quote (it may raise);
    that line is left out. A run ends before an open line or after about ``chunk_bytes``.

    Examples
    --------
    >>> bad = []
    >>> lines = [b"1,x\\n", b'2,"oops\\n', b"3,y\\n"]
    >>> list(line_chunks(lines, QuoteScanner(","), lambda n, _: bad.append(n), 1 << 20))
    [(1, b'1,x\\n'), (3, b'3,y\\n')]
    >>> bad
    [2]
    """
    run: list[bytes] = []
    size = 0
    start = first_number
    for number, line in enumerate(lines, first_number):
        if scanner.is_open(line):
            if run:
                yield start, b"".join(run)
                run, size = [], 0
            on_open(number, line)
            continue
        if not run:
            start = number
        if not line.endswith((b"\n", b"\r")):
            line += b"\n"
        run.append(line)
        size += len(line)
        if size >= chunk_bytes:
            yield start, b"".join(run)
            run, size = [], 0
    if run:
        yield start, b"".join(run)


def read_lines(
    lines: Iterator[bytes],
    first_number: int,
    *,
    where: str,
    delimiter: str,
    on_error: str,
    read_options: pacsv.ReadOptions,
    parse_options: Callable[[RowLog], pacsv.ParseOptions],
    convert_options: pacsv.ConvertOptions,
    report: Any,
    skip_rows: int,
    approx_row: int,
) -> Iterator[pa.RecordBatch]:
    """Parse ``lines`` (numbered from ``first_number``) without those that leave a quote open.

    An open line raises a :class:`DataError` naming ``where`` and the line with
    ``on_error="raise"``; with ``"skip"`` it is counted in ``report`` and left out. The first
    ``skip_rows`` rows (already delivered by the fast path) are not yielded again.
    """
    found = []

    def on_open(number: int, line: bytes) -> None:
        found.append(number)
        if on_error == "raise":
            raise _quote_error(where, number, line)
        reason = "unterminated quote: a quoted field opened on this line never closes"
        report.record_skip(f"{where}:{number}", reason)

    chunks = line_chunks(
        lines, QuoteScanner(delimiter), on_open, read_options.block_size, first_number
    )
    for start, chunk in chunks:
        log = RowLog(report, where, line_offset=start - 1)
        try:
            table = pacsv.read_csv(
                pa.BufferReader(chunk),
                read_options=read_options,
                parse_options=parse_options(log),
                convert_options=convert_options,
            )
        except pa.ArrowInvalid as exc:
            raise read_error(exc, where, f"lines {start} and after") from exc
        log.flush()
        for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
            if skip_rows >= batch.num_rows:
                skip_rows -= batch.num_rows
                continue
            batch, skip_rows = batch.slice(skip_rows), 0
            yield batch
    if not found and on_error == "raise":
        raise DataError(
            f"The CSV file {where!r} has a value spanning several lines around data row "
            f"{approx_row + 1}, but newlines_in_values is off. Fix: {_QUOTE_FIX}, or pass "
            "newlines_in_values=True if quoted values really span lines."
        )


def _quote_error(where: str, number: int, line: bytes) -> DataError:
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    snippet = text if len(text) <= 80 else text[:77] + "..."
    return DataError(
        f"The CSV file {where!r} has an unterminated quote on line {number} ({snippet!r}): the "
        "quoted field opened there never closes, so it would swallow the lines after it into "
        f"one value. Fix: {_QUOTE_FIX}, pass on_error='skip' to drop that line, or "
        "newlines_in_values=True if quoted values really span lines."
    )


def last_record_check(
    batch: pa.RecordBatch, where: str, done: int, log: RowLog, on_error: str
) -> pa.RecordBatch:
    """For ``newlines_in_values=True``: ``batch`` (a file's last) without its last record
    when a quoted field there runs to the end of the file (its value swallowed the final
    line end); with ``on_error="raise"``, a :class:`DataError` naming the row instead.

    Examples
    --------
    >>> b = pa.record_batch({"s": ["a\\nb", "open\\n3,y\\n"]})
    >>> log = RowLog(None, "f.csv")
    >>> last_record_check(b, "f.csv", 0, log, "skip").num_rows, log.rows
    (1, [('f.csv', 'data row 2: an unterminated quote runs to the end of the file')])
    """
    if not batch.num_rows or first_line_break(batch.slice(batch.num_rows - 1)) is None:
        return batch
    last = batch.slice(batch.num_rows - 1).to_pylist()[0]
    if not any(isinstance(v, str) and v.endswith(("\n", "\r")) for v in last.values()):
        return batch
    row = done + batch.num_rows
    if on_error == "raise":
        raise DataError(
            f"The CSV file {where!r} ends inside a quoted field: the quote opened in data row "
            f"{row} (the last record) never closes, so it swallowed the rest of the file. "
            f"Fix: {_QUOTE_FIX}, or pass on_error='skip' to drop that record."
        )
    log.add(None, f"data row {row}: an unterminated quote runs to the end of the file")
    return batch.slice(0, batch.num_rows - 1)
