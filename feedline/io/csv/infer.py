"""Inferring the column types of a CSV file from samples: its start and windows across it.

pyarrow infers types from the block it parses first. feedline parses the first
:data:`PREFIX_BYTES` of the file and up to :data:`WINDOWS` windows of :data:`WINDOW_BYTES`
spread over the rest, and unifies what each sample says (``int64`` and ``double`` give
``double``; a column empty in one sample takes the others' type; disagreeing kinds give
``string``). That costs a few MB of parsing instead of a 16 MB block, and sees values that
appear late in the file. Gzipped files (no seeking) and files whose quoted values span lines
(a window could start inside one) are inferred from their first block only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from feedline.io.csv.files import (
    READ_ERRORS,
    data_lines,
    first_block,
    header_of,
    line_start,
    open_file,
    read_error,
)
from feedline.io.csv.quotes import QuoteScanner, RowLog, first_line_break, line_chunks, lost_step
from feedline.io.storage.paths import Location

__all__ = ["PREFIX_BYTES", "WINDOWS", "WINDOW_BYTES", "infer_schema", "unify_types"]

#: bytes parsed from the start of a file that is sampled
PREFIX_BYTES = 1 << 20
#: at most this many windows, of this many bytes, spread over the rest of the file
WINDOWS = 8
WINDOW_BYTES = 256 << 10


def infer_schema(
    loc: Location,
    *,
    block_size: int,
    delimiter: str,
    newlines_in_values: bool,
    read_options: Callable[..., pacsv.ReadOptions],
    parse_options: Callable[[RowLog, bool], pacsv.ParseOptions],
    convert_options: pacsv.ConvertOptions,
) -> pa.Schema:
    """The schema of the CSV file ``loc`` (see the module docstring).

    ``parse_options(log, lenient)`` gives the source's parse options (``lenient`` skips
    every invalid row); the first sample follows the source's ``on_error``.
    """
    sampled = not newlines_in_values and not loc.path.endswith(".gz")
    size = loc.fs.size(loc.path) if sampled else 0
    sampled = sampled and size > block_size
    try:
        with open_file(loc) as handle:
            data = first_block(handle, PREFIX_BYTES if sampled else block_size)
            windows = _windows(handle, len(data), size) if sampled else []
    except READ_ERRORS as exc:
        raise read_error(exc, loc.url, "its first block") from exc

    def parse(
        sample: bytes, names: list[str] | None, lenient: bool, quotes: bool = True
    ) -> pa.Table | None:
        """The sample parsed, or ``None`` when a quote left open spoils it (if ``quotes``)."""
        log = RowLog(None, loc.url)
        options = read_options() if names is None else read_options(column_names=names)
        try:
            table = pacsv.read_csv(
                pa.BufferReader(sample),
                read_options=options,
                parse_options=parse_options(log, lenient or newlines_in_values),
                convert_options=convert_options,
            )
        except pa.ArrowInvalid as exc:
            if newlines_in_values or not lost_step(exc, log):
                raise read_error(exc, loc.url, "a sample of its rows") from exc
            return None
        broken = log.broken or any(first_line_break(b) is not None for b in table.to_batches())
        return None if broken and quotes and not newlines_in_values else table

    first = parse(data, None, lenient=False)
    if first is None:  # the first block leaves a quote open: infer from its other lines
        names = header_of(data, delimiter)
        lines = data_lines(iter(data.splitlines(keepends=True)))
        chunks = line_chunks(lines, QuoteScanner(delimiter), lambda *_: None, len(data))
        first = parse(next(chunks, (0, b""))[1], names, lenient=True, quotes=False)
    assert first is not None  # for type checkers: parse(quotes=False) returns a table
    schemas = [first.schema]
    for window in windows:
        table = parse(window, first.schema.names, lenient=True)
        if table is not None and table.num_columns == first.num_columns:
            schemas.append(table.schema)
    if len(schemas) == 1:
        return first.schema
    return pa.schema(
        [
            pa.field(name, unify_types([s.field(i).type for s in schemas]))
            for i, name in enumerate(first.schema.names)
        ]
    )


def _windows(handle: Any, start: int, size: int) -> list[bytes]:
    """Up to :data:`WINDOWS` runs of whole lines spread over ``[start, size)``."""
    count = min(WINDOWS, max(0, (size - start) // (4 * WINDOW_BYTES)))
    windows = []
    for i in range(1, count + 1):
        begin = line_start(handle, start + (size - start) * i // (count + 1))
        handle.seek(begin)
        window = handle.read(WINDOW_BYTES)
        cut = window.rfind(b"\n")
        if cut > 0:
            windows.append(window[: cut + 1])
    return windows


def unify_types(types: list[pa.DataType]) -> pa.DataType:
    """One type that holds the values every sample's inferred type holds.

    Examples
    --------
    >>> unify_types([pa.int64(), pa.null(), pa.float64()])
    DataType(double)
    >>> unify_types([pa.int64(), pa.string()]), unify_types([pa.null(), pa.null()])
    (DataType(string), DataType(null))
    >>> unify_types([pa.timestamp("s"), pa.timestamp("ns")])
    TimestampType(timestamp[ns])
    """
    kinds = [t for t in types if not pa.types.is_null(t)]
    if not kinds:
        return pa.null()
    if all(t == kinds[0] for t in kinds):
        return kinds[0]
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in kinds):
        return pa.float64()
    if all(pa.types.is_timestamp(t) and t.tz == kinds[0].tz for t in kinds):
        finest = max(kinds, key=lambda t: ["s", "ms", "us", "ns"].index(t.unit))
        return finest
    if any(pa.types.is_binary(t) for t in kinds):
        return pa.binary()
    return pa.string()
