"""TFRecord files of ``tf.train.Example`` records, read and written without TensorFlow.

This package's face is ``fl.tfrecord``: the feature specs ``read_tfrecord(features=...)``
takes (:class:`FixedLen`, :class:`VarLen`), how many records spec inference reads
(:data:`INFER_RECORDS`) and the source class behind ``fl.read_tfrecord``.
"""

from feedline.io.tfrecord.reader import INFER_RECORDS, TfRecordSource
from feedline.io.tfrecord.spec import FixedLen, VarLen

__all__ = ["INFER_RECORDS", "FixedLen", "TfRecordSource", "VarLen"]
