"""The local engine never hangs or leaks threads when a stream is abandoned."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

import feedline as fl


def _wide(batch):
    return {"x": np.zeros((batch.num_rows, 64), np.float32)}


def test_abandoned_stream_does_not_block_interpreter_exit(tmp_path) -> None:
    script = tmp_path / "abandon.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np, feedline as fl
            engine = fl.LocalEngine(memory_budget="1MB")   # workers block on a full queue
            ds = fl.range(10_000_000).map_batches(
                lambda b: {"x": np.zeros((b.num_rows, 64), np.float32)})
            stream = ds.iter_batches(engine=engine)
            print(next(stream).num_rows, flush=True)       # never closed
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8192"


def _feedline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("feedline-task")]


def test_breaking_out_early_stops_workers() -> None:
    engine = fl.LocalEngine(parallelism=2, memory_budget="1MB")
    stream = fl.range(5_000_000).map_batches(_wide).iter_batches(engine=engine)
    for _ in zip(range(3), stream, strict=False):
        pass
    stream.close()
    deadline = time.monotonic() + 10
    while _feedline_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _feedline_threads() == []


def test_worker_error_reaches_consumer_with_original_traceback() -> None:
    def explode(batch):
        if batch["id"][0].as_py() >= 65536:
            raise ZeroDivisionError("boom in user code")
        return batch

    stream = fl.range(300_000).map_batches(explode).iter_batches()
    seen = 0
    try:
        for batch in stream:
            seen += batch.num_rows
    except fl.UserFunctionError as exc:
        assert isinstance(exc.__cause__, ZeroDivisionError)
        frames = []
        tb = exc.__cause__.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        assert "explode" in frames
        assert "explode" in str(exc) and "range[65536:" in str(exc)
    else:
        raise AssertionError("the user function's error was lost")
    assert seen == 65536  # the batches before the failing task were delivered in order
    assert _feedline_threads() == [] or all(not t.is_alive() for t in _feedline_threads())
