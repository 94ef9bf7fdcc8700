"""One real engine per test module: a local[2] SparkSession, or a local Ray with 2 CPUs.

The requesting test module is pickled by value for the workers, so the functions and classes
it defines travel to them without being importable there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A local[2] SparkSession for the module (stopped at its end)."""
    from pyspark import cloudpickle

    from feedline.engines.spark.engine import spark_session

    cloudpickle.register_pickle_by_value(request.module)
    session = spark_session("local[2]", spark_sql_shuffle_partitions=2)
    session.sparkContext.setLogLevel("FATAL")  # failing tasks are expected in these tests
    yield session
    session.stop()
    cloudpickle.unregister_pickle_by_value(request.module)


@pytest.fixture(scope="module")
def ray_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A RayEngine on a local Ray with 2 CPUs (shut down at the module's end unless Ray was
    already running)."""
    import ray

    from feedline.engines.ray.engine import RayEngine

    already = ray.is_initialized()
    engine = RayEngine(num_cpus=2)
    engine.ensure_ray()
    ray.cloudpickle.register_pickle_by_value(request.module)
    yield engine
    ray.cloudpickle.unregister_pickle_by_value(request.module)
    if not already:
        ray.shutdown()
