"""Writing rows as a new version of a Lance dataset, through ``lance.write_dataset``.

lance writes the fragments and commits the version; feedline hands it the plan's batches as
one Arrow stream and puts the write's lineage in the transaction's properties
(``feedline.lineage``, shown by ``dataset.read_transaction(version)``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from feedline.errors import FormatError
from feedline.io.lakehouse.delta_writer import TableWrite
from feedline.io.lakehouse.lance import lance_library
from feedline.io.lakehouse.table_writes import (
    CountedStream,
    check_append_schema,
    check_mode,
    library_options,
    refuse_existing,
)

__all__ = ["write_lance_dataset"]

#: lance's own name for each of feedline's table write modes
_LANCE_MODES = {"error": "create", "append": "append", "overwrite": "overwrite"}


def write_lance_dataset(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    path: str | os.PathLike[str],
    *,
    mode: str = "error",
    storage_options: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
) -> TableWrite:
    """Write ``batches`` (of ``schema``) as a new version of the Lance dataset at ``path``
    (``mode`` as in :func:`~feedline.io.lakehouse.delta_writer.write_delta_table`).

    Examples
    --------
    >>> import tempfile
    >>> batch = pa.record_batch({"x": [1, 2, 3]})
    >>> root = tempfile.mkdtemp() + "/t.lance"
    >>> write_lance_dataset([batch], batch.schema, root).version
    1
    >>> write_lance_dataset([batch], batch.schema, root, mode="append").rows
    3
    """
    lance = lance_library("Dataset.write_lance")
    check_mode(mode, "write_lance")
    url = os.fspath(path)
    options = library_options(storage_options)
    where = f"the Lance dataset {url!r}"
    before = _existing(lance, url, options)
    if before is not None and mode == "error":
        refuse_existing(where, before.version)
    if before is not None and mode == "append":
        check_append_schema(before.schema, schema, where)
        schema = pa.schema([schema.field(name) for name in before.schema.names])
    known = _fragment_ids(before) if before is not None and mode == "append" else set()
    stream = CountedStream(schema, batches)
    properties = {"feedline.lineage": json.dumps(lineage, sort_keys=True)} if lineage else None
    try:
        after = lance.write_dataset(
            stream.reader(),
            url,
            mode=_LANCE_MODES[mode] if before is not None else "create",
            storage_options=options,
            transaction_properties=properties,
        )
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise FormatError(
            f"Cannot write {where}: {exc}. Fix: check the path and that the columns' types "
            "are ones Lance stores."
        ) from exc
    added = [f for f in after.get_fragments() if int(f.fragment_id) not in known]
    return TableWrite(
        version=int(after.version),
        rows=stream.rows,
        files=len(added),
        bytes=sum(int(d.file_size_bytes or 0) for f in added for d in f.metadata.files),
    )


def _existing(lance: Any, url: str, options: dict[str, str] | None) -> Any:
    """The Lance dataset at ``url``, or ``None`` when there is none."""
    try:
        return lance.dataset(url, storage_options=options)
    except (OSError, ValueError):
        return None


def _fragment_ids(dataset: Any) -> set[int]:
    return {int(f.fragment_id) for f in dataset.get_fragments()}
