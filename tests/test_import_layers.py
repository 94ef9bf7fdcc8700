"""Imports flow one way, with no cycles, and the package root stays lazy (DESIGN.md §2).

The graph follows every import statement of every feedline module, also inside functions
(a lazy import is still a dependency); only imports under ``if TYPE_CHECKING:`` (type
hints) are exempt. Importing ``a.b.c`` also counts as importing the packages ``a`` and
``a.b`` (Python runs their ``__init__`` first), unless they enclose the importer.

Three kinds of check:

- static: no cycle among feedline modules; every feedline import sits at the top of its
  module; what each layer reaches, following imports transitively, stays out of the layers
  above it (the loader never reaches the Dataset, the readers or an engine...);
- runtime, in a fresh interpreter: ``import feedline`` loads only the exception tree, and a
  loader over a written path yields a batch without loading the Dataset, a reader, an
  engine or the relational layer.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "feedline"

#: the readers of source formats (the loader reads feedline shards and Parquet only)
READERS = (
    "feedline.dataset.readers",
    "feedline.io.csv",
    "feedline.io.jsonl",
    "feedline.io.text_files",
    "feedline.io.image_folders",
    "feedline.io.tfrecord",
    "feedline.io.webdataset",
    "feedline.io.petastorm",
    "feedline.io.lakehouse.delta",
    "feedline.io.lakehouse.iceberg",
    "feedline.io.lakehouse.lance",
)
_TOP = ("feedline.dataset", "feedline.cli", "feedline.demo")
#: the engines themselves; ``feedline.engines.protocol`` (the Engine protocol, its results and
#: the registry of names) is the contract the layers above the plan may name
ENGINES = (
    "feedline.engines.local",
    "feedline.engines.spark",
    "feedline.engines.ray",
    "feedline.engines.batch",
    "feedline.engines.schema",
)

#: layer -> module prefixes that nothing in the layer may reach, following every import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "feedline.loader": (*_TOP, *READERS, "feedline.engines", "feedline.plan"),
    "feedline.engines": (*_TOP, "feedline.loader"),
    "feedline.preprocess": (*_TOP, *ENGINES, "feedline.loader"),
    "feedline.statistics": (*_TOP, *ENGINES, "feedline.loader"),
    "feedline.tracking": (*_TOP, "feedline.engines", "feedline.loader", "feedline.plan"),
    "feedline.plan": (*_TOP, "feedline.engines", "feedline.loader", "feedline.preprocess"),
    "feedline.store": (*_TOP, "feedline.engines", "feedline.loader", "feedline.plan"),
    "feedline.io": (*_TOP, "feedline.engines", "feedline.loader", "feedline.plan"),
    "feedline.arrow": (
        *_TOP,
        "feedline.engines",
        "feedline.loader",
        "feedline.plan",
        "feedline.io",
    ),
    "feedline.ui": (*_TOP, "feedline.engines", "feedline.loader", "feedline.plan"),
    "feedline.charts": (*_TOP, "feedline.engines", "feedline.loader", "feedline.plan"),
}

#: modules that may import the package root (``import feedline``): the top of the house
ROOT_IMPORTERS = ("feedline.cli", "feedline.demo")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imports_of(path: Path, name: str, known: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """``(line, module, inside_a_function)`` for every import in ``path`` outside
    ``if TYPE_CHECKING:`` blocks; ``from a import b`` names ``a.b`` when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _type_checking_block(node):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in known else base, in_function))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def _edges(name: str, imported: str, known: dict[str, Path]) -> set[str]:
    """The feedline modules an import of ``imported`` in module ``name`` runs."""
    target = imported
    while target and target not in known:
        target = target.rpartition(".")[0]
    if not target.startswith("feedline"):
        return set()
    out = {target} - {name}
    parts = target.split(".")
    for k in range(2, len(parts)):  # the root package is lazy: it runs nothing of the rest
        package = ".".join(parts[:k])
        if package in known and not (name == package or name.startswith(package + ".")):
            out.add(package)
    return out


