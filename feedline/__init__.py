"""feedline: turn raw data into training-ready tensors and keep accelerators fed.

Examples
--------
>>> import feedline as fl
>>> fl.range(3).count()
3
"""

from feedline import preprocess, tracking
from feedline.ui import charts
from feedline._version import __version__
from feedline.config import config
from feedline.dataset.dataset import Dataset
from feedline.engines.base import WriteInfo, get_engine
from feedline.engines.local.engine import LocalEngine
from feedline.engines.ray.engine import RayEngine
from feedline.engines.spark.engine import SparkEngine, clear_spark_cache, spark_session
from feedline.errors import (
    ConcurrentWriteError,
    ConfigurationError,
    DataError,
    FeedlineError,
    FormatError,
    IncompleteDatasetError,
    IntegrityError,
    MissingDependencyError,
    SchemaError,
    StorageError,
    UserFunctionError,
)
from feedline.io.tfrecord import reader as tfrecord
from feedline.store.dataset_files import verify
from feedline.io.storage.retry import RetryPolicy
from feedline.loader import ImageTransform, Loader, Windows
from feedline.loader.adapters.records import record_to_tensors
from feedline.preprocess import (
    Bucketizer,
    Chain,
    ClipTokenizer,
    Concat,
    DecodeImages,
    DecodeNdarray,
    HashingEncoder,
    Imputer,
    ListToTensor,
    MinMaxScaler,
    Normalize,
    OneHotEncoder,
    QuantileDiscretizer,
    RobustScaler,
    StandardScaler,
    StringIndexer,
    Tokenize,
)
from feedline.stats.drift import DriftReport, compare
from feedline.stats.compute import Stats, stats
from feedline.dataset.readers import (
    from_arrow,
    from_dict,
    from_huggingface,
    from_numpy,
    from_pandas,
    from_polars,
    from_ray,
    from_spark,
    open,  # noqa: A004
    range,  # noqa: A004
    read_csv,
    read_images,
    read_jsonl,
    read_parquet,
    read_petastorm,
    read_text,
    read_tfrecord,
    read_webdataset,
)

__all__ = [
    "Bucketizer",
    "Chain",
    "ClipTokenizer",
    "Concat",
    "ConcurrentWriteError",
    "ConfigurationError",
    "DataError",
    "Dataset",
    "DecodeImages",
    "DecodeNdarray",
    "DriftReport",
    "FeedlineError",
    "FormatError",
    "HashingEncoder",
    "ImageTransform",
    "Imputer",
    "IncompleteDatasetError",
    "IntegrityError",
    "ListToTensor",
    "Loader",
    "LocalEngine",
    "MinMaxScaler",
    "MissingDependencyError",
    "Normalize",
    "OneHotEncoder",
    "QuantileDiscretizer",
    "RayEngine",
    "RetryPolicy",
    "RobustScaler",
    "SchemaError",
    "SparkEngine",
    "StandardScaler",
    "Stats",
    "StorageError",
    "StringIndexer",
    "Tokenize",
    "UserFunctionError",
    "Windows",
    "WriteInfo",
    "__version__",
    "charts",
    "clear_spark_cache",
    "compare",
    "config",
    "from_arrow",
    "from_dict",
    "from_huggingface",
    "from_numpy",
    "from_pandas",
    "from_polars",
    "from_ray",
    "from_spark",
    "get_engine",
    "open",
    "preprocess",
    "range",
    "read_csv",
    "read_images",
    "read_jsonl",
    "read_parquet",
    "read_petastorm",
    "read_text",
    "read_tfrecord",
    "read_webdataset",
    "record_to_tensors",
    "spark_session",
    "stats",
    "tfrecord",
    "tracking",
    "verify",
]
