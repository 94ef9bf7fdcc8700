"""The embedded local engine: a streaming thread-pool executor, relational work in DuckDB."""
