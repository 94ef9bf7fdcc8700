"""The public surface: ``feedline.__all__`` is sorted, complete and importable."""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import feedline as fl


def test_all_is_sorted_and_unique() -> None:
    assert list(fl.__all__) == sorted(fl.__all__)
    assert len(set(fl.__all__)) == len(fl.__all__)


def test_every_exported_name_exists() -> None:
    for name in fl.__all__:
        assert hasattr(fl, name), name


def test_every_public_attribute_is_exported() -> None:
    public = {
        name
        for name, value in vars(fl).items()
        if not name.startswith("_") and not isinstance(value, type(fl))
    }
    assert public <= set(fl.__all__), public - set(fl.__all__)


def test_contract_names_from_design() -> None:
    for name in (
        "read_parquet", "read_csv", "read_jsonl", "read_images", "read_text",
        "from_arrow", "from_pandas", "from_polars", "open", "Dataset", "FeedlineError",
    ):  # fmt: skip
        assert name in fl.__all__, name


def test_every_module_imports_without_side_effects(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for info in pkgutil.walk_packages(fl.__path__, "feedline."):
        if info.name.startswith(("feedline.engines.spark", "feedline.engines.ray")):
            continue
        importlib.import_module(info.name)
    assert list(tmp_path.iterdir()) == []  # importing wrote nothing


def test_error_tree() -> None:
    for name in ("SchemaError", "DataError", "FormatError", "IntegrityError",
                 "IncompleteDatasetError", "UserFunctionError", "ConfigurationError",
                 "MissingDependencyError"):  # fmt: skip
        assert issubclass(getattr(fl, name), fl.FeedlineError)


# ---------------------------------------------------------------- the surface, before and after

#: the public surface taken on the layout before the "One house" move (same walk as below)
BEFORE = Path(__file__).parent / "fixtures" / "public_api_before.json"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _default(value: Any) -> str | None:
    return None if value is inspect.Parameter.empty else _ADDRESS.sub("", repr(value))


def _signature(function: Any) -> list[list[Any]] | None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, _default(p.default)] for p in signature.parameters.values()]


def _class_surface(cls: type) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in ("__init__", "__call__", "__iter__", "__len__"):
            continue
        attribute = inspect.getattr_static(cls, name, None)
        if isinstance(attribute, property):
            members[name] = "property"
        elif isinstance(attribute, staticmethod | classmethod):
            members[name] = _signature(getattr(cls, name))
        elif inspect.isfunction(attribute):
            members[name] = _signature(attribute)
        elif isinstance(attribute, type):
            members[name] = "class"
    return members


def _surface(value: Any) -> Any:
    if isinstance(value, ModuleType):
        names = sorted(getattr(value, "__all__", ()))
        return {"module": {n: _surface(getattr(value, n)) for n in names}}
    if isinstance(value, type):
        if issubclass(value, BaseException):
            return {"exception": [b.__name__ for b in value.__mro__[1:2]]}
        if issubclass(value, enum.Enum):
            return {"enum": [m.name for m in value]}
        return {"class": _class_surface(value)}
    if callable(value):
        return {"function": _signature(value)}
    return {"value": type(value).__name__}


def surface() -> dict[str, Any]:
    """The public surface now: ``fl.*`` and the documented paths (``make_catalog`` moved from
    ``feedline.datasets`` to :mod:`feedline.demo.synthetic`)."""
    from feedline.demo.synthetic import make_catalog
    from feedline.loader import nodes
    from feedline.preprocess import from_state

    return {
        "feedline": _surface(fl),
        "feedline.config (instance)": {"class": _class_surface(type(fl.config))},
        "feedline.preprocess.from_state": _surface(from_state),
        "feedline.loader.nodes": _surface(nodes),
        "make_catalog": _surface(make_catalog),
    }


def _compatible_parameters(before: list, after: list, where: str) -> list[str]:
    """Each parameter of before is in after with its kind and default, in the same order;
    parameters added since have defaults (so every call that worked still works)."""
    problems = []
    names = [p[0] for p in before]
    kept = [p for p in after if p[0] in names]
    if kept != before:
        problems.append(f"{where}: parameters {before} became {after}")
    added = [p for p in after if p[0] not in names]
    for name, kind, default in added:
        if default is None and kind not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            problems.append(f"{where}: new parameter {name!r} has no default")
    return problems


def lost(before: Any, after: Any, where: str = "fl") -> list[str]:
    """What ``before`` offered that ``after`` no longer does (additions are fine)."""
    if isinstance(before, dict):
        if not isinstance(after, dict):
            return [f"{where}: was {before!r:.80}, now {after!r:.80}"]
        out = []
        for key, value in before.items():
            if key not in after:
                out.append(f"{where}.{key}: gone")
            else:
                out.extend(lost(value, after[key], f"{where}.{key}"))
        return out
    if isinstance(before, list) and before and isinstance(before[0], list):
        if not isinstance(after, list):
            return [f"{where}: parameters {before} became {after!r}"]
        return _compatible_parameters(before, after, where)
    return [] if before == after else [f"{where}: was {before!r}, now {after!r}"]


def test_nothing_public_was_lost_in_the_move() -> None:
    before = json.loads(BEFORE.read_text())
    assert lost(before, json.loads(json.dumps(surface()))) == []


def test_the_comparison_sees_a_lost_name_a_changed_default_and_a_new_required_parameter():
    before = {"f": {"function": [["a", "POSITIONAL_OR_KEYWORD", None], ["b", "KEYWORD_ONLY", "1"]]}}
    same = json.loads(json.dumps(before))
    assert lost(before, same) == []
    added = {"f": {"function": [*before["f"]["function"], ["c", "KEYWORD_ONLY", "None"]]}}
    assert lost(before, added) == []
    assert lost(before, {}) == ["fl.f: gone"]
    changed = {
        "f": {"function": [["a", "POSITIONAL_OR_KEYWORD", None], ["b", "KEYWORD_ONLY", "2"]]}
    }
    assert len(lost(before, changed)) == 1
    required = {"f": {"function": [*before["f"]["function"], ["c", "KEYWORD_ONLY", None]]}}
    assert lost(before, required) == ["fl.f.function: new parameter 'c' has no default"]


def test_the_documented_import_paths_work() -> None:
    """The paths the docs import from, besides ``fl.*`` (they are real modules, not names
    the lazy root hands out)."""
    import feedline.charts
    import feedline.tracking
    from feedline.demo.synthetic import make_catalog
    from feedline.loader import Loader, Windows, nodes
    from feedline.preprocess import StandardScaler, from_state

    assert fl.charts is feedline.charts and fl.tracking is feedline.tracking
    assert callable(feedline.charts.plot_loader_timeline) and callable(make_catalog)
    assert (Loader, Windows, StandardScaler) == (fl.Loader, fl.Windows, fl.StandardScaler)
    assert callable(from_state) and callable(nodes.Map)
