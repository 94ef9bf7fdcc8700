"""Experiment tracking with MLflow (the ``mlflow`` extra): datasets as run inputs, loader metrics.

- :func:`log_dataset` records a written feedline dataset on an MLflow run as a *dataset input*
  (``mlflow.log_input``): its name, a digest of the manifest's shard checksums (the same
  fingerprint feedline uses for lineage: equal digests mean byte-identical shards), its source
  URL, schema and row count, plus the fitted preprocessor state and the lineage as two small
  JSON artifacts under ``feedline/<name>/``. The data files are never uploaded.
- ``Loader(..., track=True)`` logs ``loader/samples_per_s``, ``loader/data_wait_fraction``,
  ``loader/batches``, ``loader/samples`` and ``loader/seconds`` with ``step=epoch`` to the run
  active when the loader is created (:class:`EpochLogger`). Without an active run it raises a
  :class:`~feedline.errors.ConfigurationError` at construction rather than starting a run
  implicitly: a run opened behind the user's back would stay open and hide a misconfigured
  script. In distributed training pass ``track=True`` on rank 0 only.
- :func:`local_store` prepares a local file store (``mlruns``) and returns its tracking URI.

MLflow is imported only when one of these is used.

Examples
--------
>>> import feedline as fl, mlflow, tempfile  # doctest: +SKIP
>>> mlflow.set_tracking_uri(local_store(tempfile.mkdtemp() + "/mlruns"))  # doctest: +SKIP
>>> with mlflow.start_run():  # doctest: +SKIP
...     log_dataset("out/train", name="train")
...     loader = fl.open("out/train").loader(batch_size=256, track=True)
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feedline.errors import ConfigurationError, FormatError, MissingDependencyError
from feedline.io.source import fingerprint_of
from feedline.io.storage.paths import Location, resolve
from feedline.store.dataset_files import read_manifest

if TYPE_CHECKING:
    import pyarrow as pa

    from feedline.dataset.dataset import Dataset
    from feedline.store.manifest import Manifest

__all__ = ["EpochLogger", "dataset_digest", "local_store", "log_dataset"]

#: metric keys ``Loader(track=True)`` logs, from the entries of ``Loader.metrics()``
LOADER_METRICS = ("samples_per_s", "data_wait_fraction", "batches", "samples", "seconds")


def _mlflow(purpose: str) -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise MissingDependencyError("mlflow", "mlflow", purpose) from exc
    return mlflow


def local_store(path: str | os.PathLike[str]) -> str:
    """Create a local MLflow file store folder (e.g. ``out/mlruns``) and return its tracking URI.

    mlflow-skinny has no SQL backend (it would need SQLAlchemy), so a local store is a file
    store, which MLflow 3 refuses unless ``MLFLOW_ALLOW_FILE_STORE`` is true: this function
    sets that variable for the current process (and only when called). Pass the URI to
    ``mlflow.set_tracking_uri``; to browse the runs, run
    ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri <uri>`` (the ``mlflow``
    server package, not mlflow-skinny).

    Examples
    --------
    >>> import tempfile
    >>> local_store(tempfile.mkdtemp() + "/mlruns").startswith("file://")
    True
    """
    _mlflow("feedline.tracking.local_store")
    from mlflow.store.tracking.file_store import FileStore

    folder = Path(path).expanduser().resolve()
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # scoped to this explicit opt-in
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # an empty folder: let MLflow lay out a fresh store (experiment 0)
        FileStore(str(folder))
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot create the MLflow store folder {str(folder)!r}: {exc}. Fix: pass a "
            "writable folder."
        ) from exc
    return folder.as_uri()


def _run_id(mlflow: Any, run: Any, what: str) -> str:
    """The id of ``run`` (an id, an ``mlflow.entities.Run`` or None for the active run)."""
    if run is None:
        active = mlflow.active_run()
        if active is None:
            raise ConfigurationError(
                f"{what} needs an active MLflow run and none is active. Fix: call it inside "
                "`with mlflow.start_run():`, or pass the run (its id)."
            )
        return active.info.run_id
    run_id = run if isinstance(run, str) else getattr(getattr(run, "info", None), "run_id", None)
    if not isinstance(run_id, str):
        raise ConfigurationError(
            f"{what}: {run!r} is not an MLflow run. Fix: pass a run id or an mlflow Run."
        )
    try:
        mlflow.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException as exc:
        raise ConfigurationError(
            f"{what}: no MLflow run {run_id!r} in the tracking store "
            f"{mlflow.get_tracking_uri()!r} ({exc.message}). Fix: pass the id of an existing "
            "run, or set the tracking URI it lives in."
        ) from exc
    return run_id


class EpochLogger:
    """Logs a loader's per-epoch metrics to one MLflow run (behind ``Loader(track=...)``).

    Parameters
    ----------
    track:
        ``True`` for the run active now, or a run id.

    Examples
    --------
    >>> import feedline as fl, mlflow  # doctest: +SKIP
    >>> with mlflow.start_run():  # doctest: +SKIP
    ...     loader = fl.range(100).loader(batch_size=10, track=True)
    ...     _ = list(loader)  # logs loader/samples_per_s etc. at step 0
    """

    def __init__(self, track: bool | str) -> None:
        if not isinstance(track, bool | str) or track is False:
            raise ConfigurationError(
                f"Loader: track={track!r}; it takes True (the active MLflow run) or a run id. "
                "Fix: pass track=True inside `with mlflow.start_run():`."
            )
        self._mlflow = _mlflow("Loader(track=...)")
        self.run_id = _run_id(self._mlflow, None if track is True else track, "Loader(track=)")
        self._client = self._mlflow.MlflowClient()

    def log_epoch(self, metrics: dict[str, Any]) -> None:
        """Log one ``Loader.metrics()`` entry as ``loader/<key>`` at ``step=metrics["epoch"]``."""
        from mlflow.entities import Metric

        stamp, step = int(time.time() * 1000), int(metrics["epoch"])
        values = [Metric(f"loader/{k}", float(metrics[k]), stamp, step) for k in LOADER_METRICS]
        try:
            self._client.log_batch(self.run_id, metrics=values)
        except self._mlflow.exceptions.MlflowException as exc:
            raise ConfigurationError(
                f"Loader(track=): logging epoch {step}'s metrics to MLflow run {self.run_id!r} "
                f"failed: {exc.message}. Fix: keep the run and its tracking store available "
                "while the loader runs."
            ) from exc


def _manifest_of(ds_or_path: Any, storage_options: dict[str, Any] | None) -> tuple[Manifest, str]:
    """The manifest of a written dataset and the URL it lives at (read from the folder for a
    path: logging never needs the Dataset machinery)."""
    where = ds_or_path
    target: Location | None
    if isinstance(ds_or_path, str | os.PathLike):
        target = folder = resolve(ds_or_path, storage_options)
        manifest = read_manifest(folder)
    elif hasattr(ds_or_path, "plan") and hasattr(ds_or_path, "manifest"):
        manifest = ds_or_path.manifest
        target = getattr(ds_or_path.plan.source, "target", None)
    else:
        raise ConfigurationError(
            f"log_dataset takes a feedline Dataset or a path, got {type(ds_or_path).__name__}."
            " Fix: pass fl.open(path) or the path of a written dataset."
        )
    if manifest is None or target is None:
        raise FormatError(
            f"log_dataset: {where!r} is not a written feedline dataset (no {'_feedline.json'} "
            "manifest), so it has no digest or preprocessor state to log. Fix: write it with "
            "ds.write(path) and pass fl.open(path) or the path."
        )
    return manifest, (target.path if target.is_local else target.url)


def dataset_digest(manifest: Manifest) -> str:
    """The digest :func:`log_dataset` records: a fingerprint of the shards' checksums.

    Equal to the dataset source's ``fingerprint()`` (and so to ``lineage.source_fingerprint``
    of a dataset written from it).

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> ds = fl.open(fl.range(5).write(tempfile.mkdtemp() + "/ds").path)
    >>> dataset_digest(ds.manifest) == ds.plan.source.fingerprint()
    True
    """

    return fingerprint_of(*(s.checksum for s in manifest.shards))


def _mlflow_schema(schema: pa.Schema) -> Any:
    """The MLflow column schema of an Arrow schema (``any`` where MLflow has no such type)."""
    import pyarrow as pa
    from mlflow.types.schema import AnyType, Array, ColSpec, DataType, Schema

    def convert(t: pa.DataType) -> Any:
        if isinstance(t, pa.BaseExtensionType):  # e.g. a fixed-shape tensor: an array of its values
            t = t.storage_type
        if pa.types.is_dictionary(t):
            return convert(t.value_type)
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            inner = convert(t.value_type)
            return Array(inner) if isinstance(inner, DataType | Array) else AnyType()
        for test, name in (
            (pa.types.is_boolean, "boolean"), (pa.types.is_float64, "double"),
            (pa.types.is_floating, "float"), (pa.types.is_int64, "long"),
            (pa.types.is_uint32, "long"), (pa.types.is_integer, "integer"),
            (pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
            (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"),
            (pa.types.is_timestamp, "datetime"), (pa.types.is_date, "datetime"),
        ):  # fmt: skip
            if test(t) and not pa.types.is_uint64(t):
                return DataType[name]
        return AnyType()

    return Schema([ColSpec(convert(f.type), f.name, required=not f.nullable) for f in schema])


@functools.cache
def _dataset_class() -> type:
    """An ``mlflow.data`` dataset holding only metadata, with a row-count profile."""
    from mlflow.data.meta_dataset import MetaDataset

    class FeedlineMLflowDataset(MetaDataset):
        def __init__(self, source: Any, name: str, digest: str, schema: Any, profile: dict):
            self._profile = profile
            super().__init__(source, name=name, digest=digest, schema=schema)

        @property
        def profile(self) -> dict[str, Any]:
            return self._profile

        def to_dict(self) -> dict[str, str]:
            return super().to_dict() | {"profile": json.dumps(self._profile)}

    return FeedlineMLflowDataset


def _source(url: str) -> Any:
    """MLflow's dataset source for ``url`` (local path or a URL scheme MLflow knows)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.exceptions import MlflowException

    try:
        with warnings.catch_warnings():  # MLflow registers local paths twice ("" and file://)
            warnings.filterwarnings("ignore", "The specified dataset source can be interpreted")
            return resolve_dataset_source(url)
    except MlflowException as exc:
        raise ConfigurationError(
            f"log_dataset: MLflow has no dataset source for {url!r} ({exc.message}). Fix: log "
            "a dataset on a local path or on storage MLflow knows (s3://, gs://, ...)."
        ) from exc


