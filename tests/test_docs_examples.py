"""Every ```python block of the user guide (docs/**/*.md) runs, so the documentation stays true.

One test per page: its blocks run in order in one namespace, in a fresh temporary working
directory, and create their own small data. A block whose first line is
``# not run in the tests: <reason>`` is skipped (the reason must say what it needs: a GPU,
a cluster, credentials); every other block must run. A block whose first line is
``# file: NAME`` is a script the page runs itself (e.g. with torchrun): it is written to
``NAME`` in the working directory instead. Tracebacks name the Markdown file and its line,
as the code is compiled at the block's position in the page.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)(?P<rest>.*)$")
SKIP = re.compile(r"^#\s*not run in the tests:\s*(?P<reason>.+)$")
FILE = re.compile(r"^#\s*file:\s*(?P<name>[\w./-]+\.py)\s*$")
#: at most this many skipped blocks in the whole guide: keep them rare
MAX_SKIPPED = 8


def blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file: (line number of the first code line, code)."""
    out: list[tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"]
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path}:{i + 1}: a code fence is never closed")
        if lang in ("python", "py"):
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
            out.append((i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return out


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts and blocks(p))


def first_line(code: str) -> str:
    return code.lstrip("\n").splitlines()[0].strip() if code.strip() else ""


def skip_reason(code: str) -> str | None:
    m = SKIP.match(first_line(code))
    return m["reason"].strip() if m else None


def file_name(code: str) -> str | None:
    m = FILE.match(first_line(code))
    return m["name"] if m else None


def test_the_guide_has_runnable_examples() -> None:
    """The collector finds the guide's pages, and skipped blocks stay rare and explained."""
    found = {p.relative_to(DOCS).as_posix() for p in pages()}
    assert {"index.md", "getting-started.md", "how-to/images.md", "how-to/tabular.md"} <= found
    skipped = [
        (p, line, skip_reason(code))
        for p in pages()
        for line, code in blocks(p)
        if skip_reason(code) is not None
    ]
    assert len(skipped) <= MAX_SKIPPED, skipped
    for page, line, reason in skipped:
        assert reason is not None and len(reason) >= 15, f"{page}:{line}: say why it is skipped"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    environ = dict(os.environ)
    memory = set(MemoryFileSystem.store)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    try:
        for line, code in blocks(page):
            if skip_reason(code) is not None:
                continue
            if (name := file_name(code)) is not None:
                compile(code, f"{page}:{line}", "exec")  # a syntax error fails here, not later
                (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / name).write_text(code, encoding="utf-8")
                continue
            # compiled at its own line of the page: tracebacks point into the Markdown file
            exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
            ran += 1
    finally:
        _reset_global_state(environ, memory)
    assert ran, f"{page}: every block is skipped"


def _reset_global_state(environ: dict[str, str], memory: set[str]) -> None:
    """Undo what a page may leave behind for the rest of the suite."""
    os.environ.clear()
    os.environ.update(environ)
    for key in set(MemoryFileSystem.store) - memory:  # the page's memory:// "buckets"
        del MemoryFileSystem.store[key]
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)


def test_the_collector_reads_fences_markers_and_indentation(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n"
        "```python\nx = 1\n```\n"
        "```bash\nls\n```\n"
        "!!! note\n    ```python\n    y = x + 1\n    ```\n"
        "```python\n# not run in the tests: needs a CUDA GPU to run\nz = 1\n```\n"
        "```python\n# file: job.py\nprint('hi')\n```\n",
        encoding="utf-8",
    )
    found = blocks(page)
    assert [line for line, _ in found] == [3, 10, 13, 17]
    assert found[1][1] == "y = x + 1\n"  # dedented out of the admonition
    assert skip_reason(found[2][1]) == "needs a CUDA GPU to run"
    assert file_name(found[3][1]) == "job.py"
    assert skip_reason(found[0][1]) is None and file_name(found[0][1]) is None
