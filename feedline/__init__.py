"""feedline: turn raw data into training-ready tensors and keep accelerators fed.

The package root is lazy (PEP 562): ``import feedline`` loads only the exception tree and the
version; each public name imports its module the first time it is used, so a training job
that only reads a written dataset never loads the Dataset, the readers or an engine.

Examples
--------
>>> import feedline as fl
>>> fl.range(3).count()
3
"""

import importlib as _importlib
import logging as _logging
import typing as _typing

from feedline._version import __version__
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

# the library default (Python logging HOWTO): silent until fl.config.verbosity is set
_logging.getLogger("feedline").addHandler(_logging.NullHandler())

if _typing.TYPE_CHECKING:  # what each lazy name is, for type checkers and IDEs
    from feedline import charts, preprocess, tracking
    from feedline.dataset.dataset import Dataset
    from feedline.dataset.from_memory import (
        from_arrow,
        from_dict,
        from_huggingface,
        from_numpy,
        from_pandas,
        from_polars,
        from_ray,
        from_spark,
    )
    from feedline.dataset.mix import mix
    from feedline.dataset.readers import (
        open,  # noqa: A004
        range,  # noqa: A004
        read_csv,
        read_delta,
        read_iceberg,
        read_images,
        read_jsonl,
        read_lance,
        read_parquet,
        read_petastorm,
        read_text,
        read_tfrecord,
        read_webdataset,
    )
    from feedline.engines.local.engine import LocalEngine
    from feedline.engines.protocol import WriteInfo, get_engine
    from feedline.engines.ray.engine import RayEngine
    from feedline.engines.spark.bridge import clear_spark_cache
    from feedline.engines.spark.engine import SparkEngine, spark_session
    from feedline.io import tfrecord
    from feedline.io.storage.retry import RetryPolicy
    from feedline.loader.adapters.records import record_to_tensors
    from feedline.loader.data.windows import Windows
    from feedline.loader.loader import Loader
    from feedline.loader.packing.spec import Packing
    from feedline.loader.transforms import ImageTransform
    from feedline.preprocess.chain import Chain, Concat
    from feedline.preprocess.discretize import Bucketizer, QuantileDiscretizer
    from feedline.preprocess.encoders import OneHotEncoder, StringIndexer
    from feedline.preprocess.hashing import HashingEncoder
    from feedline.preprocess.imputer import Imputer
    from feedline.preprocess.list_tensor import ListToTensor
    from feedline.preprocess.ndarray import DecodeNdarray
    from feedline.preprocess.scalers import MinMaxScaler, RobustScaler, StandardScaler
    from feedline.preprocess.text.clip_bpe import ClipTokenizer
    from feedline.preprocess.text.tokenize import Tokenize
    from feedline.preprocess.vision.preprocessors import DecodeImages, Normalize
    from feedline.settings import config
    from feedline.statistics.compute import stats
    from feedline.statistics.drift import DriftReport, compare
    from feedline.statistics.result import Stats
    from feedline.store.dataset_files import verify
    from feedline.store.versions import history, vacuum

#: public name -> the module that defines it (a module itself where the name is one)
_LAZY: dict[str, str] = {
    "Bucketizer": "feedline.preprocess.discretize",
    "Chain": "feedline.preprocess.chain",
    "ClipTokenizer": "feedline.preprocess.text.clip_bpe",
    "Concat": "feedline.preprocess.chain",
    "Dataset": "feedline.dataset.dataset",
    "DecodeImages": "feedline.preprocess.vision.preprocessors",
    "DecodeNdarray": "feedline.preprocess.ndarray",
    "DriftReport": "feedline.statistics.drift",
    "HashingEncoder": "feedline.preprocess.hashing",
    "ImageTransform": "feedline.loader.transforms",
    "Imputer": "feedline.preprocess.imputer",
    "ListToTensor": "feedline.preprocess.list_tensor",
    "Loader": "feedline.loader.loader",
    "LocalEngine": "feedline.engines.local.engine",
    "MinMaxScaler": "feedline.preprocess.scalers",
    "Normalize": "feedline.preprocess.vision.preprocessors",
    "OneHotEncoder": "feedline.preprocess.encoders",
    "Packing": "feedline.loader.packing.spec",
    "QuantileDiscretizer": "feedline.preprocess.discretize",
    "RayEngine": "feedline.engines.ray.engine",
    "RetryPolicy": "feedline.io.storage.retry",
    "RobustScaler": "feedline.preprocess.scalers",
    "SparkEngine": "feedline.engines.spark.engine",
    "StandardScaler": "feedline.preprocess.scalers",
    "Stats": "feedline.statistics.result",
    "StringIndexer": "feedline.preprocess.encoders",
    "Tokenize": "feedline.preprocess.text.tokenize",
    "Windows": "feedline.loader.data.windows",
    "WriteInfo": "feedline.engines.protocol",
    "charts": "feedline.charts",
    "clear_spark_cache": "feedline.engines.spark.bridge",
    "compare": "feedline.statistics.drift",
    "config": "feedline.settings",
    "from_arrow": "feedline.dataset.from_memory",
    "from_dict": "feedline.dataset.from_memory",
    "from_huggingface": "feedline.dataset.from_memory",
    "from_numpy": "feedline.dataset.from_memory",
    "from_pandas": "feedline.dataset.from_memory",
    "from_polars": "feedline.dataset.from_memory",
    "from_ray": "feedline.dataset.from_memory",
    "from_spark": "feedline.dataset.from_memory",
    "get_engine": "feedline.engines.protocol",
    "history": "feedline.store.versions",
    "mix": "feedline.dataset.mix",
    "open": "feedline.dataset.readers",
    "preprocess": "feedline.preprocess",
    "range": "feedline.dataset.readers",
    "read_csv": "feedline.dataset.readers",
    "read_delta": "feedline.dataset.readers",
    "read_iceberg": "feedline.dataset.readers",
    "read_images": "feedline.dataset.readers",
    "read_jsonl": "feedline.dataset.readers",
    "read_lance": "feedline.dataset.readers",
    "read_parquet": "feedline.dataset.readers",
    "read_petastorm": "feedline.dataset.readers",
    "read_text": "feedline.dataset.readers",
    "read_tfrecord": "feedline.dataset.readers",
    "read_webdataset": "feedline.dataset.readers",
    "record_to_tensors": "feedline.loader.adapters.records",
    "spark_session": "feedline.engines.spark.engine",
    "stats": "feedline.statistics.compute",
    "tfrecord": "feedline.io.tfrecord",
    "tracking": "feedline.tracking",
    "vacuum": "feedline.store.versions",
    "verify": "feedline.store.dataset_files",
}

#: public names that are modules
_MODULES = frozenset({"charts", "preprocess", "tfrecord", "tracking"})

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
    "Packing",
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
    "history",
    "mix",
    "open",
    "preprocess",
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
    "record_to_tensors",
    "spark_session",
    "stats",
    "tfrecord",
    "tracking",
    "vacuum",
    "verify",
]


def __getattr__(name: str) -> object:
    """Import the module behind a public name on first use, and keep the value."""
    try:
        path = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'feedline' has no attribute {name!r}") from None
    module = _importlib.import_module(path)
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
