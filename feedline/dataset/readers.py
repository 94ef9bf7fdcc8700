"""Constructors of datasets: files, folders, URLs, ``range`` and ``open``.

The constructors over in-memory data (``from_arrow``, ``from_dict``, ``from_pandas`` …)
live in :mod:`feedline.dataset.from_memory` and are re-exported here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from feedline.dataset.dataset import Dataset
from feedline.io.csv.reader import CsvSource
from feedline.io.image_folders import ImageFolderSource
from feedline.io.jsonl import JsonlSource
from feedline.io.lakehouse.delta import delta_source
from feedline.io.lakehouse.iceberg import iceberg_source
from feedline.io.lakehouse.lance import LanceSource
from feedline.io.memory import RangeSource
from feedline.io.parquet import ParquetSource
from feedline.io.petastorm.reader import PetastormSource
from feedline.io.text_files import TextSource
from feedline.io.tfrecord.reader import TfRecordSource
from feedline.io.webdataset.reader import WebDatasetSource
from feedline.store.dataset_files import open_source

if TYPE_CHECKING:
    pass

__all__ = [
    "open",
    "range",
    "read_csv",
    "read_delta",
    "read_iceberg",
    "read_images",
    "read_jsonl",
    "read_lance",
    "read_parquet",
    "read_petastorm",
    "read_text",
    "read_tfrecord",
    "read_webdataset",
]

PathsLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def read_parquet(
    paths: PathsLike,
    columns: Sequence[str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read Parquet files, folders, globs or URLs.

    Paths may be local or any fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``…);
    ``storage_options`` go to the fsspec backend, and their reserved key ``"retry"`` takes a
    :class:`~feedline.io.storage.retry.RetryPolicy` for transient faults (see
    :mod:`feedline.io.storage.paths`). The other readers, ``open`` and ``Dataset.write`` take
    the same.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, pyarrow.parquet as pq, tempfile
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> pq.write_table(pa.table({"x": [1, 2]}), path)
    >>> fl.read_parquet(path).count()
    2
    """
    ds = Dataset.from_source(ParquetSource(paths, storage_options=storage_options))
    return ds.select(columns) if columns is not None else ds


def read_csv(
    paths: PathsLike,
    columns: Sequence[str] | None = None,
    *,
    schema: pa.Schema | None = None,
    column_types: Mapping[str, pa.DataType] | None = None,
    delimiter: str = ",",
    on_error: Literal["raise", "skip"] = "raise",
    null_values: Sequence[str] | None = None,
    strings_can_be_null: bool = False,
    newlines_in_values: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read CSV files (``.csv``, ``.tsv``, gzipped too) with a streaming parallel reader.

    Types are inferred from samples of the first file (its first MB and windows across it)
    unless ``schema`` or ``column_types`` say otherwise (a name in ``column_types`` that the
    file lacks is a :class:`~feedline.errors.SchemaError`). ``on_error="skip"`` drops rows
    with the wrong number of fields, and lines that leave a quote open, and counts them in
    the execution report; ``"raise"`` names the file and line.

    Nulls: by default pyarrow's spellings (``""``, ``NA``, ``N/A``, ``NULL``, ``null``,
    ``NaN``…) are null in every column but strings, where an empty field stays ``""``.
    ``strings_can_be_null=True`` makes them null in string columns too; ``null_values``
    replaces the spellings. ``newlines_in_values=True`` allows quoted values that span lines
    (files are then not split into byte ranges).

    Examples
    --------
    >>> import feedline as fl, pathlib, tempfile
    >>> path = tempfile.mkdtemp() + "/a.csv"
    >>> _ = pathlib.Path(path).write_text("x,y\\n1,a\\n2,b\\n")
    >>> fl.read_csv(path).to_arrow()["x"].to_pylist()
    [1, 2]
    >>> _ = pathlib.Path(path).write_text("x,y\\n1,\\n2,b\\n")
    >>> fl.read_csv(path).to_arrow()["y"].to_pylist()
    ['', 'b']
    >>> fl.read_csv(path, strings_can_be_null=True).to_arrow()["y"].to_pylist()
    [None, 'b']
    """
    source = CsvSource(
        paths,
        schema=schema,
        column_types=column_types,
        delimiter=delimiter,
        on_error=on_error,
        null_values=null_values,
        strings_can_be_null=strings_can_be_null,
        newlines_in_values=newlines_in_values,
        storage_options=storage_options,
    )
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def read_jsonl(
    paths: PathsLike,
    columns: Sequence[str] | None = None,
    *,
    schema: pa.Schema | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read newline-delimited JSON files.

    Examples
    --------
    >>> import feedline as fl, pathlib, tempfile
    >>> path = tempfile.mkdtemp() + "/a.jsonl"
    >>> _ = pathlib.Path(path).write_text('{"x": 1}\\n{"x": 2}\\n')
    >>> fl.read_jsonl(path).count()
    2
    """
    ds = Dataset.from_source(JsonlSource(paths, schema=schema, storage_options=storage_options))
    return ds.select(columns) if columns is not None else ds


