"""Callbacks owned by the core; backends only emit the events.

Order matters at epoch end: the throughput meter adds its figures to the
metrics before the tracker logs them and the progress line prints them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

log = logging.getLogger("xp")


class Callback:
    def on_train_begin(self) -> None: ...
    def on_epoch_begin(self, epoch: int) -> None: ...
    def on_batch_end(self, epoch: int, step: int, samples: int) -> None: ...
    def on_train_epoch_end(self, epoch: int) -> None: ...
    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None: ...
    def on_train_end(self, history: list[dict[str, float]]) -> None: ...


class ThroughputMeter(Callback):
    """samples/s over the epoch with warm-up batches excluded, plus the per-batch spread.

    Times are taken at batch-end events, which backends emit only after the
    step's outputs were read back (synchronised), and at the end of the
    training epoch, after the engine drained its queue. Timing un-synchronised
    calls would measure the launch queue of an asynchronous engine.
    """

    def __init__(self, warmup_batches: int, name: str = "throughput"):
        self.warmup = warmup_batches
        self.name = name  # "io_throughput" when only the input pipeline runs
        self._t0 = 0.0
        self._marks: list[float] = []
        self._samples: list[int] = []
        self._end = 0.0

    def on_epoch_begin(self, epoch: int) -> None:
        self._marks, self._samples = [], []
        self._t0 = time.perf_counter()

    def on_batch_end(self, epoch: int, step: int, samples: int) -> None:
        self._marks.append(time.perf_counter())
        self._samples.append(samples)

    def on_train_epoch_end(self, epoch: int) -> None:
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        n = len(self._marks)
        metrics["epoch_time_s"] = self._end - self._t0
        # Skip the warm-up batches, unless the epoch is too short to have any left.
        w = self.warmup if n > self.warmup else 0
        start = self._marks[w - 1] if w else self._t0
        samples = sum(self._samples[w:])
        elapsed = self._end - start
        if n and elapsed > 0:
            metrics[self.name] = samples / elapsed
        times = np.diff([self._t0, *self._marks])[w:] * 1000.0
        if len(times):
            metrics["batch_time_ms_p50"] = float(np.percentile(times, 50))
            metrics["batch_time_ms_p95"] = float(np.percentile(times, 95))


class ProgressPrinter(Callback):
    def __init__(self, epochs: int):
        self.epochs = epochs

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        parts = [f"epoch {epoch:>{len(str(self.epochs))}}/{self.epochs}"]
        for key, fmt in (("train_loss", "{:.4f}"), ("train_accuracy", "{:.4f}"), ("val_accuracy", "{:.4f}"),
                         ("throughput", "{:.1f}"), ("io_throughput", "{:.1f}"), ("epoch_time_s", "{:.2f}"), ("lr", "{:.4g}")):
            if key in metrics:
                parts.append(f"{key}={fmt.format(metrics[key])}")
        log.info("  ".join(parts))


def fire(callbacks: list[Callback], event: str, *args: Any) -> None:
    for cb in callbacks:
        getattr(cb, event)(*args)
