"""TensorFlow output: ``Loader.to_tf_dataset()`` as a ``tf.data.Dataset``.

TensorFlow is imported only when asked for. Every batch the loader yields is full (``drop_last``
drops the remainder, or padding repeats samples), so the batch dimension of the element spec
is fixed at ``batch_size``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, MissingDependencyError

__all__ = ["batch_shapes", "import_tensorflow", "output_signature", "tf_dataset", "to_tf"]


def import_tensorflow() -> Any:
    """Import tensorflow or raise :class:`MissingDependencyError` naming the ``tf`` extra."""
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise MissingDependencyError(
            "tensorflow", "tf", "Loader.to_tf_dataset() / format='tf'"
        ) from exc
    return tf


def output_signature(
    shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], batch_size: int | None
) -> dict[str, Any]:
    """``tf.TensorSpec`` per key: ``(batch_size, *shape)`` (``None``: batches may be short);
    object columns are ``tf.string``."""
    tf = import_tensorflow()
    return {
        name: tf.TensorSpec(
            (batch_size, *shape), tf.string if dtype.kind == "O" else tf.as_dtype(dtype), name=name
        )
        for name, (shape, dtype) in shapes.items()
    }


def batch_shapes(batch: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Per key of ``batch``: one sample's shape and dtype (an array's rows; anything else, such
    as a list of strings, is a column of Python objects).

    Examples
    --------
    >>> batch_shapes({"x": np.zeros((4, 3), np.float32), "s": ["a", "b", "c", "d"]})
    {'x': ((3,), dtype('float32')), 's': ((), dtype('O'))}
    """
    return {
        key: (value.shape[1:], value.dtype)
        if isinstance(value, np.ndarray)
        else ((), np.dtype(object))
        for key, value in batch.items()
    }


def to_tf(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Arrays and lists → ``tf.Tensor``."""
    tf = import_tensorflow()
    return {k: tf.convert_to_tensor(v) for k, v in batch.items()}


def tf_dataset(
    batches: Callable[[], Iterator[dict[str, Any]]],
    shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    batch_size: int | None,
    label: str | None,
    cardinality: int | None = None,
) -> Any:
    """A ``tf.data.Dataset`` over ``batches()`` (called once per pass over the dataset).

    With ``label`` the elements are ``(dict of the other keys, label)`` pairs, the form
    ``keras.Model.fit`` takes. A known ``cardinality`` (batches per pass) is asserted, so
    Keras knows the steps per epoch.
    """
    tf = import_tensorflow()
    signature = output_signature(shapes, batch_size)
    if label is not None:
        if label not in signature:
            raise ConfigurationError(
                f"to_tf_dataset(label={label!r}): no such key; the batches hold "
                f"{sorted(signature)}. Fix: pass one of them."
            )
        target = signature.pop(label)

        def pairs() -> Iterator[tuple[dict[str, Any], Any]]:
            for batch in batches():
                value = batch.pop(label)
                yield batch, value

        dataset = tf.data.Dataset.from_generator(pairs, output_signature=(signature, target))
    else:
        dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    if cardinality is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cardinality))
    return dataset
