"""``Loader.to_tf_dataset()`` and ``format="tf"`` (skipped when TensorFlow is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")


def test_element_spec_follows_the_schema(write) -> None:
    loader = write(300).loader(batch_size=32, format="torch", return_padding_mask=True)
    dataset = loader.to_tf_dataset()
    spec = dataset.element_spec
    assert set(spec) == {"id", "x", "vec", "label", "_padded"}
    assert spec["vec"].shape == (32, 2, 3) and spec["vec"].dtype == tf.float32
    assert spec["id"].shape == (32,) and spec["id"].dtype == tf.int64
    assert spec["_padded"].dtype == tf.bool
    batches = list(dataset)
    assert len(batches) == len(loader) == 300 // 32
    ids = np.concatenate([b["id"].numpy() for b in batches])
    assert len(np.unique(ids)) == len(ids)
    np.testing.assert_array_equal(batches[0]["x"].numpy(), batches[0]["id"].numpy() / 2)
    again = np.concatenate([b["id"].numpy() for b in dataset])  # a second pass: next epoch
    assert loader.epoch == 1 and not np.array_equal(ids, again)


def test_keras_fits_on_feature_label_pairs(write) -> None:
    loader = write(512).loader(batch_size=64, columns=["x", "vec", "label"], format="numpy")
    dataset = loader.to_tf_dataset(label="label")
    features, label = dataset.element_spec
    assert set(features) == {"x", "vec"} and label.shape == (64,)
    assert int(dataset.cardinality()) == len(loader) == 8
    keras = tf.keras
    inputs = {"x": keras.Input((), name="x"), "vec": keras.Input((2, 3), name="vec")}
    flat = keras.layers.Concatenate()(
        [keras.layers.Reshape((1,))(inputs["x"]), keras.layers.Flatten()(inputs["vec"])]
    )
    model = keras.Model(inputs, keras.layers.Dense(7)(flat))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    with pytest.raises(Exception, match="no such key"):
        loader.to_tf_dataset(label="nope")


def test_format_tf_yields_tensors(write) -> None:
    batch = next(iter(write(50).loader(batch_size=10, format="tf")))
    assert isinstance(batch["vec"], tf.Tensor) and batch["vec"].shape == (10, 2, 3)
