"""Callbacks owned by the core; backends only emit the events.

Order matters at epoch end: the throughput meter adds its figures to the
metrics before the tracker logs them and the progress line prints them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xp.run import spot

log = logging.getLogger("xp")

# metric names carry their unit, as epoch_time_s and cost_usd do
THROUGHPUT = "throughput_samples_per_s"  # training: samples/s, across workers
IO_THROUGHPUT = "io_throughput_samples_per_s"  # test_io: the input pipeline alone


class StopTraining(Exception):
    """Raised by a callback at an epoch's end: training stops there, cleanly (the epoch counts)."""


class Callback:
    def on_train_begin(self) -> None: ...
    def on_epoch_begin(self, epoch: int) -> None: ...
    def on_batch_end(self, epoch: int, step: int, samples: int) -> None: ...
    def on_train_epoch_end(self, epoch: int) -> None: ...
    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None: ...
    def on_train_end(self, history: list[dict[str, float]]) -> None: ...
    def on_interrupt(self, where: dict[str, Any] | None) -> None:
        """Ctrl-C or SIGTERM (a spot notice) between two batches; `where`: the loop's LoopState.partial()."""
    def on_end(self) -> None:
        """Always called, also after an error or Ctrl-C: stop threads, release devices."""


class ThroughputMeter(Callback):
    """samples/s over the epoch with warm-up batches excluded, plus the per-batch spread.

    Times are taken at batch-end events, which the core's loop emits after
    the step before was read back (so an asynchronous engine is at most one
    step ahead of them), and at the end of the training epoch, after the
    engine drained its queue. The warm-up's end is synchronised fully.
    """

    def __init__(self, warmup_batches: int, name: str = THROUGHPUT):
        self.warmup = warmup_batches
        self.name = name  # IO_THROUGHPUT when only the input pipeline runs
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


class CostMeter(Callback):
    """What the run has cost so far: wall time on the instance (training and evaluation) x price.

    Logs cost_usd (cumulative) and epoch_cost_usd every epoch where the hardware has a price, and with a
    target accuracy, time_to_target_s and cost_to_target_usd at the first epoch that reaches it.
    """

    def __init__(self, price_per_hour: float, target_accuracy: float | None = None,
                 before: list[dict[str, float]] | None = None, instances: int = 1):
        # instances: what is paid per price_per_hour (elastic runs: every worker is an instance)
        self.price, self.target = price_per_hour * instances, target_accuracy
        before = before or []  # epochs trained before a resume: the clock and the bill continue
        self.offset = before[-1].get("elapsed_s", 0.0) if before else 0.0
        self.paid = before[-1].get("cost_usd", 0.0) if before else 0.0
        self.reached = any("time_to_target_s" in m for m in before)

    def on_train_begin(self) -> None:
        self._t0 = time.perf_counter()

    def on_epoch_begin(self, epoch: int) -> None:
        self._te = time.perf_counter()

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        elapsed = self.offset + now - self._t0
        metrics["elapsed_s"] = elapsed
        if self.price:  # hardware without a price (local): no cost curve at $0
            metrics["cost_usd"] = self.paid + (now - self._t0) / 3600 * self.price
            metrics["epoch_cost_usd"] = (now - self._te) / 3600 * self.price
        if self.target is not None and not self.reached and metrics.get("val_accuracy", -1) >= self.target:
            self.reached = True
            metrics["time_to_target_s"] = elapsed
            if self.price:
                metrics["cost_to_target_usd"] = metrics["cost_usd"]


class ProgressPrinter(Callback):
    def __init__(self, epochs: int):
        self.epochs = epochs

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        parts = [f"epoch {epoch:>{len(str(self.epochs))}}/{self.epochs}"]
        for key, fmt in (("train_loss", "{:.4f}"), ("train_accuracy", "{:.4f}"), ("val_accuracy", "{:.4f}"),
                         (THROUGHPUT, "{:.1f}"), (IO_THROUGHPUT, "{:.1f}"), ("epoch_time_s", "{:.3g}"), ("lr", "{:.4g}")):
            if key in metrics:
                parts.append(f"{key}={fmt.format(metrics[key])}")
        log.info("  ".join(parts))


