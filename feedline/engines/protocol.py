"""The engine protocol and the registry of engines (name → lazy import + install hint)."""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location
from feedline.plan.plan import Plan
from feedline.store.commit import WriteBase
from feedline.store.shards import parquet_codec
from feedline.ui.notebook import size, table, view

__all__ = ["Engine", "WriteInfo", "WriteOptions", "get_engine", "register_engine"]


@dataclass(frozen=True)
class WriteOptions:
    """How ``Dataset.write`` lays out shards."""

    rows_per_shard: int | None = None
    bytes_per_shard: int | None = 256 << 20
    row_group_rows: int | None = None
    row_group_bytes: int = 32 << 20
    compression: str | None = "zstd"

    def __post_init__(self) -> None:

        parquet_codec(self.compression)  # an unknown codec fails before any file is written

    def writer_kwargs(self) -> dict[str, Any]:
        return {
            "rows_per_shard": self.rows_per_shard,
            "bytes_per_shard": self.bytes_per_shard,
            "row_group_rows": self.row_group_rows,
            "row_group_bytes": self.row_group_bytes,
            "compression": self.compression,
        }


@dataclass(frozen=True)
class WriteInfo:
    """What a write produced.

    Attributes
    ----------
    path, rows, shards, bytes:
        Where the dataset is, its row count, number of shards and bytes on storage.
    seconds:
        Wall time of the write.
    report:
        Execution counters (files and row groups read, records skipped and why, ...).
    """

    path: str
    rows: int
    shards: int
    bytes: int
    seconds: float
    engine: str
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")

    def __repr__(self) -> str:
        return (
            f"WriteInfo(path={self.path!r}, rows={self.rows:,}, shards={self.shards:,}, "
            f"bytes={self.bytes:,}, seconds={self.seconds:.3f}, engine={self.engine!r})"
        )

    def _repr_html_(self) -> str:
        """The notebook view: where, how much, how fast, and the non-zero report counters."""

        rate = self.rows_per_second
        rows = [
            ["path", self.path],
            ["rows", f"{self.rows:,}"],
            ["shards", f"{self.shards:,}"],
            ["size", size(self.bytes)],
            ["time", f"{self.seconds:,.3f} s ({rate:,.0f} rows/s)" if rate != float("inf")
             else f"{self.seconds:,.3f} s"],
            ["engine", self.engine],
        ]  # fmt: skip
        rows += [[k, f"{v:,}" if isinstance(v, int) else v] for k, v in self.report.items() if v]
        return view("feedline WriteInfo", [], table([], rows))

    @classmethod
    def from_manifest(
        cls, url: str, manifest: Any, *, started: float, engine: str, report: Any
    ) -> WriteInfo:
        """The summary of a committed write: counts from its manifest, wall time since
        ``started`` (a ``time.perf_counter()`` reading) and the execution ``report``.

        Examples
        --------
        >>> import time, feedline as fl, tempfile
        >>> from feedline.io.source import ExecutionReport
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(5).write(out)
        >>> info = WriteInfo.from_manifest(out, fl.open(out).manifest,
        ...                                started=time.perf_counter(), engine="local",
        ...                                report=ExecutionReport())
        >>> info.rows, info.shards, info.engine
        (5, 1, 'local')
        """
        return cls(
            path=url,
            rows=manifest.rows,
            shards=len(manifest.shards),
            bytes=manifest.bytes,
            seconds=time.perf_counter() - started,
            engine=engine,
            report=report.as_dict(),
        )


@runtime_checkable
class Engine(Protocol):
    """Executes plans. Implementations: ``local`` (default), ``spark``, ``ray``."""

    name: str

    def execute(
        self, plan: Plan, *, preserve_order: bool = True, report: ExecutionReport | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the plan's output batches."""
        ...

    def write(
        self,
        plan: Plan,
        target: Location,
        options: WriteOptions,
        *,
        preserve_order: bool = True,
        on_rows: Callable[[int], None] | None = None,
        report: ExecutionReport | None = None,
        preprocessors: list[dict[str, Any]] | None = None,
        base: WriteBase | None = None,
    ) -> WriteInfo:
        """Materialize the plan as a feedline dataset at ``target``.

        ``preprocessors`` are the fitted states stored in the manifest; the engine commits
        the manifest last (:func:`feedline.store.dataset_files.commit`), only if the dataset
        is still at ``base`` (the version noted when the write was asked for,
        :func:`feedline.store.commit.note_base`; ``None``: when the engine takes the lock).
        """
        ...

    def aggregate(
        self,
        plan: Plan,
        partial: Callable[[pa.RecordBatch], Any],
        merge: Callable[[Any, Any], Any],
    ) -> Any:
        """Merge ``partial(batch)`` over every output batch (``None`` when there are none)."""
        ...


# name -> (module:attribute, pip package, extra)
_REGISTRY: dict[str, tuple[str, str | None, str | None]] = {
    "local": ("feedline.engines.local.engine:LocalEngine", None, None),
    "spark": ("feedline.engines.spark.engine:SparkEngine", "pyspark", "spark"),
    "ray": ("feedline.engines.ray.engine:RayEngine", "ray", "ray"),
}


def register_engine(
    name: str, target: str, package: str | None = None, extra: str | None = None
) -> None:
    """Register an engine class by import path (``"module:Class"``)."""
    _REGISTRY[name] = (target, package, extra)


def get_engine(
    engine: str | Engine | None = None, options: Mapping[str, Any] | None = None
) -> Engine:
    """Resolve an engine name (or pass an engine instance through).

    ``options`` are the engine class's constructor arguments (see :class:`LocalEngine`,
    :class:`SparkEngine`, :class:`RayEngine`), for a name only.

    Examples
    --------
    >>> get_engine("local").name
    'local'
    >>> get_engine("local", {"parallelism": 3}).parallelism
    3
    >>> get_engine("nope")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Unknown engine 'nope'. Fix: use one of local, ray, spark.
    """
    if engine is None:
        engine = "local"
    if not isinstance(engine, str):
        if options:
            raise ConfigurationError(
                "Engine options were given together with an engine instance. Fix: configure "
                "the instance instead."
            )
        return engine
    if engine not in _REGISTRY:
        names = ", ".join(sorted(_REGISTRY))
        raise ConfigurationError(f"Unknown engine {engine!r}. Fix: use one of {names}.")
    target, package, extra = _REGISTRY[engine]
    module_name, attribute = target.split(":")
    if package is not None and importlib.util.find_spec(package) is None:
        raise MissingDependencyError(package, extra or engine, f"engine={engine!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if package is not None and exc.name and exc.name.split(".")[0] == package:
            raise MissingDependencyError(package, extra or engine, f"engine={engine!r}") from exc
        raise ConfigurationError(
            f"The {engine!r} engine is not available in this feedline version ({exc}). "
            "Fix: use engine='local'."
        ) from exc
    factory: Callable[..., Engine] = getattr(module, attribute)
    return factory(**(options or {}))
