"""Reading WebDataset tar shards."""
