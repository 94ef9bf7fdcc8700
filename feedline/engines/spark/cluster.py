"""Getting a Spark cluster's executors ready for feedline, with no environment set by hand.

Three things must hold before a feedline stage can run in an executor's Python worker:

1. **The right interpreter.** PySpark starts workers with the driver's ``PYSPARK_PYTHON``
   (``python3`` when unset: on a standalone cluster that is the system Python, without
   feedline). :func:`python_for_executors` picks ``spark.pyspark.python`` when the caller
   set it, else ``PYSPARK_PYTHON``, else *this* interpreter (``sys.executable``): right
   when the executors share this machine or its filesystem (``local[n]``, a standalone
   cluster on one host, a container image where every node has the same venv). On a
   cluster whose nodes have feedline elsewhere, pass
   ``spark_session(master, **{"spark.pyspark.python": "/path/on/the/workers/python"})``.
2. **feedline importable there.** On the first job of a SparkContext whose master is not
   ``local``, :func:`check_executors` runs a one-task probe job. When the workers' Python
   runs but lacks feedline, feedline (pure Python) is zipped and shipped with
   ``addPyFile`` and the probe runs again; when Python cannot start, or feedline's
   dependencies (pyarrow, numpy) are missing, or the workers hold another feedline
   version, it raises :class:`~feedline.errors.ConfigurationError` naming the fix.
3. **The user's own modules.** Functions and classes given to ``map_batches``/``filter``
   that live in the user's modules (not in site-packages) are pickled by reference; a
   worker would fail with ``No module named ...``. :func:`ship_user_modules` finds those
   modules by pickling the plan's operators and ships each top-level module or package
   once per SparkContext with ``addPyFile`` (a package as a zip). A worker that still
   cannot import a module fails with a ``ConfigurationError`` naming it
   (:func:`missing_module_error`).
"""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

from feedline._version import __version__
from feedline.engines.batch.user_modules import user_modules as find_user_modules
from feedline.errors import ConfigurationError

__all__ = [
    "check_executors",
    "missing_module_error",
    "python_for_executors",
    "ship_user_modules",
    "user_modules",
]

_LOCK = threading.Lock()
#: application ids whose executors passed the probe
_CHECKED: set[str] = set()
#: (application id, top-level module) pairs already shipped
_SHIPPED: set[tuple[str, str]] = set()


def python_for_executors(conf: dict[str, Any]) -> str:
    """The interpreter the executors should run (see the module docstring, point 1).

    Examples
    --------
    >>> python_for_executors({"spark.pyspark.python": "/opt/py/bin/python"})
    '/opt/py/bin/python'
    >>> python_for_executors({}) == (os.environ.get("PYSPARK_PYTHON") or sys.executable)
    True
    """
    chosen = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    return str(chosen or sys.executable)


def is_local_master(master: str) -> bool:
    """``local``, ``local[4]``, ``local-cluster[...]`` share the driver's machine and paths."""
    return master.startswith("local")


# ----------------------------------------------------------------------------- the probe


def _probe_source() -> Any:
    """A function pickled by value (a closure), using builtins only, so unpickling it on a
    worker needs no feedline."""

    def probe(_: Any) -> tuple[str, str, str]:
        import importlib as _importlib
        import sys as _sys

        try:
            import numpy  # noqa: F401
            import pyarrow  # noqa: F401 - the engine's own dependencies

            # the worker's own feedline, if any: imported by name, as a probe of that host
            version = _importlib.import_module("feedline._version")

        except ImportError as exc:  # report what is missing rather than failing the task
            return (_sys.executable, "", f"{type(exc).__name__}: {exc}")
        return (_sys.executable, version.__version__, "")

    return probe


def _run_probe(context: Any) -> tuple[str, str, str]:
    return context.parallelize([0], 1).map(_probe_source()).collect()[0]


