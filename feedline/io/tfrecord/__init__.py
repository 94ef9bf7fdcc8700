"""TFRecord files of ``tf.train.Example`` records, read and written without TensorFlow."""
