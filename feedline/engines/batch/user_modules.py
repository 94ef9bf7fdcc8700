"""Which of the user's own modules a plan's functions refer to by name (to ship them to workers).

Spark's and Ray's cloudpickle send functions of ``__main__`` by value but refer to functions of
other modules by name: a worker that cannot import such a module fails. Both engines find those
modules the same way, with their own cloudpickle, and ship them (``addPyFile`` on Spark,
``register_pickle_by_value`` on Ray).
"""

from __future__ import annotations

import io
import os
import sys
import sysconfig
from collections.abc import Iterable
from typing import Any

__all__ = ["user_modules"]


def _library_roots() -> tuple[str, ...]:
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def user_modules(objects: Any, cloudpickle: Any, engine_packages: Iterable[str] = ()) -> list[str]:
    """Top-level names of the user modules that pickling ``objects`` refers to by name.

    A user module is one loaded from a file outside the interpreter's library folders
    (stdlib, site-packages), other than feedline, ``__main__`` (whose functions cloudpickle
    sends by value) and ``engine_packages``, and not registered with
    ``register_pickle_by_value`` of ``cloudpickle`` (the engine's own copy of it).

    Examples
    --------
    >>> import json
    >>> from ray import cloudpickle
    >>> user_modules([json.dumps, len], cloudpickle, ("ray",))
    []
    """
    seen: set[str] = set()

    class _Recorder(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            module = getattr(obj, "__module__", None)
            if isinstance(module, str) and (isinstance(obj, type) or callable(obj)):
                seen.add(module)
            return super().reducer_override(obj)

    _Recorder(io.BytesIO()).dump(objects)
    roots = _library_roots()
    skip = {"feedline", "__main__", *engine_packages}
    found = set()
    for name in seen:
        module = sys.modules.get(name)
        top = name.split(".")[0]
        if module is None or top in skip:
            continue
        if cloudpickle.cloudpickle._is_registered_pickle_by_value(module):
            continue
        file = getattr(sys.modules.get(top), "__file__", None)
        if file and not os.path.realpath(file).startswith(roots):
            found.add(top)
    return sorted(found)
