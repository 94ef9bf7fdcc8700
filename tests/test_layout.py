"""The tree shows the architecture (docs/concepts/architecture.md): folders by concept, files
named by role, one class each for the Dataset and the Loader, no re-export shims."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import feedline as fl

PACKAGE = Path(__file__).resolve().parents[1] / "feedline"
#: a folder with this many files sharing a ``prefix_`` holds a family that wants a folder
FAMILY = 4


def families(folder: Path) -> dict[str, int]:
    """``prefix -> count`` of the modules in ``folder`` named ``prefix_*`` (FAMILY or more)."""
    names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__" and "_" in p.stem]
    counts = Counter(name.split("_", 1)[0] for name in names)
    return {prefix: n for prefix, n in counts.items() if n >= FAMILY}


def test_no_folder_holds_a_family_of_prefixed_files() -> None:
    folders = [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    found = {str(f.relative_to(PACKAGE.parent)): fam for f in folders if (fam := families(f))}
    assert found == {}


def test_the_family_check_sees_one(tmp_path: Path) -> None:
    for name in ("ray_a", "ray_b", "ray_c", "ray_d", "spark_a", "local"):
        (tmp_path / f"{name}.py").write_text("")
    assert families(tmp_path) == {"ray": 4}


def test_the_dataset_and_the_loader_are_one_class_each() -> None:
    assert fl.Dataset.__mro__ == (fl.Dataset, object)
    assert fl.Loader.__mro__ == (fl.Loader, object)


def _reexported(path: Path) -> list[str]:
    """Names a module lists in ``__all__`` without defining them (imports handed on)."""
    tree = ast.parse(path.read_text())
    defined: set[str] = set()
    listed: list[str] = []
    for node in tree.body:
        for inner in [node, *(ast.walk(node) if isinstance(node, ast.If | ast.Try) else [])]:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(inner.name)
            elif isinstance(inner, ast.Assign):
                for target in inner.targets:
                    if isinstance(target, ast.Name):
                        defined.add(target.id)
                        if target.id == "__all__" and isinstance(inner.value, ast.List):
                            listed = [ast.literal_eval(e) for e in inner.value.elts]
            elif isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name):
                defined.add(inner.target.id)
    return [name for name in listed if name not in defined]


#: package faces: the documented import paths that gather a subsystem's public names
FACES = {
    "feedline/__init__.py",  # the lazy package root (names resolved by __getattr__)
    "feedline/preprocess/__init__.py",  # feedline.preprocess.*, registers the built-ins
    "feedline/loader/__init__.py",  # feedline.loader.Loader / Windows / nodes
    "feedline/loader/nodes/__init__.py",  # feedline.loader.nodes (documented)
    "feedline/io/tfrecord/__init__.py",  # fl.tfrecord (feature specs)
}


def test_no_module_hands_on_names_it_does_not_define() -> None:
    """Outside the package faces, ``__all__`` lists only what the module defines, and no
    import is marked as a re-export (``import x as x``)."""
    shims = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        if where in FACES:
            continue
        names = _reexported(path)
        names += re.findall(r"import (\w+) as \1\b", path.read_text())
        if names:
            shims[where] = names
    assert shims == {}
