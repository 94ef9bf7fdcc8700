"""The loader's data: memory, node and shard caches, row-group streams, time-series windows."""
