"""Fit-on-sample preprocessors: scalers, encoders, imputers, tokenizers, images, statistics."""

from feedline.preprocess.base import Preprocessor, from_state, register

__all__ = ["Preprocessor", "from_state", "register"]
