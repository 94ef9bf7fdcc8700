"""``doctor``: why a training loop would wait for data, and what to change.

The work behind ``feedline doctor PATH``: a loader over ``PATH`` (with the transform named
``module:fn``, if any) diagnosed by :func:`feedline.loader.profiling.diagnose.diagnose`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from feedline.errors import ConfigurationError
from feedline.loader.loader import Loader
from feedline.loader.profiling.diagnose import Diagnosis
from feedline.store.shard_source import open_shard_source

__all__ = ["doctor", "load_callable"]


def load_callable(spec: str) -> Callable[..., Any]:
    """The function ``module:name`` names (the current folder is importable too).

    Examples
    --------
    >>> load_callable("math:sqrt")(9.0)
    3.0
    """
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigurationError(
            f"--transform {spec!r} names no function. Fix: pass module:function, e.g. "
            "my_transforms:decode (a module importable from the current folder)."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"--transform {spec!r}: cannot import {module_name!r} ({exc}). Fix: run from the "
            "folder holding the module, or install it."
        ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigurationError(
            f"--transform {spec!r}: {module_name} has no function {name!r}. Fix: name a "
            "module-level function fn(sample, rng) -> dict."
        )
    return fn


def doctor(
    path: Any,
    *,
    step_ms: float = 0.0,
    transform: str | None = None,
    seconds: float = 5.0,
    chart: str | os.PathLike[str] | None = None,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    **loader_kwargs: Any,
) -> tuple[Diagnosis, str | None]:
    """Diagnose a loader over ``path`` against a ``step_ms`` training step for ``seconds``.

    Returns the :class:`~feedline.loader.profiling.diagnose.Diagnosis` and the chart's path
    (``None`` without ``chart``).

    Examples
    --------
    >>> import feedline as fl
    >>> d, chart = doctor(fl.range(512), step_ms=1, seconds=0.2, batch_size=32, format="numpy")
    >>> type(d).__name__, chart, "samples/s" in d.verdict
    ('Diagnosis', None, True)
    """
    if transform is not None:
        loader_kwargs["transform"] = load_callable(transform)
    if storage_options is not None and isinstance(path, str | os.PathLike):
        path = open_shard_source(path, storage_options)
    loader = Loader(path, **loader_kwargs)
    found = loader.diagnose(step_ms, seconds=seconds, verify=verify)
    drawn = None if chart is None else str(found.plot(chart))
    return found, drawn