class ProgressBar(Callback):
    """A bar per epoch with samples/s and ETA, on an interactive terminal only (quiet in logs and CI)."""

    def __init__(self, steps: int, samples_per_step: int, enabled: bool | None = None):
        import sys

        self.total = steps * samples_per_step
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None

    def on_epoch_begin(self, epoch: int) -> None:
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=f"epoch {epoch}", unit="samples", unit_scale=True, leave=False)

    def on_batch_end(self, epoch: int, step: int, samples: int) -> None:
        if self.bar is not None:
            self.bar.update(samples)

    def on_train_epoch_end(self, epoch: int) -> None:
        self.on_end()

    def on_end(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Progress(Callback):
    """A distributed worker tells its launcher it is moving (see xp.worker); a stalled worker fails the job."""

    def __init__(self, rank: int):
        from xp.run.worker import report_progress

        self.rank, self.report = rank, report_progress
        self.report(rank)

    def on_batch_end(self, epoch: int, step: int, samples: int) -> None:
        self.report(self.rank)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.report(self.rank)


class WorkerMetrics(Callback):
    """Across workers: throughput `key` becomes the total, each worker's own kept as worker<r>_<key>;
    training loss and accuracy (each worker saw its own shard, of equal size) become their mean."""

    def __init__(self, gather, key: str):
        self.gather, self.key = gather, key

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        values = self.gather(metrics.get(self.key, 0.0))  # a collective: every worker calls it, every epoch
        if len(values) > 1:
            metrics[self.key] = sum(values)
            for rank, v in enumerate(values):
                metrics[f"worker{rank}_{self.key}"] = v
            for name in ("train_loss", "train_accuracy"):
                if name in metrics:
                    shards = self.gather(metrics[name])
                    metrics[name] = sum(shards) / len(shards)


# figures an epoch carries once in a run: the summary's params say them, not one-point charts
ONCE = ("time_to_target_s", "cost_to_target_usd")


class TrackingCallback(Callback):
    """Logs every epoch's metrics (the curves); step = epochs completed."""

    def __init__(self, tracker: Any):
        self.tracker = tracker

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.tracker.log_metrics({k: v for k, v in metrics.items() if k not in ONCE}, step=epoch)


class TrialReporter(Callback):
    """Reports the first objective after every epoch and raises TrialPruned when told to stop."""

    def __init__(self, trial: Any, metric: str, epochs: int):
        self.trial, self.metric, self.epochs = trial, metric, epochs

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.metric in metrics:
            self.trial.report(metrics[self.metric], epoch)
            # after the last epoch there is nothing left to save: the trial is complete
            if epoch < self.epochs and self.trial.should_prune():
                from xp.studies.trial import TrialPruned

                raise TrialPruned(f"pruned after epoch {epoch}")


# --- elastic training, the worker's side --------------------------------------------------------
class StopAtMembershipChange(Callback):
    """At an epoch's end: stop if the launcher asked (the workers decide together, by a collective)."""

    def __init__(self, gather: Callable[[float], list[float]], flag: str, epochs: int):
        self.gather, self.flag, self.epochs = gather, Path(flag), epochs
        self.stopped = False

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        asked = max(self.gather(1.0 if self.flag.exists() else 0.0)) > 0
        if asked and epoch < self.epochs:
            self.stopped = True
            raise StopTraining()


class WorkerHours(Callback):
    """workers per epoch, worker-hours so far, and what they cost at on-demand and (if known) spot prices;
    cost_usd itself is CostMeter's, which bills every worker as an instance in elastic runs."""

    def __init__(self, workers: int, hardware: Any, before: list[dict[str, float]], elastic: Any = None,
                 trace_t0: float | None = None):
        self.workers, self.hw = workers, hardware
        self.hours = before[-1].get("worker_hours", 0.0) if before else 0.0
        # on a spot trace: every worker billed at the trace's price of each moment since the job started,
        # relaunches included (job_elapsed_s: the job's wall clock at each epoch's end)
        self.trace = (elastic.trace, elastic.trace_speed, trace_t0) if elastic and elastic.trace and trace_t0 else None
        self.spot_usd = before[-1].get("cost_spot_usd", 0.0) if before else 0.0
        self.last = before[-1].get("job_elapsed_s", 0.0) if before else 0.0

    def on_epoch_begin(self, epoch: int) -> None:
        self._t = time.perf_counter()

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.hours += (time.perf_counter() - self._t) * self.workers / 3600
        metrics["workers"] = self.workers
        metrics["worker_hours"] = self.hours
        if self.hw.price_per_hour:  # hardware without a price: no cost, not $0
            metrics["cost_on_demand_usd"] = self.hours * self.hw.price_per_hour
        if self.trace:
            trace, speed, t0 = self.trace
            now = time.time() - t0
            self.spot_usd += spot.cost(trace, self.last * speed, now * speed, self.workers) / speed
            self.last = now
            metrics["job_elapsed_s"], metrics["cost_spot_usd"] = now, self.spot_usd
            metrics["spot_price_per_hour"] = spot.at(trace, now * speed)[1]
        elif self.hw.spot_price_per_hour:
            metrics["cost_spot_usd"] = self.hours * self.hw.spot_price_per_hour
