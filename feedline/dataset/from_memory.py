"""Constructors of datasets over in-memory data: Arrow tables, dicts of columns, NumPy
arrays, pandas and Polars frames, Hugging Face datasets, Spark and Ray DataFrames.

Re-exported by :mod:`feedline.dataset.readers` (the file readers), and from ``feedline`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.arrow.column_names import check_unique
from feedline.arrow.python_columns import arrays_from_columns
from feedline.dataset.dataset import Dataset
from feedline.engines.ray.source import RaySource
from feedline.engines.spark.bridge import SparkFrameSource
from feedline.errors import ConfigurationError, SchemaError
from feedline.io.memory import ArrowSource, table_from_pandas

if TYPE_CHECKING:
    import datasets
    import numpy
    import pandas
    import polars
    import pyspark.sql
    import ray.data

__all__ = [
    "from_arrow",
    "from_dict",
    "from_huggingface",
    "from_numpy",
    "from_pandas",
    "from_polars",
    "from_ray",
    "from_spark",
]


def from_arrow(table: pa.Table | pa.RecordBatch) -> Dataset:
    """A dataset over an in-memory Arrow table (zero-copy slices).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> fl.from_arrow(pa.table({"x": [1, 2, 3]})).count()
    3
    """
    if isinstance(table, pa.Table | pa.RecordBatch):
        _check_names(table.schema.names, "from_arrow()")
    return Dataset.from_source(ArrowSource(table))


def _check_names(names: Sequence[str], where: str) -> None:
    check_unique(
        names, f"{where}: the input", "rename the columns to unique names before wrapping it."
    )


def from_dict(mapping: Mapping[str, Any]) -> Dataset:
    """A dataset over columns given as a dict of name → values.

    Values are lists, NumPy arrays (more than one dimension: a fixed-shape tensor column,
    one row per first-axis entry) or Arrow arrays, all of one length.

    Examples
    --------
    >>> import feedline as fl, numpy as np
    >>> ds = fl.from_dict({"id": [1, 2], "image": np.zeros((2, 3, 3), np.uint8)})
    >>> ds.schema().field("image").type.shape, ds.count()
    ([3, 3], 2)
    """
    if not isinstance(mapping, Mapping) or not mapping:
        raise ConfigurationError(
            f"from_dict() needs a non-empty dict of column name -> values, got "
            f"{type(mapping).__name__}. Fix: pass e.g. {{'x': [1, 2, 3]}}."
        )

    def bad_column(name: str, exc: Exception) -> SchemaError:
        return SchemaError(
            f"from_dict(): the column {name!r} cannot become an Arrow column "
            f"({type(exc).__name__}: {exc}). Fix: give one value per row, all of one type "
            "(a list, or a NumPy array: n-d for tensors)."
        )

    def uneven(lengths: dict[str, int]) -> ConfigurationError:
        return ConfigurationError(
            f"from_dict(): columns have different lengths {lengths}. Fix: give every column "
            "one value per row."
        )

    _check_names([str(name) for name in mapping], "from_dict()")
    columns = {str(name): values for name, values in mapping.items()}
    arrays = arrays_from_columns(columns, bad_column=bad_column, uneven=uneven)
    return Dataset.from_source(ArrowSource(pa.table(arrays), name="dict"))


def from_numpy(
    arrays: numpy.ndarray | Sequence[numpy.ndarray] | Mapping[str, numpy.ndarray],
) -> Dataset:
    """A dataset over NumPy arrays: a dict of name → array, or one array (a ``data`` column)
    or a list of arrays concatenated along the first axis (a ``data`` column).

    Arrays with more than one dimension become fixed-shape tensor columns (zero-copy
    when C-contiguous), one row per first-axis entry.

    Examples
    --------
    >>> import feedline as fl, numpy as np
    >>> ds = fl.from_numpy(np.arange(12, dtype=np.float32).reshape(4, 3))
    >>> ds.schema().field("data").type.shape, ds.count()
    ([3], 4)
    >>> fl.from_numpy({"x": np.arange(3)}).to_numpy()["x"].tolist()
    [0, 1, 2]
    """
    import numpy as np

    if isinstance(arrays, np.ndarray):
        arrays = {"data": arrays}
    elif (
        isinstance(arrays, list | tuple)
        and arrays
        and all(isinstance(a, np.ndarray) for a in arrays)
    ):
        arrays = {"data": np.concatenate(arrays)}
    if not isinstance(arrays, Mapping) or not all(
        isinstance(a, np.ndarray) for a in arrays.values()
    ):
        raise ConfigurationError(
            f"from_numpy() needs a NumPy array, a list of them or a dict of name -> array, got "
            f"{type(arrays).__name__}. Fix: pass np arrays (fl.from_dict takes lists too)."
        )
    bad = {name: a.shape for name, a in arrays.items() if a.ndim == 0}
    if bad:
        raise ConfigurationError(
            f"from_numpy(): arrays {bad} have no rows (0-d). Fix: give arrays of at least one "
            "dimension, one row per first-axis entry."
        )
    return from_dict(arrays)


def from_huggingface(dataset: datasets.Dataset) -> Dataset:
    """A dataset over a Hugging Face ``datasets.Dataset``, reading its Arrow table.

    The table backing the dataset (memory-mapped from the ``datasets`` cache) is used
    as it is, without a copy; a dataset with an indices mapping (after ``select``,
    ``shuffle``, ``filter``…) has its selected rows taken once. Features stay as stored in
    Arrow (``ClassLabel`` as integers, ``Image`` as a ``{bytes, path}`` struct).

    Examples
    --------
    >>> import feedline as fl, datasets
    >>> hf = datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": [0, 1, 0]})
    >>> fl.from_huggingface(hf).to_arrow()["label"].to_pylist()
    [0, 1, 0]
    >>> fl.from_huggingface(hf.select([2, 0])).to_arrow()["text"].to_pylist()
    ['c', 'a']
    """
    kind = type(dataset).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise ConfigurationError(
            f"from_huggingface() needs one split, got a {kind} with splits "
            f"{list(dataset)}. Fix: pick one, e.g. fl.from_huggingface(dd['train'])."
        )
    if (
        kind == "IterableDataset"
        or not hasattr(dataset, "data")
        or not hasattr(dataset, "with_format")
    ):
        raise ConfigurationError(
            f"from_huggingface() needs a map-style datasets.Dataset, got {kind}. Fix: load it "
            "without streaming=True (datasets.load_dataset(..., split='train'))."
        )
    if getattr(dataset, "_indices", None) is None:
        table = dataset.data.table  # the backing Arrow table: no copy
    else:
        table = dataset.with_format("arrow")[:]  # the indexed rows, taken once
    name = f"huggingface dataset {getattr(dataset, 'builder_name', None) or ''}".rstrip()
    _check_names(table.schema.names, "from_huggingface()")
    return Dataset.from_source(ArrowSource(table, name=name))


def from_pandas(df: pandas.DataFrame) -> Dataset:
    """A dataset over a pandas DataFrame (converted once to Arrow; a default index is dropped).

    Examples
    --------
    >>> import feedline as fl, pandas as pd
    >>> fl.from_pandas(pd.DataFrame({"x": [1, 2]})).schema().names
    ['x']
    """
    if type(df).__name__ != "DataFrame" or not hasattr(df, "iloc"):
        raise ConfigurationError(
            f"from_pandas() needs a pandas DataFrame, got {type(df).__name__}. Fix: use "
            "fl.from_arrow() for Arrow tables or fl.from_polars() for Polars frames."
        )
    _check_names([str(name) for name in df.columns], "from_pandas()")
    try:
        table = table_from_pandas(df)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        column = _unconvertible_column(df)
        raise SchemaError(
            f"from_pandas() cannot convert the column {column!r} (dtype "
            f"{df[column].dtype if column is not None else '?'}) to Arrow: {exc}. Fix: give "
            "its Arrow type yourself, fl.from_arrow(pa.Table.from_pandas(df, schema=...)) "
            "(e.g. pa.map_(pa.string(), pa.int64()) for lists of pairs), or convert the column "
            "to plain values first."
        ) from exc
    return Dataset.from_source(ArrowSource(table, name="pandas DataFrame"))


def _unconvertible_column(df: Any) -> Any:
    """The first column of ``df`` Arrow cannot infer a type for (``None`` if none alone)."""
    for name in df.columns:
        try:
            pa.array(df[name], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return name
    return None


def from_polars(df: polars.DataFrame) -> Dataset:
    """A dataset over a Polars DataFrame or LazyFrame (collected) via Arrow.

    Examples
    --------
    >>> import feedline as fl, polars as pl
    >>> fl.from_polars(pl.DataFrame({"x": [1, 2]})).count()
    2
    """
    if hasattr(df, "collect") and not hasattr(df, "to_arrow"):
        df = df.collect()
    if not hasattr(df, "to_arrow"):
        raise ConfigurationError(
            f"from_polars() needs a Polars DataFrame, got {type(df).__name__}. Fix: use "
            "fl.from_pandas() for pandas frames or fl.from_arrow() for Arrow tables."
        )
    table = df.to_arrow()
    _check_names(table.schema.names, "from_polars()")
    return Dataset.from_source(ArrowSource(table, name="polars DataFrame"))


def from_spark(
    df: pyspark.sql.DataFrame, *, cache: bool = True, cache_dir: str | None = None
) -> Dataset:
    """A dataset over a Spark DataFrame.

    With ``cache=True`` the DataFrame is computed once (by Spark, into ``cache_dir``) and
    every use reads the materialized copy; see :mod:`feedline.engines.spark.bridge`.

    Examples
    --------
    >>> import feedline as fl
    >>> ds = fl.from_spark(spark.range(100))  # doctest: +SKIP
    >>> ds.write("out/").rows  # doctest: +SKIP
    100
    """

    return Dataset.from_source(SparkFrameSource(df, cache=cache, cache_dir=cache_dir))


def from_ray(dataset: ray.data.Dataset, name: str = "ray dataset") -> Dataset:
    """A dataset reading a ``ray.data.Dataset``.

    Examples
    --------
    >>> import feedline as fl, ray  # doctest: +SKIP
    >>> ds = fl.from_ray(ray.data.range(5))  # doctest: +SKIP
    >>> ds.to_arrow()["id"].to_pylist()  # doctest: +SKIP
    [0, 1, 2, 3, 4]
    >>> info = ds.write("/tmp/out", engine="ray")  # doctest: +SKIP
    """

    return Dataset.from_source(RaySource(dataset, name))
