"""Typed, explicit public signatures: what ``help()`` and IDEs show is the whole contract.

The walk covers ``feedline.__all__`` (functions, classes and the ``__all__`` of exported
modules), the public methods of those classes (``Dataset``, ``Loader``, the engines, every
preprocessor, ``fl.config``) and the objects public methods hand out (``GroupedDataset``).
Every parameter and return is annotated, and no entry point hides its parameters behind
``*args``/``**kwargs`` except those in :data:`CATCH_ALLS`, each with its reason.
"""

from __future__ import annotations

import inspect
import pydoc
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

import feedline as fl
from feedline.preprocess.base import Preprocessor
from feedline.dataset.grouped import GroupedDataset

#: the variadic parameters that stay, and why
CATCH_ALLS = {
    # any number of datasets, as SQL UNION ALL / polars.concat take them
    "Dataset.union": "*others",
    # column name -> expression pairs, as polars' with_columns(**named_exprs)
    "Dataset.with_columns": "**named",
    # output name -> (column, function) pairs, as pandas' named aggregation agg(**kwargs)
    "GroupedDataset.agg": "**aggs",
    # Spark configuration keys are open-ended (SparkSession.builder.config(key, value));
    # the values are typed (str | int | float | bool)
    "spark_session": "**conf",
}

#: user-facing calls whose parameters and result may not be typed as a bare ``Any``
NO_BARE_ANY = (
    "Dataset.transform", "Dataset.to_pandas", "Dataset.to_polars", "Dataset.to_spark",
    "Dataset.to_ray", "Dataset.streaming_split", "Dataset.aggregate", "get_engine",
    "from_pandas", "from_polars", "from_numpy", "from_spark", "from_ray", "from_huggingface",
    "spark_session", "Loader.as_torch_dataset", "Loader.to_tf_dataset",
)  # fmt: skip


def _own(function: object) -> bool:
    return getattr(function, "__module__", "").startswith("feedline")


def _classes() -> list[type]:
    from feedline import preprocess

    found = [fl.__dict__[name] for name in fl.__all__ if isinstance(fl.__dict__[name], type)]
    found += [getattr(preprocess, n) for n in preprocess.__all__]
    found += [GroupedDataset, Preprocessor, type(fl.config)]
    unique = {c for c in found if isinstance(c, type) and not issubclass(c, BaseException)}
    return sorted(unique, key=lambda c: c.__name__)


def _modules() -> list[ModuleType]:
    return [v for n in fl.__all__ if isinstance(v := getattr(fl, n), ModuleType)]


def entry_points() -> Iterator[tuple[str, Callable[..., object]]]:
    """(qualified name, function) of every public function and method."""
    for name in fl.__all__:
        value = getattr(fl, name)
        if inspect.isfunction(value):
            yield name, value
    for module in _modules():
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.isfunction(value) and _own(value):
                yield f"{module.__name__.rsplit('.', 1)[-1]}.{name}", value
    for cls in _classes():
        for name, value in inspect.getmembers(cls):
            if name.startswith("_") and name != "__init__":
                continue
            function = value.fget if isinstance(value, property) else value
            function = getattr(function, "__func__", function)  # classmethods
            if inspect.isfunction(function) and _own(function):
                yield f"{cls.__name__}.{name}", function


ENTRY_POINTS = dict(entry_points())


def test_the_walk_sees_the_main_entry_points() -> None:
    for name in ("Dataset.write", "Dataset.loader", "Loader.__init__", "StandardScaler.fit",
                 "LocalEngine.execute", "read_parquet", "get_engine", "tracking.log_dataset",
                 "GroupedDataset.agg", "Config.progress"):  # fmt: skip
        assert name in ENTRY_POINTS, name
    assert len(ENTRY_POINTS) > 300


def test_no_catch_all_parameters() -> None:
    offenders = {}
    for name, function in ENTRY_POINTS.items():
        variadic = {
            ("*" if p.kind is p.VAR_POSITIONAL else "**") + p.name
            for p in inspect.signature(function).parameters.values()
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        if not variadic <= {CATCH_ALLS.get(name)}:
            offenders[name] = variadic
    assert not offenders, offenders


def test_every_parameter_and_the_return_are_annotated() -> None:
    offenders = {}
    for name, function in ENTRY_POINTS.items():
        signature = inspect.signature(function)
        missing = [
            p.name
            for i, p in enumerate(signature.parameters.values())
            if p.annotation is p.empty and not (i == 0 and p.name in ("self", "cls"))
        ]
        if signature.return_annotation is signature.empty:
            missing.append("return")
        if missing:
            offenders[name] = missing
    assert not offenders, offenders


def test_catch_alls_still_exist() -> None:
    for name, parameter in CATCH_ALLS.items():
        assert parameter.lstrip("*") in inspect.signature(ENTRY_POINTS[name]).parameters, name


@pytest.mark.parametrize("name", NO_BARE_ANY)
def test_user_facing_calls_name_their_types(name: str) -> None:
    signature = inspect.signature(ENTRY_POINTS[name])
    bare = [p.name for p in signature.parameters.values() if p.annotation in ("Any", "list[Any]")]
    assert not bare, f"{name}: parameters {bare} are typed Any"
    assert signature.return_annotation not in ("Any", "list[Any]"), f"{name} returns Any"


def test_help_shows_the_loader_parameters_and_defaults() -> None:
    text = pydoc.render_doc(fl.Dataset.loader, renderer=pydoc.plaintext)
    for shown in ("batch_size: 'int' = 256", "shuffle: 'bool' = True", "cache: 'str' = 'auto'",
                  "memory_budget: 'int | str' = '2GB'", "num_workers: 'int' = 0",
                  "-> 'Loader'"):  # fmt: skip
        assert shown in text, shown


def test_help_shows_write_progress_and_engine_options() -> None:
    write = pydoc.render_doc(fl.Dataset.write, renderer=pydoc.plaintext)
    assert "progress: 'bool | None' = None" in write
    assert "options: 'Mapping[str, Any] | None' = None" in pydoc.render_doc(
        fl.get_engine, renderer=pydoc.plaintext
    )
