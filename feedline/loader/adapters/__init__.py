"""What batches become for PyTorch, TensorFlow and NumPy."""
