"""The feedline dataset format: manifest, shards, footers, commit and the loader's shard source."""
