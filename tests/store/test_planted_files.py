"""Files planted in a dataset folder neither hang feedline nor make it allocate what they
claim (issue 23, items 10 and 12).

``_feedline.json`` symlinked to ``/dev/zero`` reports a size of 0 and streams without end; a
FIFO in place of the manifest, a shard or the writer lock blocks whoever opens it. Each case
runs in a child process under an address-space limit and a timeout
(:func:`hostile.run_limited`), so a regression fails the test instead of hanging the suite
or exhausting memory.
"""

from __future__ import annotations

import pytest
from hostile import run_limited

#: builds a committed dataset ``d`` (two shards) and defines ``outcome(fn)``: the exception
#: type a call raised ("ok" when none), a MemoryError or a hang being the failures looked for
SETUP = """
import os, tempfile
from feedline.errors import FeedlineError
d = tempfile.mkdtemp() + "/ds"
fl.range(10).write(d, rows_per_shard=5)
manifest = d + "/_feedline.json"
shards = sorted(d + "/" + n for n in os.listdir(d) if n.endswith(".parquet"))
def outcome(fn):
    try:
        fn()
    except FeedlineError as exc:
        return [type(exc).__name__, str(exc)]
    return ["ok", ""]
def plant(path, kind):
    os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(kind, path)
def loader():
    return list(fl.Loader(d, batch_size=4, format="numpy"))
"""


def _run(body: str) -> dict:
    outcome = run_limited(SETUP + body, memory=2 << 30, timeout=90)
    assert outcome.kind == "ok", (outcome.kind, outcome.error, outcome.message, outcome.stderr)
    assert isinstance(outcome.value, dict)
    return outcome.value


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_manifest_linked_to_an_endless_device_is_refused(device: str) -> None:
    found = _run(
        f"""
plant(manifest, {device!r})
return {{
    "open": outcome(lambda: fl.open(d)),
    "verify": outcome(lambda: fl.verify(d)),
    "loader": outcome(loader),
    "write": outcome(lambda: fl.range(3).write(d)),
}}
"""
    )
    for call, (kind, message) in found.items():
        assert kind == "FormatError", (call, kind, message)
        assert "_feedline.json" in message and "character device" in message, (call, message)


@pytest.mark.timeout(120)
def test_a_fifo_as_the_manifest_or_the_lock_is_refused_without_blocking() -> None:
    found = _run(
        """
plant(manifest, "fifo")
result = {
    "open": outcome(lambda: fl.open(d)),
    "verify": outcome(lambda: fl.verify(d)),
    "loader": outcome(loader),
    "write": outcome(lambda: fl.range(3).write(d)),
}
other = tempfile.mkdtemp() + "/ds"
fl.range(3).write(other)
os.mkfifo(other + "/_feedline.lock")
result["write with a fifo lock"] = outcome(lambda: fl.range(3).write(other))
return result
"""
    )
    for call, (kind, message) in found.items():
        assert kind == "FormatError", (call, kind, message)
        assert "FIFO" in message and "Fix:" in message, (call, message)


@pytest.mark.timeout(120)
def test_a_fifo_or_device_as_a_shard_is_refused_without_blocking() -> None:
    found = _run(
        """
plant(shards[1], "fifo")
result = {
    "open": outcome(lambda: fl.open(d)),
    "verify": outcome(lambda: fl.verify(d)),
    "loader": outcome(loader),
}
plant(shards[1], "/dev/zero")
result["open /dev/zero"] = outcome(lambda: fl.open(d).to_arrow())
return result
"""
    )
    for call, (kind, message) in found.items():
        assert kind == "IntegrityError", (call, kind, message)
        assert shards_name(message) and "not a regular file" in message, (call, message)


@pytest.mark.timeout(120)
def test_a_shard_swapped_for_a_fifo_after_the_open_is_refused_without_blocking() -> None:
    found = _run(
        """
ds = fl.open(d)
source = fl.Loader(d, batch_size=4, format="numpy", shuffle=False)
plant(shards[1], "fifo")
return {
    "to_arrow": outcome(ds.to_arrow),
    "loader": outcome(lambda: list(source)),
}
"""
    )
    for call, (kind, message) in found.items():
        assert kind in ("IntegrityError", "DataError"), (call, kind, message)
        assert "FIFO" in message or "not a regular file" in message, (call, message)


def shards_name(message: str) -> bool:
    return ".parquet" in message