@cache
def graph() -> dict[str, frozenset[str]]:
    known = modules()
    return {
        name: frozenset(
            edge for _, imported, _ in imports_of(path, name, known)
            for edge in _edges(name, imported, known)
        )
        for name, path in known.items()
    }  # fmt: skip


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def reached_from(prefix: str) -> dict[str, str]:
    """Every module reachable from the modules under ``prefix`` -> one module that imports it."""
    edges = graph()
    start = [m for m in edges if m == prefix or m.startswith(prefix + ".")]
    via = {m: m for m in start}
    todo = list(start)
    while todo:
        current = todo.pop()
        for target in edges[current]:
            if target not in via:
                via[target] = current
                todo.append(target)
    return via


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_feedline_imports_sit_at_the_top_of_their_module() -> None:
    known = modules()
    inside = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for name, path in known.items()
        for line, imported, in_function in imports_of(path, name, known)
        if in_function and imported.split(".")[0] == "feedline"
    ]
    assert inside == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_flow_one_way(layer: str) -> None:
    via = reached_from(layer)
    bad = sorted(
        f"{layer} reaches {module} (imported by {via[module]})"
        for module in via
        for banned in FORBIDDEN[layer]
        if module == banned or module.startswith(banned + ".")
    )
    assert bad == []


def test_only_the_top_of_the_house_imports_the_package_root() -> None:
    importers = sorted(
        name for name, edges in graph().items()
        if "feedline" in edges and not name.startswith(ROOT_IMPORTERS)
    )  # fmt: skip
    assert importers == []


def test_the_guard_sees_lazy_imports_packages_and_cycles(tmp_path: Path) -> None:
    """The checker itself: lazy imports count, TYPE_CHECKING imports do not, importing a
    submodule runs its packages, and a loop of two modules is a cycle."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from feedline.dataset.dataset import Dataset\n"
        "def f():\n"
        "    from feedline.engines.local.engine import LocalEngine\n"
        "    import feedline\n"
    )
    known = modules()
    assert imports_of(module, "feedline.m", known) == [
        (1, "typing", False),
        (5, "feedline.engines.local.engine", True),
        (6, "feedline", True),
    ]
    assert _edges("feedline.m", "feedline.engines.local.engine", known) == {
        "feedline.engines",
        "feedline.engines.local",
        "feedline.engines.local.engine",
    }
    assert cycles({"a": frozenset({"b"}), "b": frozenset({"a"}), "c": frozenset()}) == [["a", "b"]]


def _fresh(code: str, tmp_path: Path) -> dict:
    """Run ``code`` in a fresh interpreter (tests/ not on its path); it prints one JSON value."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_feedline_loads_only_the_exception_tree(tmp_path: Path) -> None:
    loaded = _fresh(
        """
        import json, sys
        before = set(sys.modules)
        import feedline as fl
        new = sorted(set(sys.modules) - before)
        print(json.dumps(new))
        """,
        tmp_path,
    )
    own = [m for m in loaded if m.split(".")[0] == "feedline"]
    assert own == ["feedline", "feedline._version", "feedline.errors"]
    heavy = ("pandas", "pyarrow", "numpy", "duckdb", "pyspark", "ray", "torch", "polars")
    assert [m for m in loaded if m.split(".")[0] in heavy] == []


def test_public_names_resolve_lazily_and_stay_listed(tmp_path: Path) -> None:
    result = _fresh(
        """
        import json, sys
        import feedline as fl
        from feedline import Dataset, tracking
        listed = set(dir(fl)) >= set(fl.__all__)
        modules = [m for m in ("feedline.dataset.dataset", "feedline.tracking")
                   if m in sys.modules]
        print(json.dumps({"listed": listed, "modules": modules,
                          "same": fl.Dataset is Dataset and fl.tracking is tracking,
                          "stats": callable(fl.stats), "config": type(fl.config).__name__}))
        """,
        tmp_path,
    )
    assert result == {
        "listed": True,
        "modules": ["feedline.dataset.dataset", "feedline.tracking"],
        "same": True,
        "stats": True,
        "config": "Config",
    }


def test_a_loader_over_a_written_path_loads_no_dataset_reader_or_engine(tmp_path: Path) -> None:
    import feedline as fl

    path = str(tmp_path / "ds")
    fl.range(64).write(path)
    result = _fresh(
        f"""
        import json, sys
        from feedline.loader import Loader
        batch = next(iter(Loader({path!r}, batch_size=8, shuffle=True, seed=0, format="numpy")))
        print(json.dumps({{"rows": len(batch["id"]),
                           "modules": sorted(m for m in sys.modules if m.startswith("feedline"))}}))
        """,
        tmp_path,
    )
    assert result["rows"] == 8
    banned = (*_TOP, *READERS, "feedline.engines", "feedline.plan")
    reached = [m for m in result["modules"] if m.startswith(banned)]
    assert reached == []
