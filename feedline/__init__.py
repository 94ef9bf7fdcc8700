"""feedline: turn raw data into training-ready tensors and keep accelerators fed.

Examples
--------
>>> import feedline as fl
>>> fl.range(3).count()
3
"""

from feedline import charts, preprocess, tracking
from feedline._version import __version__
from feedline.config import config
from feedline.dataset import Dataset
from feedline.engines.base import WriteInfo, get_engine
from feedline.engines.local import LocalEngine
from feedline.engines.ray import RayEngine
from feedline.engines.spark import SparkEngine, clear_spark_cache, spark_session
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
from feedline.io import tfrecord
from feedline.io.format import verify
from feedline.io.retry import RetryPolicy
from feedline.loader import ImageTransform, Loader, Windows
from feedline.loader.records import record_to_tensors
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
from feedline.preprocess.drift import DriftReport, compare
from feedline.preprocess.stats import Stats, stats
from feedline.readers import (
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
