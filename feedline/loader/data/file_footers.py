"""Footers of the files a cache fill reads: parsed and checked once per file, not per row group.

Every read of a shard checks that the file it opened is the one its manifest entry describes
(:func:`feedline.store.footers.check_footer`: size, footer sha256, row-group sizes). A cache fill
opens a file once per row group, from several threads, and parsing a footer takes time in
proportion to the file's row groups, so checking the footer on every open made a fill
quadratic in them (1M rows in one shard, 2 columns: 0.12 s in 100 row groups, 4.4 s in
1,000). Here a file's footer is read, parsed and checked the first time the fill opens it;
every later open of the same path compares the open file's identity (``fstat``: device,
inode, size, modification and change times) with the one checked, and reads, parses and
checks the footer again whenever it differs (the file was replaced or written to since).
So a file swapped in the middle of a fill is still refused, at the next row group read.

Examples
--------
>>> import feedline as fl, os, tempfile
>>> from feedline.store.shard_source import open_shard_source
>>> out = tempfile.mkdtemp() + "/ds"
>>> _ = fl.range(10).write(out, row_group_rows=2)
>>> source = open_shard_source(out)
>>> footers = FileFooters(source)
>>> path = source.files[0].path
>>> for _ in range(5):  # five row groups read: one parse
...     fd = os.open(path, os.O_RDONLY)
...     rows = footers.footer(0, fd, path).metadata.num_rows
...     os.close(fd)
>>> rows, footers.parses
(10, 1)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from feedline.errors import IntegrityError, StorageError
from feedline.io.storage.local_files import open_regular
from feedline.store.footers import Footer, check_footer, parse_footer, read_footer_block

if TYPE_CHECKING:
    from feedline.store.shard_source import ShardSource

__all__ = ["FileFooters", "Identity"]

#: what ``fstat`` says of an open file that changes when it is replaced or written to
Identity = tuple[int, int, int, int, int]


class FileFooters:
    """The checked footers of a :class:`ShardSource`'s local files, one parse per file.

    Thread-safe. ``parses`` counts the footers read and parsed (at most one per file and
    path, plus one per change of a file during the fill).
    """

    def __init__(self, source: ShardSource) -> None:
        self.source = source
        self.parses = 0
        self._lock = threading.Lock()
        self._known: dict[tuple[int, str], tuple[Identity, Footer]] = {}

    def footer(self, file: int, fd: int, path: str) -> Footer:
        """The footer of file ``file`` of the source, open as ``fd`` (from ``path``: the
        file itself or its copy in a shard cache), checked against its manifest entry.

        Raises :class:`~feedline.errors.IntegrityError` (another file than the manifest
        describes) or :class:`~feedline.errors.DataError` (no Parquet footer) naming it;
        ``OSError`` passes through.
        """
        stat = os.fstat(fd)
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        key = (file, path)
        with self._lock:  # threads opening the same file wait for its one parse
            known = self._known.get(key)
            if known is not None and known[0] == identity:
                return known[1]
            where = repr(self.source.files[file].url)
            block = read_footer_block(lambda at, n: os.pread(fd, n, at), stat.st_size, where)
            footer = parse_footer(block, stat.st_size, where)
            self.parses += 1
            if self.source.shards:
                shard, stored = self.source.shards[file], self.source.stored_schema
                check_footer(footer, shard, where, stored)
            self._known[key] = (identity, footer)
            return footer

    @contextlib.contextmanager
    def open(self, file: int, path: str) -> Iterator[tuple[int, Footer] | None]:
        """File ``file`` open at ``path`` as ``(descriptor, checked footer)``, closed after;
        ``None`` when it cannot be opened or read (the caller reads it through pyarrow,
        which names the problem). A footer that is not the manifest's raises, and so does a
        path that is not a regular file (a FIFO planted as a shard would block forever)."""
        try:
            handle = open_regular(path, what="the shard", error=IntegrityError)
        except (OSError, StorageError):
            yield None
            return
        with handle:
            fd = handle.fileno()
            try:
                footer = self.footer(file, fd, path)
            except OSError:
                footer = None
            yield None if footer is None else (fd, footer)
