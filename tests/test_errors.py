"""The exception tree: one root, a small set of subclasses, and a fix in every message."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
import feedline.errors as errors

PACKAGE = Path(fl.__file__).parent
#: every module of the package: each raise site is checked for a "Fix:" hint
FOUNDATION = sorted(PACKAGE.rglob("*.py"))
ERROR_CLASSES = [getattr(errors, name) for name in errors.__all__]


def test_every_error_class_is_a_feedline_error():
    assert len(ERROR_CLASSES) >= 6
    for cls in ERROR_CLASSES:
        assert issubclass(cls, fl.FeedlineError), cls
        assert issubclass(cls, Exception)
        assert getattr(fl, cls.__name__) is cls, f"{cls.__name__} is not exported"
        assert cls.__doc__, f"{cls.__name__} has no docstring"


def test_every_error_class_in_the_module_is_listed():
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }
    assert defined == set(errors.__all__)


def test_the_tree():
    assert issubclass(fl.IncompleteDatasetError, fl.FormatError)
    assert issubclass(fl.IntegrityError, fl.FormatError)
    assert issubclass(fl.MissingDependencyError, fl.ConfigurationError)
    for cls in (fl.SchemaError, fl.DataError, fl.FormatError, fl.UserFunctionError):
        assert not issubclass(cls, fl.ConfigurationError)
    # familiar built-in bases, so generic handlers keep working
    assert issubclass(fl.ConfigurationError, ValueError)
    assert issubclass(fl.MissingDependencyError, ImportError)


def test_the_docstring_draws_every_class():
    for cls in ERROR_CLASSES:
        assert cls.__name__ in errors.__doc__, cls.__name__


def test_missing_dependency_names_the_extra():
    error = fl.MissingDependencyError("pyspark", "spark", "engine='spark'")
    message = str(error)
    assert "pyspark" in message and "Fix:" in message and "feedline[spark]" in message
    assert (error.package, error.extra) == ("pyspark", "spark")


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` constants (used to share a fix hint)."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _message_text(call: ast.Call, constants: dict[str, str]) -> str:
    parts = []
    for node in ast.walk(call):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
        elif isinstance(node, ast.Name) and node.id in constants:
            parts.append(constants[node.id])
    return "".join(parts)


@pytest.mark.parametrize("path", FOUNDATION, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_raise_site_says_how_to_fix(path):
    names = set(errors.__all__) - {"MissingDependencyError"}  # builds its own "Fix:"
    # messages built elsewhere, each with its "Fix:": StorageError's wrapper in the shard cache
    # takes its callers' messages; DecodeImages' DataError text comes from ``_message``
    built = {("shard_cache.py", "StorageError"), ("preprocessors.py", "DataError")}
    tree = ast.parse(path.read_text())
    constants = _module_strings(tree)
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            if not node.args:
                continue
            if (path.name, node.func.id) in built:
                continue
            if "Fix:" not in _message_text(node, constants):
                missing.append(f"{path.name}:{node.lineno} {node.func.id}")
    assert not missing, "error messages without 'Fix:': " + ", ".join(missing)


@pytest.mark.parametrize(
    "trigger",
    [
        lambda tmp: fl.read_parquet(tmp / "missing.parquet"),
        lambda tmp: fl.read_parquet([]),
        lambda tmp: fl.open(tmp / "missing"),
        lambda tmp: fl.verify(tmp),
        lambda tmp: fl.get_engine("nope"),
        lambda tmp: fl.range(3).select(["nope"]).to_arrow(),
        lambda tmp: fl.range(3).map_batches(lambda b: 1 / 0).to_arrow(),
        lambda tmp: fl.range(3).map_batches(lambda b: "text").to_arrow(),
        lambda tmp: fl.LocalEngine(memory_budget="a lot"),
        lambda tmp: fl.from_arrow([1, 2]),
    ],
)
def test_errors_raised_in_practice_carry_a_fix(tmp_path, trigger):
    with pytest.raises(fl.FeedlineError) as info:
        trigger(tmp_path)
    assert "Fix:" in str(info.value)


def test_user_function_error_keeps_the_original_exception():
    def divide(batch: pa.RecordBatch) -> pa.RecordBatch:
        return {"x": [1 / 0]}

    with pytest.raises(fl.UserFunctionError) as info:
        fl.range(1).map_batches(divide).to_arrow()
    assert "divide" in str(info.value) and "ZeroDivisionError" in str(info.value)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.__cause__.__traceback__ is not None
