"""The public surface: ``feedline.__all__`` is sorted, complete and importable."""

from __future__ import annotations

import importlib
import pkgutil

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
        if info.name.startswith(("feedline.engines.spark.engine", "feedline.engines.ray.engine")):
            continue
        importlib.import_module(info.name)
    assert list(tmp_path.iterdir()) == []  # importing wrote nothing


def test_error_tree() -> None:
    for name in ("SchemaError", "DataError", "FormatError", "IntegrityError",
                 "IncompleteDatasetError", "UserFunctionError", "ConfigurationError",
                 "MissingDependencyError"):  # fmt: skip
        assert issubclass(getattr(fl, name), fl.FeedlineError)
