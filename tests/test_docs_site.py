"""The documentation site's configuration: every public name has an API entry, every page is
in the navigation, and the build stays offline (``make docs`` builds it with --strict)."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import feedline as fl

yaml = pytest.importorskip("yaml")  # PyYAML: mkdocs needs it; mlflow and ray bring it to dev

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _config() -> dict:
    # mkdocs.yml uses no custom YAML tags, so the safe loader reads it
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_every_public_name_has_an_api_reference_entry() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    documented = set(re.findall(r"^::: feedline\.(\w+)", text, flags=re.MULTILINE))
    for name in list(documented):  # a module documented whole covers its __all__
        if name not in fl.__all__:
            documented |= set(getattr(importlib.import_module(f"feedline.{name}"), "__all__", ()))
    missing = sorted(set(fl.__all__) - documented - {"__version__"})
    assert not missing, f"add `::: feedline.NAME` to a page of docs/api/ for: {missing}"


def test_every_page_is_in_the_navigation() -> None:
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_ext" not in p.parts}
    nav = set(_nav_pages(_config()["nav"]))
    assert pages == nav, (sorted(pages - nav), sorted(nav - pages))


def test_the_build_is_strict_and_offline() -> None:
    config = _config()
    assert config["strict"] is True
    assert config["theme"]["font"] is False  # no Google Fonts request from the pages
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    assert plugins == {"search", "mkdocstrings"}  # nothing that downloads at build time


def _extension():
    pytest.importorskip("griffe")  # the docs extra
    spec = importlib.util.spec_from_file_location("sphinx_roles", DOCS / "_ext/sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sphinx_roles_become_optional_cross_references() -> None:
    rewrite = _extension().rewrite
    out = rewrite("See :class:`~feedline.loader.Loader` and :meth:`state_dict`.", "feedline.Loader")
    assert out == (
        'See <autoref identifier="feedline.loader.Loader" optional><code>Loader</code></autoref>'
        ' and <autoref identifier="feedline.Loader.state_dict" optional>'
        "<code>state_dict</code></autoref>."
    )


def test_rst_literal_blocks_become_markdown_code_blocks() -> None:
    rewrite = _extension().rewrite
    assert rewrite("Layout::\n\n    a/\n", "m") == "Layout:\n\n    a/\n"
    assert rewrite("Tree:\n\n::\n\n    A\n", "m") == "Tree:\n\n\n\n    A\n"


def test_grouped_parameters_get_one_entry_each() -> None:
    split = _extension().split_grouped
    doc = "Intro, text.\n\nParameters\n----------\nshuffle, seed:\n    Shared text.\n\nx:\n    X."
    assert split(doc) == (
        "Intro, text.\n\nParameters\n----------\nshuffle:\n    Shared text.\n"
        "seed:\n    Shared text.\n\nx:\n    X."
    )
    assert split("Notes\n-----\na, b\n    prose") == "Notes\n-----\na, b\n    prose"