def read_petastorm(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    on_error: Literal["raise", "skip"] = "raise",
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read a Petastorm dataset (a Parquet folder written through a Unischema), without
    Petastorm.

    The Unischema pickled in ``_common_metadata`` is read opcode by opcode and never
    unpickled (anything but a plain Unischema is refused, with a warning); without it, each
    binary column's codec is detected from its first value. ``NdarrayCodec``,
    ``CompressedNdarrayCodec`` and ``CompressedImageCodec`` (PNG/JPEG, decoded with Pillow)
    columns of a fixed shape become ``arrow.fixed_shape_tensor`` columns the loader turns into
    tensors; a ``None`` dimension gives nested lists; ``ScalarCodec`` columns take the field's
    dtype. ``on_error="skip"`` drops rows holding an undecodable value (counted in the
    execution report); ``"raise"`` names the file, row group, row and column. Parquet page
    checksums are verified and each row group's rows checked against the footer; a damaged file
    raises :class:`~feedline.errors.DataError`. A Unischema whose shapes are not positive sizes
    (or ``None``) holding at most 2**31 - 1 elements is refused like any other. Local paths and
    fsspec URLs; one read task per file. See :mod:`feedline.io.petastorm.reader`.

    Examples
    --------
    >>> import feedline as fl, io, numpy as np, pyarrow as pa, pyarrow.parquet as pq, tempfile
    >>> buf = io.BytesIO(); np.save(buf, np.eye(2, dtype=np.float32))
    >>> root = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"m": [buf.getvalue()] * 3}), root + "/part-0.parquet")
    >>> ds = fl.read_petastorm(root)  # no Unischema here: the codec is detected from the bytes
    >>> ds.schema().field("m").type
    FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=float, shape=[2,2]]>)
    """

    source = PetastormSource(path, on_error=on_error, storage_options=storage_options)
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def read_text(
    paths: PathsLike,
    *,
    per: Literal["line", "file"] = "line",
    encoding: str = "utf-8",
    include_paths: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read text files into a ``text`` column: one row per line (default) or per file.

    Examples
    --------
    >>> import feedline as fl, pathlib, tempfile
    >>> path = tempfile.mkdtemp() + "/a.txt"
    >>> _ = pathlib.Path(path).write_text("hello\\nworld\\n")
    >>> fl.read_text(path).to_arrow()["text"].to_pylist()
    ['hello', 'world']
    """
    return Dataset.from_source(
        TextSource(
            paths,
            per=per,
            encoding=encoding,
            include_paths=include_paths,
            storage_options=storage_options,
        )
    )


