"""Fit-on-sample preprocessors: scalers, encoders, imputers, tokenizers, images, statistics.

Importing this package registers the built-in preprocessors with :func:`from_state`.
"""

from feedline.preprocess.chain import Chain, Concat
from feedline.preprocess.discretize import Bucketizer, QuantileDiscretizer
from feedline.preprocess.encoders import OneHotEncoder, StringIndexer
from feedline.preprocess.hashing import HashingEncoder
from feedline.preprocess.imputer import Imputer
from feedline.preprocess.list_tensor import ListToTensor
from feedline.preprocess.ndarray import DecodeNdarray
from feedline.preprocess.preprocessor import Preprocessor, from_state, register
from feedline.preprocess.scalers import MinMaxScaler, RobustScaler, StandardScaler
from feedline.preprocess.text.clip_bpe import ClipTokenizer
from feedline.preprocess.text.tokenize import Tokenize
from feedline.preprocess.vision.preprocessors import DecodeImages, Normalize
from feedline.statistics.quantile_sketch import QuantileSketch

__all__ = [
    "Bucketizer",
    "Chain",
    "ClipTokenizer",
    "Concat",
    "DecodeImages",
    "DecodeNdarray",
    "HashingEncoder",
    "Imputer",
    "ListToTensor",
    "MinMaxScaler",
    "Normalize",
    "OneHotEncoder",
    "Preprocessor",
    "QuantileDiscretizer",
    "QuantileSketch",
    "RobustScaler",
    "StandardScaler",
    "StringIndexer",
    "Tokenize",
    "from_state",
    "register",
]
