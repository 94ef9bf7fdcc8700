"""Getting a Ray cluster's workers ready for feedline, with no environment set by hand.

Two things must hold before a feedline stage runs in a Ray worker:

1. **feedline importable on every node, the driver's version.** The first time a
   :class:`~feedline.engines.ray.engine.RayEngine` uses a Ray job, :func:`check_workers` runs one
   probe task on every alive node (pinned to it). The probe is pickled by value and needs
   nothing but the standard library, so it runs where feedline is missing. When a node
   cannot import feedline (or holds another version) and the engine started the Ray
   connection itself, it reconnects with ``runtime_env={"py_modules": [feedline]}``
   (feedline is pure Python: Ray uploads the package once and puts it first on every
   worker's ``sys.path``), merged into the caller's own ``runtime_env``, and probes again.
   When the caller started Ray (``ray.init`` before the engine), the job's
   ``runtime_env`` cannot change: it raises :class:`~feedline.errors.ConfigurationError`
   naming the fix. Missing ``numpy``/``pyarrow`` on a node also raises.
2. **The user's own modules.** Functions and classes given to ``map_batches``/``filter``
   that live in the user's modules (files outside the interpreter's library folders) are
   pickled by reference; a worker that cannot import them would fail. Before a plan runs,
   :func:`ship_user_modules` probes the nodes for those modules and registers the missing
   ones with ``ray.cloudpickle.register_pickle_by_value``, so their functions travel with
   the tasks (for this driver process; Ray's documented remedy).

A working directory the workers should see can still be given the documented Ray way:
``RayEngine(address, init_kwargs={"runtime_env": {"working_dir": "."}})``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from feedline._version import __version__
from feedline.engines.batch.user_modules import user_modules as find_user_modules
from feedline.errors import ConfigurationError

__all__ = ["check_workers", "feedline_runtime_env", "ship_user_modules", "user_modules"]

_LOCK = threading.Lock()
#: Ray job ids whose nodes passed the probe
_CHECKED: set[str] = set()
#: (job id, top-level module) pairs already checked or shipped
_SHIPPED: set[tuple[str, str]] = set()


def _probe_source() -> Any:
    """A closure (so cloudpickle sends it by value) that imports only the standard library
    before trying feedline: it runs on a worker without feedline."""

    def probe(names: list[str]) -> dict[str, Any]:
        import importlib as _importlib
        import importlib.util as _util
        import sys as _sys

        found: dict[str, Any] = {"python": _sys.executable, "version": "", "problem": ""}
        try:
            import numpy  # noqa: F401
            import pyarrow  # noqa: F401 - the engine's own dependencies

            # the worker's own feedline, if any: imported by name, as a probe of that host
            version = _importlib.import_module("feedline._version")
            found["version"] = version.__version__
        except ImportError as exc:
            found["problem"] = f"{type(exc).__name__}: {exc}"

        def importable(name: str) -> bool:
            # a plain folder of that name on sys.path (a namespace package, no origin file)
            # is not the user's module: the driver only ships modules loaded from a file
            spec = _util.find_spec(name)
            return spec is not None and spec.origin not in (None, "namespace")

        found["missing"] = [name for name in names if not importable(name)]
        return found

    return probe


def _nodes() -> list[tuple[str, str]]:
    """``(node id, address)`` of the alive nodes that run tasks."""
    import ray

    return [
        (node["NodeID"], node.get("NodeManagerAddress", "?"))
        for node in ray.nodes()
        if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0
    ]


def probe_nodes(names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the probe on every alive node; ``{node id: what it found}``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(_probe_source())
    refs = {}
    for node, address in _nodes():
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        refs[node] = (address, remote.options(scheduling_strategy=strategy).remote(names or []))
    results = {}
    for node, (address, ref) in refs.items():
        results[node] = ray.get(ref) | {"address": address}
    return results


def feedline_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """``runtime_env`` with feedline's package folder added to its ``py_modules``.

    Examples
    --------
    >>> import os
    >>> env = feedline_runtime_env({"env_vars": {"A": "1"}})
    >>> env["env_vars"], [os.path.basename(p) for p in env["py_modules"]]
    ({'A': '1'}, ['feedline'])
    """
    folder = str(Path(__file__).resolve().parents[2])  # feedline/
    env = dict(runtime_env or {})
    modules = list(env.get("py_modules") or [])
    if folder not in modules:
        modules.append(folder)
    env["py_modules"] = modules
    return env


def _unfit(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:

    return [r for r in results.values() if r["problem"] or r["version"] != __version__]


def check_workers(reconnect: Any = None) -> None:
    """Make sure every node of the current Ray job can run feedline (once per job).

    ``reconnect(runtime_env_update)`` restarts the connection with feedline shipped
    (given when the engine owns the connection); without it, unfit nodes raise
    :class:`~feedline.errors.ConfigurationError`.
    """
    import ray

    job = ray.get_runtime_context().get_job_id()
    with _LOCK:
        if job in _CHECKED:
            return
    unfit = _unfit(probe_nodes())
    if unfit and reconnect is not None and all(_shippable(r) for r in unfit):
        reconnect()
        job = ray.get_runtime_context().get_job_id()
        unfit = _unfit(probe_nodes())
    if unfit:
        raise _unfit_error(unfit, shipped=reconnect is not None)
    with _LOCK:
        _CHECKED.add(job)


def _shippable(result: dict[str, Any]) -> bool:
    """feedline itself is missing or another version: shipping it helps."""
    problem = result["problem"]
    return not problem or ("No module named" in problem and "'feedline" in problem)


def _unfit_error(unfit: list[dict[str, Any]], *, shipped: bool) -> ConfigurationError:

    first = unfit[0]
    where = f"{len(unfit)} Ray node(s), e.g. {first['address']} ({first['python']})"
    if first["problem"] and not _shippable(first):
        return ConfigurationError(
            f"{where} cannot import what feedline needs ({first['problem']}). Fix: install "
            "numpy and pyarrow (pip install 'feedline[ray]') in the Python of every Ray node."
        )
    found = first["version"] or "no feedline"
    if shipped:
        return ConfigurationError(
            f"{where} still run {found} after feedline {__version__} was shipped with "
            "runtime_env py_modules. Fix: install feedline=={__version__} on every Ray node, "
            "or check that the cluster allows runtime_env uploads."
        )
    return ConfigurationError(
        f"{where} run {found}, not the driver's feedline {__version__}, and Ray was "
        "started outside the engine, so feedline cannot ship itself. Fix: let the engine "
        "connect (RayEngine(address=...), without calling ray.init first), or call "
        "ray.init(address, runtime_env={'py_modules': [feedline]}) yourself, or install "
        f"feedline=={__version__} on every Ray node."
    )


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
    from ray import cloudpickle

    return find_user_modules(objects, cloudpickle, ("ray",))


def ship_user_modules(objects: Any) -> list[str]:
    """Send the user modules ``objects`` refer to by value where a node cannot import them
    (see the module docstring); returns the names registered now."""
    import ray
    from ray import cloudpickle

    job = ray.get_runtime_context().get_job_id()
    names = [n for n in user_modules(objects) if (job, n) not in _SHIPPED]
    if not names:
        return []
    missing = sorted({n for r in probe_nodes(names).values() for n in r["missing"]})
    with _LOCK:
        for name in names:
            _SHIPPED.add((job, name))
        for name in missing:
            cloudpickle.register_pickle_by_value(sys.modules[name])
    return missing
