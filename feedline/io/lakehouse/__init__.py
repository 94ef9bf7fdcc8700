"""Lakehouse tables in: Delta Lake, Iceberg and Lance read at a pinned snapshot.

The snapshot's live files are planned on the driver (:mod:`.table_files`); each read task is
a plain Parquet file read (Delta, Iceberg) or one Lance fragment, and runs on every engine.
"""
