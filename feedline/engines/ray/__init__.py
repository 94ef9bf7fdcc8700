"""The Ray engine: plans as ``ray.data`` stages and Ray Data's own relational operators."""