def _artifact_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "dataset"
    return cleaned[:100]


def log_dataset(
    ds_or_path: Dataset | str | os.PathLike[str],
    *,
    name: str | None = None,
    context: str = "training",
    storage_options: dict[str, Any] | None = None,
    run: Any = None,
) -> None:
    """Log a written feedline dataset to an MLflow run as a dataset input (never its data).

    Records, with ``mlflow``'s dataset input API: ``name``; the digest
    :func:`dataset_digest` (a fingerprint of the manifest's shard checksums); the source (the
    dataset's URL, as an MLflow local/S3/... source); the schema (MLflow column types, ``any``
    where MLflow has none, the Arrow schema in the profile); and a profile with ``num_rows``,
    ``num_shards``, ``num_bytes`` and the dataset ``version`` (and its commit time), which
    ``fl.open(path, version=...)`` opens again while it is retained. The manifest's fitted
    preprocessor state and lineage are logged as ``feedline/<name>/preprocessors.json`` and
    ``feedline/<name>/lineage.json``.

    Parameters
    ----------
    ds_or_path:
        ``fl.open(path)`` of a written dataset, or the path. With operators on top (e.g. a
        ``select``), the stored dataset it reads is logged.
    name:
        The dataset's name in MLflow (default: the folder's name).
    context:
        The input's ``mlflow.data.context`` tag (``"training"``, ``"validation"``, ...).
    storage_options:
        fsspec options to open ``ds_or_path`` when it is a URL.
    run:
        The run (or run id) to log to; default the active run.

    Examples
    --------
    >>> import feedline as fl, mlflow  # doctest: +SKIP
    >>> with mlflow.start_run():  # doctest: +SKIP
    ...     log_dataset(fl.open("out/train"), name="train")
    """
    mlflow = _mlflow("feedline.tracking.log_dataset")
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    run_id = _run_id(mlflow, run, "log_dataset")
    manifest, url = _manifest_of(ds_or_path, storage_options)
    name = name or url.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    profile = {
        "num_rows": manifest.rows,
        "num_shards": len(manifest.shards),
        "num_bytes": manifest.bytes,
        "format": "feedline",
        "format_version": manifest.format_version,
        "created": manifest.created,
        "version": manifest.version_id,  # fl.open(path, version=...) reads it again
        "version_time": str(manifest.version.get("time") or manifest.created),
        "arrow_schema": [f"{f.name}: {f.type}" for f in manifest.schema],
    }
    dataset = _dataset_class()(
        _source(url), name, dataset_digest(manifest), _mlflow_schema(manifest.schema), profile
    )
    tags = [InputTag(key=MLFLOW_DATASET_CONTEXT, value=context)] if context else []
    client, folder = mlflow.MlflowClient(), f"feedline/{_artifact_name(name)}"
    try:
        client.log_inputs(run_id, [DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags)])
        client.log_dict(run_id, {"preprocessors": manifest.preprocessors},
                        f"{folder}/preprocessors.json")  # fmt: skip
        client.log_dict(run_id, {"source": url, "lineage": manifest.lineage},
                        f"{folder}/lineage.json")  # fmt: skip
    except mlflow.exceptions.MlflowException as exc:
        raise ConfigurationError(
            f"log_dataset: logging {url!r} to MLflow run {run_id!r} failed: {exc.message}. "
            "Fix: check the tracking store and that the run is active."
        ) from exc
