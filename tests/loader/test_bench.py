"""``bench_loader``: the measurement behind ``feedline bench-loader``."""

from __future__ import annotations

from feedline.cli.bench_loader import bench_loader


def test_bench_loader_reports_throughput_and_data_wait(write, tmp_path) -> None:
    write(2000)
    fast = bench_loader(tmp_path / "ds0", batch_size=100, step_ms=0, epochs=2, format="numpy")
    assert fast["samples"] == 4000 and fast["batches"] == 40
    assert fast["cache"] == "memory" and fast["cache_bytes"] == 2000 * 44
    assert fast["samples_per_s"] > 0 and fast["first_batch_s"] > 0
    slow = bench_loader(tmp_path / "ds0", batch_size=100, step_ms=5, prefetch=2)
    # a 5 ms step hides the gather behind the prefetch thread: the step rarely waits
    assert 0 <= slow["wait_fraction"] < 0.5
    assert slow["samples_per_s"] < 100 / 0.005
    streaming = bench_loader(tmp_path / "ds0", batch_size=100, step_ms=0, cache="none")
    assert streaming["cache"] == "none" and streaming["samples"] == 2000
