"""Typed, explicit public signatures: what ``help()`` and IDEs show is the whole contract.

The walk covers ``feedline.__all__`` (functions, classes and the ``__all__`` of exported
modules), the public methods of those classes (``Dataset``, ``Loader``, the engines, every
preprocessor, ``fl.config``) and the objects public methods hand out (``GroupedDataset``).
Every parameter and return is annotated, and no entry point hides its parameters behind
``*args``/``**kwargs`` except those in :data:`CATCH_ALLS`, each with its reason. The loader's
options are the one family taken as ``*args, **options`` in the code: they are written once
(the fields of ``LoaderOptions``) and shown one by one, by name, kind, type and default, in
the ``__signature__`` that ``options_signature`` derives from them (what ``help()`` and
``inspect`` read), so they are checked here through that signature, and the code's
catch-all is allowed only where that derived signature is present.
"""

from __future__ import annotations

import inspect
import pydoc
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

import feedline as fl
from feedline.dataset.grouped import GroupedDataset
from feedline.loader.options import LoaderOptions
from feedline.preprocess.preprocessor import Preprocessor

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

#: the loader's options as parameters, in order: the tail of every signature that takes them
LOADER_OPTIONS = list(inspect.signature(LoaderOptions).parameters.values())


def _shown_variadics(function: Callable[..., object]) -> set[str]:
    """The catch-alls ``help()`` and ``inspect.signature`` show."""
    return {
        ("*" if p.kind is p.VAR_POSITIONAL else "**") + p.name
        for p in inspect.signature(function).parameters.values()
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _code_variadics(function: Callable[..., object]) -> set[str]:
    """The catch-alls the code takes (a ``__signature__`` may show explicit parameters)."""
    code = function.__code__
    names = iter(code.co_varnames[code.co_argcount + code.co_kwonlyargcount :])
    found = {"*" + next(names)} if code.co_flags & inspect.CO_VARARGS else set()
    return found | ({"**" + next(names)} if code.co_flags & inspect.CO_VARKEYWORDS else set())


def _shows_the_loader_options(function: Callable[..., object]) -> bool:
    """True when the function's ``__signature__`` ends with every loader option, in order."""
    shown = function.__dict__.get("__signature__")
    tail = list(shown.parameters.values())[-len(LOADER_OPTIONS) :] if shown else []
    return tail == LOADER_OPTIONS


def test_the_walk_sees_the_main_entry_points() -> None:
    for name in ("Dataset.write", "Dataset.loader", "Loader.__init__", "StandardScaler.fit",
                 "LocalEngine.execute", "read_parquet", "get_engine", "tracking.log_dataset",
                 "GroupedDataset.agg", "Config.progress"):  # fmt: skip
        assert name in ENTRY_POINTS, name
    assert len(ENTRY_POINTS) > 300


def test_no_catch_all_parameters() -> None:
    offenders = {}
    for name, function in ENTRY_POINTS.items():
        allowed = {CATCH_ALLS.get(name)}
        shown, code = _shown_variadics(function), _code_variadics(function)
        if not shown <= allowed or not (code <= allowed or _shows_the_loader_options(function)):
            offenders[name] = shown | code
    assert not offenders, offenders


def test_the_loader_options_are_shown_one_by_one() -> None:
    """``Loader(dataset, *args, **options)`` shows every option as an explicit parameter."""
    assert _code_variadics(ENTRY_POINTS["Loader.__init__"]) == {"*args", "**options"}
    assert _shows_the_loader_options(ENTRY_POINTS["Loader.__init__"])
    for name, function in ENTRY_POINTS.items():
        if _code_variadics(function) - {CATCH_ALLS.get(name)}:
            assert _shows_the_loader_options(function), name


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
                  "memory_budget: 'int | str' = 'auto'", "num_workers: 'int | str' = 0",
                  "-> 'Loader'"):  # fmt: skip
        assert shown in text, shown


def test_help_shows_write_progress_and_engine_options() -> None:
    write = pydoc.render_doc(fl.Dataset.write, renderer=pydoc.plaintext)
    assert "progress: 'bool | None' = None" in write
    assert "options: 'Mapping[str, Any] | None' = None" in pydoc.render_doc(
        fl.get_engine, renderer=pydoc.plaintext
    )
