"""Arrow <-> NumPy helpers: tensor columns, list tensors, Python values, Parquet types, sizes."""
