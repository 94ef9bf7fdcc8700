"""The Spark engine: plans as fused ``mapInArrow`` stages and Spark DataFrame operations."""
