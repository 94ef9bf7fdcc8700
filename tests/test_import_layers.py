"""Imports flow one way (DESIGN.md): the loader reads shards through ``feedline.io`` and never
imports the Dataset, the readers or an engine; engines never import the Dataset module or the
readers; preprocessors never import an engine, the Dataset or the loader.

Every import statement counts, also inside functions (a lazy import is still a dependency);
only imports under ``if TYPE_CHECKING:`` (type hints) are exempt. Importing the package root
(``import feedline`` / ``from feedline import x``) counts as importing everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "feedline"

FORBIDDEN = {
    "loader": ("feedline.dataset.dataset", "feedline.dataset.readers", "feedline.engines", "feedline"),
    "engines": ("feedline.dataset.dataset", "feedline.dataset.readers", "feedline"),
    "preprocess": (
        "feedline.dataset.dataset",
        "feedline.dataset.readers",
        "feedline.engines",
        "feedline.loader",
        "feedline",
    ),
    "io": (
        "feedline.dataset.dataset",
        "feedline.dataset.readers",
        "feedline.engines",
        "feedline.loader",
        "feedline",
    ),
}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``path`` outside ``if TYPE_CHECKING:`` blocks.

    ``from feedline import x`` is reported as ``feedline.x`` when ``x`` is a submodule, else
    as ``feedline`` (the package root).
    """
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if _type_checking_block(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "feedline":
                for alias in node.names:
                    sub = PACKAGE / alias.name
                    is_module = sub.is_dir() or sub.with_suffix(".py").exists()
                    found.append(
                        (node.lineno, f"feedline.{alias.name}" if is_module else "feedline")
                    )
            else:
                found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def violations(layer: str) -> list[str]:
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for line, module in imported_modules(path):
            for banned in FORBIDDEN[layer]:
                hit = module == banned or (banned != "feedline" and module.startswith(banned + "."))
                if hit:
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_flow_one_way(layer):
    assert violations(layer) == []


def test_the_guard_sees_lazy_and_root_imports(tmp_path):
    """The checker itself: lazy imports count, TYPE_CHECKING imports do not."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from feedline.dataset.dataset import Dataset\n"
        "def f():\n"
        "    from feedline.engines.local.engine import LocalEngine\n"
        "    import feedline\n"
        "    from feedline import loader\n"
    )
    assert imported_modules(module) == [
        (1, "typing"),
        (5, "feedline.engines.local.engine"),
        (6, "feedline"),
        (7, "feedline.loader"),
    ]
