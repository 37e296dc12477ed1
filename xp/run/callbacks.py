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
from xp.tracking.tracker import Tracker

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
    """What the run has cost so far: the one cost xp states (MLflow's cost_usd; the report's tables, plots and
    claims read it). Instance time billed from the job's start (its MLflow run's start: start-up, evaluation and
    an elastic job's relaunches included; a resumed run's bill goes on from its restart) x its instances (an
    elastic run's workers, each an instance) x the price of each moment (an elastic run on a spot trace: the
    trace's; cost_on_demand_usd: the same instance time at the on-demand price, what it would have cost).

    Logs elapsed_s, cost_usd (cumulative) and epoch_cost_usd every epoch where the hardware has a price, and with a
    target accuracy, time_to_target_s and cost_to_target_usd at the first epoch that reaches it.
    """

    def __init__(self, price_per_hour: float, target_accuracy: float | None = None,
                 before: list[dict[str, float]] | None = None, instances: int = 1, start_s: float | None = None,
                 job_start_s: float | None = None, trace: tuple[Any, float] | None = None,
                 on_demand_per_hour: float = 0.0):
        # start_s: when this run's job began (its MLflow run's start; None: now). job_start_s: an elastic round's
        # job's start (time.time()), the clock of all its rounds; trace: (spot trace, its replay speed)
        self.price, self.instances, self.target, self.trace = price_per_hour, instances, target_accuracy, trace
        self.on_demand = on_demand_per_hour
        last = (before or [{}])[-1]  # epochs trained before a resume or a relaunch: the clock and the bill go on
        self.t0 = job_start_s if job_start_s is not None else start_s if start_s is not None else time.time()
        self.base = 0.0 if job_start_s is not None else last.get("elapsed_s", 0.0)  # a resumed run's time before
        self.billed = last.get("elapsed_s", 0.0) if job_start_s is not None else 0.0  # from t0: billed up to it
        self.paid, self.paid_on_demand = last.get("cost_usd", 0.0), last.get("cost_on_demand_usd", 0.0)
        self.reached = any("time_to_target_s" in m for m in before or [])

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        now = time.time() - self.t0
        since, self.billed = self.billed, now
        metrics["elapsed_s"] = elapsed = self.base + now
        paid = self.paid
        if self.trace:
            trace, speed = self.trace
            self.paid += spot.cost(trace, since * speed, now * speed, self.instances) / speed
            metrics["spot_price_per_hour"] = spot.at(trace, now * speed)[1]
        else:
            self.paid += (now - since) / 3600 * self.price * self.instances
        if self.on_demand:
            self.paid_on_demand += (now - since) / 3600 * self.on_demand * self.instances
            metrics["cost_on_demand_usd"] = self.paid_on_demand
        if self.price or self.trace:  # hardware without a price (local): no cost curve at $0
            metrics["cost_usd"], metrics["epoch_cost_usd"] = self.paid, self.paid - paid
        if self.target is not None and not self.reached and metrics.get("val_accuracy", -1) >= self.target:
            self.reached = True
            metrics["time_to_target_s"] = elapsed
            if "cost_usd" in metrics:
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

    def __init__(self, tracker: Tracker):
        self.tracker = tracker

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.tracker.log_metrics({k: v for k, v in metrics.items() if k not in ONCE}, step=epoch)


class TrialReporter(Callback):
    """Tells the study's pruner the objectives after every epoch (xp.studies.trial.StudyTrial.pruner) and raises
    TrialPruned when it stops the trial."""

    def __init__(self, pruner: Any, metrics: list[str], epochs: int):
        self.pruner, self.metrics, self.epochs = pruner, metrics, epochs

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if all(m in metrics for m in self.metrics):
            self.pruner.report([metrics[m] for m in self.metrics], epoch)
            # after the last epoch there is nothing left to save: the trial is complete
            if epoch < self.epochs and (why := self.pruner.should_prune()) is not None:
                from xp.studies.trial import TrialPruned

                raise TrialPruned(f"pruned after epoch {epoch} ({why})")


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
    """Workers per epoch and worker-hours of training so far (epochs' time x workers) of an elastic run; what
    they cost is CostMeter's, which bills every worker as an instance from the job's start."""

    def __init__(self, workers: int, before: list[dict[str, float]]):
        self.workers = workers
        self.hours = before[-1].get("worker_hours", 0.0) if before else 0.0

    def on_epoch_begin(self, epoch: int) -> None:
        self._t = time.perf_counter()

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.hours += (time.perf_counter() - self._t) * self.workers / 3600
        metrics["workers"] = self.workers
        metrics["worker_hours"] = self.hours
