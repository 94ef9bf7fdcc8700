"""feedline's log records (the ``feedline`` logger hierarchy) and the verbosity switch."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

import feedline as fl
from feedline.io.storage.retry import RetryPolicy


def test_write_commit_is_logged_with_shards_rows_and_bytes(caplog, tmp_path) -> None:
    caplog.set_level(logging.INFO, logger="feedline")
    info = fl.range(1_000).write(tmp_path / "ds", rows_per_shard=400)
    [record] = [r for r in caplog.records if r.getMessage().startswith("Committed")]
    assert record.name == "feedline.store.commit" and record.levelno == logging.INFO
    text = record.getMessage()
    assert f"{info.shards} shard(s), 1000 rows, {info.bytes} bytes" in text
    assert str(tmp_path / "ds") in text


@pytest.mark.parametrize("cache", ["memory", "node"])
def test_loader_cache_fill_is_logged_with_kind_and_size(caplog, tmp_path, cache: str) -> None:
    fl.range(500).write(tmp_path / "ds")
    caplog.set_level(logging.INFO, logger="feedline")
    loader = fl.open(tmp_path / "ds").loader(
        batch_size=100, cache=cache, cache_dir=tmp_path / "node", format="numpy"
    )
    next(iter(loader))
    [record] = [r for r in caplog.records if r.getMessage().startswith("Loader cache")]
    assert record.name == "feedline.loader.data.backend"
    assert f"Loader cache: {cache}" in record.getMessage()
    assert "500 rows, 4000 bytes" in record.getMessage()


def test_plan_execution_summary_at_debug(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="feedline")
    fl.range(300).to_arrow()
    messages = [r.getMessage() for r in caplog.records if r.name == "feedline.engines.local.engine"]
    assert any("read task(s)" in m for m in messages)
    assert any("Plan executed" in m and "'rows_out': 300" in m for m in messages)


def test_retries_are_logged_as_warnings(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="feedline")
    tries = []

    def flaky(attempt: int) -> str:
        tries.append(attempt)
        if attempt < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    policy = RetryPolicy(attempts=3, base_delay=0, jitter=0)
    assert policy.run(flaky, what="read", url="s3://b/k", sleep=lambda s: None) == "ok"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.name for r in warnings] == ["feedline.io.storage.retry"] * 2
    assert "attempt 1 of 3" in warnings[0].getMessage()
    assert "s3://b/k" in warnings[0].getMessage()


def test_nothing_below_warning_reaches_the_root_logger_by_default(caplog) -> None:
    caplog.set_level(logging.WARNING)
    fl.range(100).to_arrow()
    assert logging.getLogger("feedline").getEffectiveLevel() == logging.WARNING
    assert caplog.records == []


def test_verbosity_attaches_one_handler_to_the_feedline_logger_only(tmp_path) -> None:
    logger, root = logging.getLogger("feedline"), logging.getLogger()
    root_before = list(root.handlers)
    before = list(logger.handlers)
    out = io.StringIO()
    fl.config.console = Console(file=out, no_color=True, width=200)
    try:
        fl.config.verbosity = "info"
        fl.config.verbosity = "INFO"  # set twice: still one handler
        added = [h for h in logger.handlers if h not in before]
        assert len(added) == 1 and logger.level == logging.INFO
        assert root.handlers == root_before
        fl.range(10).write(tmp_path / "ds")
        assert "Committed" in out.getvalue()
        fl.config.verbosity = "warning"
        assert logger.level == logging.WARNING
    finally:
        fl.config.verbosity = None
        fl.config.console = None
    assert logger.handlers == before and logger.level == logging.NOTSET


def test_verbosity_rejects_unknown_levels() -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.config.verbosity = "loud"
    assert fl.config.verbosity is None


def test_cli_verbose_flag_logs_the_commit(tmp_path, capsys) -> None:
    from feedline.cli.main import main

    fl.range(100).write(tmp_path / "src")
    assert main(["-v", "convert", str(tmp_path / "src"), str(tmp_path / "dst")]) == 0
    assert "Committed" in capsys.readouterr().err
    assert fl.config.verbosity is None  # restored after the command
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "again")]) == 0
    assert "Committed" not in capsys.readouterr().err
