"""Why a background gather thread can lose to no thread at all: the GIL convoy, measured.

The loader's prefetch thread gathers windows with NumPy calls that release the GIL while they
copy. Each such call must take the GIL back when it is done; when the other thread (the training
loop) is running Python, that takes up to ``sys.getswitchinterval()`` (5 ms). This script times
the same gather (512 windows of 96 x 8 float32, case W's data) three ways:

* alone, in one thread;
* in a background thread while the main thread runs a pure-Python loop;
* in two threads at once (the copy itself scales: the GIL is released while copying).

Run::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/gil_convoy.py
"""

from __future__ import annotations

import threading
import time

import numpy as np

from feedline.loader.data.window_gather import window_blocks

ROWS = 2000 * 5000
SECONDS = 2.0


def main() -> None:
    data = np.random.default_rng(1).random((ROWS, 8), dtype=np.float32)
    blocks = window_blocks(data, 96)
    rng = np.random.default_rng(0)
    starts = [np.sort(rng.integers(0, ROWS - 96, 512)) for _ in range(64)]

    def gather(i: int) -> np.ndarray:
        return blocks[starts[i % 64]]

    def timed(fn: object) -> int:
        begin, count = time.perf_counter(), 0
        while time.perf_counter() - begin < SECONDS:
            fn(count)  # type: ignore[operator]
            count += 1
        return count

    alone = timed(gather) / SECONDS
    loop_alone = timed(lambda i: None)
    stop, counts = [False], [0, 0]

    def worker(k: int) -> None:
        while not stop[0]:
            gather(counts[k])
            counts[k] += 1

    thread = threading.Thread(target=worker, args=(0,))
    thread.start()
    loop_busy = timed(lambda i: None)
    stop[0] = True
    thread.join()
    beside_python = counts[0] / SECONDS
    stop[0], counts[:] = False, [0, 0]
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop[0] = True
    for t in threads:
        t.join()
    print(f"gathers/s alone, one thread:                  {alone:10,.0f}")
    print(
        f"gathers/s in a thread beside a Python loop:   {beside_python:10,.0f}"
        f"   (the loop ran at {loop_busy / loop_alone:.0%} of its speed alone)"
    )
    print(f"gathers/s in two threads at once:             {sum(counts) / SECONDS:10,.0f}")


if __name__ == "__main__":
    main()
