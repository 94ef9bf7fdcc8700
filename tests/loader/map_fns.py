"""Transforms for the loader tests, in a small importable module: worker processes import it
to unpickle them (a test module would drag pytest and its fixtures into every worker)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from feedline.errors import DataError


def augment(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A random augmentation: the id, its features shifted by noise, a random flip bit."""
    return {"id": sample["id"], "noisy": sample["x"] + rng.normal(size=3).astype(np.float32),
            "flip": bool(rng.random() < 0.5)}  # fmt: skip


def slow_augment(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``augment`` taking a pseudo-random few milliseconds, so workers finish out of order."""
    time.sleep((int(sample["id"]) * 7919 % 5) / 1000)
    return augment(sample, rng)


def batch_augment(batch: dict[str, Any], rngs: Any) -> dict[str, Any]:
    """A batched augmentation: per-sample uniforms, vectorized."""
    u = rngs.uniforms(2)
    return {"id": batch["id"], "scaled": batch["x"] * u[:, :1].astype(np.float32)}


def fail_on_7(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if int(sample["id"]) == 7:
        raise ValueError("sample seven is cursed")
    return {"id": sample["id"]}


def data_error_on_7(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if int(sample["id"]) == 7:
        raise DataError("Cannot decode sample 7. Fix: re-encode it.")
    return {"id": sample["id"]}


class KillOnce:
    """Kills its worker process (SIGKILL) on sample 7, once: the marker file says it did."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        if int(sample["id"]) == 7 and not Path(self.marker).exists():
            Path(self.marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        return {"id": sample["id"]}


def big_output(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A 64 KiB float32 array per sample, plus a string (which travels pickled)."""
    return {"id": sample["id"], "image": np.full((16, 1024), float(sample["id"]), np.float32),
            "name": f"s{int(sample['id'])}"}  # fmt: skip


#: set to let the threads stuck in ``hang_on_5`` return (a test releases them when it is done)
RELEASE = threading.Event()


def hang_on_5(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Blocks on sample 5 until ``RELEASE`` is set (a transform that never returns)."""
    if int(sample["id"]) == 5 and not RELEASE.is_set():
        RELEASE.wait()
    return {"id": sample["id"]}


def hang_batch_with_5(batch: dict[str, Any], rngs: Any) -> dict[str, Any]:
    """A batched transform that blocks on the batch holding sample 5 until ``RELEASE``."""
    if 5 in np.asarray(batch["id"]).tolist() and not RELEASE.is_set():
        RELEASE.wait()
    return {"id": batch["id"]}


class HangOnce:
    """Sleeps (for an hour) on sample 5 in its worker process, once: the marker file says it
    did, so the restarted workers go through."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        if int(sample["id"]) == 5 and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(3600)
        return {"id": sample["id"]}


def skip_fifth(sample: dict[str, Any], rng: np.random.Generator) -> Any:
    """``big_output``, but every fifth sample is dropped (a Skipped marker)."""
    from feedline.preprocess.vision.augment import Skipped

    if int(sample["id"]) % 5 == 0:
        return Skipped(int(sample["id"]), None, "every fifth")
    return big_output(sample, rng)


def shape_by_half(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Arrays of another shape for the second half of the ids (a transform to refuse)."""
    n = 3 if int(sample["id"]) < 32 else 4
    return {"id": sample["id"], "x": np.zeros(n, np.float32)}


def sleepy(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A slow transform that releases the GIL: 2 ms per sample (like I/O or a C decoder)."""
    time.sleep(0.002)
    return {"id": sample["id"]}


def half_ms(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """0.5 ms per sample, releasing the GIL."""
    time.sleep(0.0005)
    return {"id": sample["id"]}


def ident(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The sample's id, at once."""
    return {"id": sample["id"]}


def two_ms(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """2 ms per sample, releasing the GIL (a slow transform more workers speed up)."""
    time.sleep(0.002)
    return {"id": sample["id"], "u": rng.random()}


def uneven(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Trivial, but 20 ms on every 128th sample: batches made fast on average, unevenly."""
    if int(sample["id"]) % 128 == 0:
        time.sleep(0.02)
    return {"id": sample["id"]}


def uneven_big(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``uneven`` with a 64 KiB float32 array per sample (batches that weigh on memory)."""
    if int(sample["id"]) % 128 == 0:
        time.sleep(0.02)
    return {"id": sample["id"], "image": np.zeros((16, 1024), np.float32)}
