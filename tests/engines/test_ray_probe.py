"""The Ray node probe: which of the user's modules a worker can import by itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedline.engines.ray.runtime import _probe_source


def test_a_plain_folder_named_like_the_module_does_not_count_as_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data folder ``scale/`` on a worker's ``sys.path`` is a namespace package to
    ``find_spec``; counting it as the user's module ``scale`` left the module unshipped and
    the task failed unpickling (``Can't get attribute 'derive'``)."""
    (tmp_path / "scale").mkdir()  # a folder, no __init__.py
    (tmp_path / "realmod.py").write_text("def derive(batch):\n    return batch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _probe_source()(["scale", "realmod", "no_such_module_anywhere"])
    assert found["missing"] == ["scale", "no_such_module_anywhere"]
    assert found["version"] and not found["problem"]