def read_tfrecord(
    paths: PathsLike,
    columns: Sequence[str] | None = None,
    *,
    features: Mapping[str, Any] | None = None,
    compression: Literal["GZIP", "ZLIB", "auto"] | None = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read TFRecord files of ``tf.train.Example`` records, without TensorFlow.

    ``features`` maps names to specs: ``fl.tfrecord.FixedLen(shape, dtype, default=None)``
    (a scalar or ``arrow.fixed_shape_tensor`` column; a numeric one also reads one raw
    ``bytes`` value per record, like ``tf.io.decode_raw``), ``fl.tfrecord.VarLen(dtype)`` (a
    list column) or a dtype string (a scalar). Without it the specs are inferred from the
    first ``fl.tfrecord.INFER_RECORDS`` (1000) records, and a later record that disagrees
    raises :class:`~feedline.errors.SchemaError`. Both CRCs of every record are checked, and
    its length against 2 GiB and the file's size before anything is read for it;
    corrupt, truncated and (with ``features=``) non-matching records raise
    :class:`~feedline.errors.DataError` naming the file, record and byte offset, or with
    ``on_error="skip"`` are dropped and counted. ``compression="auto"`` tells plain, GZIP
    and ZLIB files apart by their first bytes. One read task per file. See
    :mod:`feedline.io.tfrecord.reader`.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, tempfile
    >>> out = tempfile.mkdtemp() + "/tfr"
    >>> _ = fl.from_arrow(pa.table({"label": [0, 1], "tokens": [[5, 6], [7]]})).write_tfrecord(out)
    >>> fl.read_tfrecord(out).to_arrow().to_pylist()
    [{'label': 0, 'tokens': [5, 6]}, {'label': 1, 'tokens': [7]}]
    >>> spec = {"label": "uint8", "tokens": fl.tfrecord.VarLen("int32")}
    >>> fl.read_tfrecord(out, features=spec).schema().types
    [DataType(uint8), ListType(list<item: int32>)]
    """

    source = TfRecordSource(
        paths,
        features=features,
        compression=compression,
        on_error=on_error,
        storage_options=storage_options,
    )
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def read_images(
    paths: PathsLike,
    *,
    label: str | re.Pattern[str] | None = "parent",
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read a folder tree of image files into rows ``path``, ``label``, ``bytes``.

    ``label="parent"`` takes the name of the folder holding each file (``cats/1.jpg`` →
    ``cats``); a regular expression takes its first group from the relative path; ``None``
    omits the column. Decoding is done later by ``fl.DecodeImages``.

    Examples
    --------
    >>> import feedline as fl, os, pathlib, tempfile
    >>> root = tempfile.mkdtemp()
    >>> os.makedirs(root + "/cats")
    >>> _ = pathlib.Path(root + "/cats/1.png").write_bytes(b"not really a png")
    >>> fl.read_images(root).take(1)[0]["label"]
    'cats'
    """
    return Dataset.from_source(
        ImageFolderSource(paths, label=label, storage_options=storage_options)
    )


def read_webdataset(
    urls: PathsLike,
    columns: Sequence[str] | None = None,
    *,
    fields: Sequence[str] | Mapping[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    infer_samples: int = 1000,
    storage_options: dict[str, Any] | None = None,
    max_member_bytes: int = 1 << 30,
) -> Dataset:
    """Read WebDataset tar shards: one row per sample, one column per field.

    ``urls`` are shard paths or fsspec URLs, brace patterns (``train-{000000..000099}.tar``,
    expanded with the ``braceexpand`` package as WebDataset does, after counting the names: over
    a million is refused), globs or folders of
    ``.tar`` / ``.tar.gz`` / ``.tgz`` files; one read task per shard. Members sharing a key
    (``000123.jpg``, ``000123.cls``) form a sample; rows hold ``__key__``, ``__url__`` and a
    column per field. Images stay encoded (``binary``) for the loader's
    ``transform=fl.ImageTransform("jpg")``; ``cls``/``id``/``index`` are ``int64``,
    ``txt``/``text`` and ``json`` (the JSON text) are strings, anything else is ``binary``.
    ``fields=`` picks the fields and types (``["jpg", "cls"]`` or ``{"json": pa.struct(...)}``
    to parse JSON); by default they are found in the first ``infer_samples`` samples. A sample
    without a field has a null there. ``on_error="skip"`` drops samples whose members do not
    convert, and only the samples a damaged stretch of a shard touches (reading resumes at the
    next intact tar header; a ``.tar.gz`` whose gzip CRC fails is skipped whole), counting them
    in the execution report; ``"raise"`` names the shard, member and byte offset. A member
    claiming more than ``max_member_bytes`` (default 1 GiB) is refused from its header, before
    it is read. See :mod:`feedline.io.webdataset.reader`.

    Training: ``ds.loader(columns=["jpg", "cls"], transform=fl.ImageTransform("jpg"),
    num_workers=2)`` decodes and augments the images at load time (name the columns: the
    string columns ``__key__`` and ``__url__`` do not become tensors).

    Examples
    --------
    >>> import feedline as fl, io, tarfile, tempfile
    >>> path = tempfile.mkdtemp() + "/shard-0.tar"
    >>> with tarfile.open(path, "w") as tar:
    ...     for name, data in [("a.cls", b"1"), ("a.txt", b"hi"), ("b.cls", b"2")]:
    ...         info = tarfile.TarInfo(name); info.size = len(data)
    ...         tar.addfile(info, io.BytesIO(data))
    >>> fl.read_webdataset(path).to_arrow().select(["__key__", "cls", "txt"]).to_pylist()
    [{'__key__': 'a', 'cls': 1, 'txt': 'hi'}, {'__key__': 'b', 'cls': 2, 'txt': None}]
    """

    source = WebDatasetSource(
        urls,
        fields=fields,
        on_error=on_error,
        infer_samples=infer_samples,
        storage_options=storage_options,
        max_member_bytes=max_member_bytes,
    )
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def read_delta(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    version: int | None = None,
    as_of: datetime | str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read a Delta Lake table at its latest version, at ``version``, or ``as_of`` a time.

    The version is pinned when this is called: the transaction log is read on the driver
    (with the ``deltalake`` library, ``pip install 'feedline[delta]'``) and exactly the live
    files of that version are read, as plain Parquet read tasks on any engine. Files removed
    by a delete, update or overwrite are not read; rows deleted through deletion vectors
    (Spark, Databricks) are decoded with the log and dropped by position as each file is
    read. A table that uses column mapping, or whose deletion vectors cannot be read, is
    refused with a :class:`~feedline.errors.FormatError` saying how to fix it. Partition columns are
    filled from the log; a filter skips the files whose partition values or exact integer
    bounds rule it out, then row groups by their statistics. The version goes into
    ``describe()`` and a written dataset's lineage (``delta: PATH @ version N``).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, tempfile, deltalake
    >>> root = tempfile.mkdtemp() + "/t"
    >>> deltalake.write_deltalake(root, pa.table({"x": [1, 2, 3]}))
    >>> deltalake.write_deltalake(root, pa.table({"x": [4]}), mode="append")
    >>> fl.read_delta(root).count(), fl.read_delta(root, version=0).count()
    (4, 3)
    """
    source = delta_source(path, version=version, as_of=as_of, storage_options=storage_options)
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def read_iceberg(
    table: Any,
    columns: Sequence[str] | None = None,
    *,
    snapshot_id: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read an Iceberg table (a pyiceberg ``Table`` or the path of its metadata JSON) at its
    current snapshot or ``snapshot_id``.

    The snapshot's manifests are planned on the driver with ``pyiceberg``
    (``pip install 'feedline[iceberg]'``); the read tasks are plain Parquet reads of exactly
    its live data files, on any engine. Copy-on-write deletes read exactly; merge-on-read
    position delete files are read by the task of each data file they apply to, and their
    rows dropped. Equality deletes, Puffin deletion vectors and renamed columns are refused
    with a :class:`~feedline.errors.FormatError`. A filter skips the files whose exact integer
    bounds rule it out, then row groups. The snapshot id goes into ``describe()`` and a
    written dataset's lineage.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, tempfile
    >>> from pyiceberg.catalog.sql import SqlCatalog
    >>> root = tempfile.mkdtemp()
    >>> catalog = SqlCatalog("c", uri=f"sqlite:///{root}/c.db", warehouse=f"file://{root}")
    >>> catalog.create_namespace("ns")
    >>> t = catalog.create_table("ns.t", schema=pa.schema([("x", pa.int64())]))
    >>> t.append(pa.table({"x": [1, 2]}))
    >>> first = t.current_snapshot().snapshot_id
    >>> t.append(pa.table({"x": [3]}))
    >>> fl.read_iceberg(t).count(), fl.read_iceberg(t, snapshot_id=first).count()
    (3, 2)
    """
    source = iceberg_source(table, snapshot_id=snapshot_id, storage_options=storage_options)
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def read_lance(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    version: int | None = None,
    as_of: datetime | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Read a Lance dataset at its latest version, at ``version`` or ``as_of`` a time.

    One read task per fragment, read by ``pylance`` (``pip install 'feedline[lance]'``) at
    the pinned version, so rows removed by lance's ``delete`` stay removed; columns and
    filters are pushed into lance's scan. The version goes into ``describe()`` and a written
    dataset's lineage.

    Examples
    --------
    >>> import feedline as fl, lance, pyarrow as pa, tempfile
    >>> root = tempfile.mkdtemp() + "/t.lance"
    >>> _ = lance.write_dataset(pa.table({"x": [1, 2]}), root)
    >>> _ = lance.write_dataset(pa.table({"x": [3]}), root, mode="append")
    >>> fl.read_lance(root).count(), fl.read_lance(root, version=1).count()
    (3, 2)
    """
    source = LanceSource(path, version=version, as_of=as_of, storage_options=storage_options)
    ds = Dataset.from_source(source)
    return ds.select(columns) if columns is not None else ds


def range(n: int, *, rows_per_task: int = 64 * 1024) -> Dataset:  # noqa: A001
    """A dataset of ``n`` rows with an ``id`` column ``0..n-1``, generated lazily.

    Examples
    --------
    >>> import feedline as fl
    >>> fl.range(3).to_arrow()["id"].to_pylist()
    [0, 1, 2]
    """
    return Dataset.from_source(RangeSource(n, rows_per_task=rows_per_task))


def open(  # noqa: A001
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    version: int | None = None,
    as_of: datetime | None = None,
) -> Dataset:
    """Open a feedline dataset (or a plain Parquet folder without a manifest).

    ``version=N`` opens version ``N`` of the dataset, ``as_of=datetime`` the newest version
    committed at or before that time (a naive datetime is local time), while they are
    retained (:func:`feedline.history` lists them, :func:`feedline.vacuum` drops them);
    by default the current version.

    ``verify=True`` checks every shard's size and checksum first. A folder holding an
    interrupted write raises :class:`~feedline.errors.IncompleteDatasetError`. ``path`` may be
    any fsspec URL; ``storage_options`` (with the optional ``"retry"`` policy) reach the
    backend, and the loader reads the shards through the same filesystem.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(5).write(out)
    >>> fl.open(out, verify=True).count()
    5
    >>> _ = fl.range(2).write(out, mode="append")
    >>> fl.open(out).count(), fl.open(out, version=1).count()
    (7, 5)
    """
    source = open_source(
        path, verify=verify, storage_options=storage_options, version=version, as_of=as_of
    )
    return Dataset.from_source(source)