def check_executors(spark: Any) -> None:
    """Make sure the executors of ``spark`` can run feedline (once per application).

    A no-op for ``local`` masters (their workers run this interpreter). Raises
    :class:`~feedline.errors.ConfigurationError` when the executors cannot be made ready.

    Examples
    --------
    >>> spark = spark_session("spark://127.0.0.1:7077")  # doctest: +SKIP
    >>> check_executors(spark)  # doctest: +SKIP
    """
    context = spark.sparkContext
    if is_local_master(context.master):
        return
    app = context.applicationId
    with _LOCK:
        if app in _CHECKED:
            return
        python = context.pythonExec
        try:
            executable, version, problem = _run_probe(context)
        except Exception as exc:  # noqa: BLE001 - Python could not even start: say why
            raise _no_python(context.master, python, exc) from None
        if problem.startswith("ModuleNotFoundError") and "'feedline" in problem:
            _add_py_file(context, _feedline_zip())
            executable, version, problem = _run_probe(context)
        if problem:
            raise ConfigurationError(
                f"The executors of {context.master} run {executable}, which cannot import "
                f"what feedline needs ({problem}). Fix: install feedline with its Spark extra "
                "on every worker (pip install 'feedline[spark]') and pass that interpreter: "
                f"spark_session({context.master!r}, **{{'spark.pyspark.python': "
                "'/path/to/python'}})."
            )

        if version != __version__:
            raise ConfigurationError(
                f"The executors of {context.master} run feedline {version} ({executable}) "
                f"but the driver runs {__version__}; results could differ. Fix: install "
                f"feedline=={__version__} on the workers, or point spark.pyspark.python at an "
                "interpreter that has it."
            )
        _CHECKED.add(app)


def _no_python(master: str, python: str, exc: BaseException) -> ConfigurationError:
    text = str(exc)
    found = re.search(r"Cannot run program \"([^\"]+)\"", text)
    why = f"cannot start {found.group(1)!r}" if found else _first_line(text)
    return ConfigurationError(
        f"The executors of {master} cannot run Python {python!r} ({why}). Fix: pass the path "
        f"of a Python with feedline installed on every worker: spark_session({master!r}, "
        "**{'spark.pyspark.python': '/path/to/python'})."
    )


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:300]
    return text.strip().splitlines()[0][:300] if text.strip() else "unknown error"


def _add_py_file(context: Any, path: str) -> None:
    """``addPyFile`` for the executors only: PySpark also puts a zip on the driver's
    ``sys.path``, where it would shadow the driver's own packages."""
    before = list(sys.path)
    context.addPyFile(path)
    sys.path[:] = before


def _feedline_zip() -> str:
    """feedline's package zipped once per process (it is pure Python)."""
    return _zip_package("feedline", Path(__file__).resolve().parents[2])


def _zip_package(name: str, folder: Path) -> str:
    out = Path(tempfile.gettempdir()) / f"feedline-pyfiles-{os.getpid()}" / f"{name}.zip"
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, Path(name) / path.relative_to(folder))
    out.write_bytes(buffer.getvalue())
    return str(out)


# ----------------------------------------------------------------------------- user modules


def user_modules(objects: Any) -> list[str]:
    """Top-level names of the user modules that pickling ``objects`` refers to by name (see
    :func:`feedline.engines.batch.user_modules.user_modules`).

    Examples
    --------
    >>> import json
    >>> user_modules([json.dumps, len])
    []
    """
    from pyspark import cloudpickle

    return find_user_modules(objects, cloudpickle, ("pyspark", "py4j"))


def ship_user_modules(spark: Any, objects: Any) -> list[str]:
    """Ship the user modules ``objects`` refer to (see :func:`user_modules`) to the
    executors with ``addPyFile``, once per application; returns the names shipped now.

    Nothing is shipped for ``local`` masters (their workers see the driver's files).

    Examples
    --------
    >>> import mylib  # doctest: +SKIP
    >>> ship_user_modules(spark, [mylib.clean])  # doctest: +SKIP
    ['mylib']
    """
    context = spark.sparkContext
    if is_local_master(context.master):
        return []
    app = context.applicationId
    shipped = []
    with _LOCK:
        for top in user_modules(objects):
            if (app, top) in _SHIPPED:
                continue
            module = sys.modules[top]
            assert module.__file__ is not None  # user_modules() finds modules by their file
            file = Path(module.__file__)
            if hasattr(module, "__path__"):  # a package: zip its folder
                _add_py_file(context, _zip_package(top, file.parent))
            else:
                _add_py_file(context, str(file))
            _SHIPPED.add((app, top))
            shipped.append(top)
    return shipped


def missing_module_error(text: str) -> ConfigurationError | None:
    """A worker's ``No module named ...`` failure (in a Spark exception's ``text``) as a
    :class:`~feedline.errors.ConfigurationError` naming the fix, else ``None``.

    Examples
    --------
    >>> print(missing_module_error("ModuleNotFoundError: No module named 'mylib'"))
    A Spark worker cannot import the module 'mylib' ... Fix: ...
    >>> missing_module_error("ValueError: bad") is None
    True
    """
    found = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
    if found is None:
        return None
    name = found.group(1)
    return ConfigurationError(
        f"A Spark worker cannot import the module {name!r} that the plan's functions need. "
        f"Fix: install it in the workers' Python (spark.pyspark.python), or ship it with "
        f"spark.sparkContext.addPyFile('/path/to/{name.split('.')[0]}.py or .zip') before "
        "running the plan."
    )
