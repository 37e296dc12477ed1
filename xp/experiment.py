"""One experiment: plan it, train it through its backend, track it.

`run(config)` is what `python -m xp` calls for every job; tests and sweepers call
it too. It returns the objective (see run()).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xp import checkpoint, elastic, report, study
from xp.callbacks import (Callback, CostMeter, Progress, ProgressBar, ProgressPrinter, ThroughputMeter,
                          WorkerMetrics)
from xp.errors import Terminated
from xp.gpu import visible_gpus
from xp.launch import HOSTS_ENV
from xp.plan import Plan, build_plan
from xp.registry import Registry
from xp.telemetry import telemetry
from xp.tracking import NullTracker, Tracker, TrackingCallback, flatten, resolve_uri, run_name, run_url_hint, versions
from xp.train import fit

log = logging.getLogger("xp")


@dataclass
class JobInfo:
    """Where this job sits: set by the entry point from Hydra's runtime, empty in tests."""

    overrides: list[str] = field(default_factory=list)
    output_dir: Path | None = None
    log_file: Path | None = None
    parent_run_id: str | None = None
    cwd: Path | None = None
    run_id: str | None = None  # a distributed worker logs into the run its launcher created


def plan_and_backend(config: dict[str, Any], resolve_auto: bool = False):
    """Validate the resolved config into a plan and load its backend; raises ConfigError/PluginError.

    batch=auto is checked as batch=1; with resolve_auto it is replaced by the largest batch that fits.
    """
    auto = config.get("batch") == "auto"
    gpus = visible_gpus()
    hosts = int(os.environ.get(HOSTS_ENV) or 0) or None  # a launched worker: the launcher counted the hosts
    plan = build_plan({**config, "batch": 1} if auto else config, visible_gpus=gpus, hosts=hosts)
    backend_cls = Registry().load(plan.backend).for_plan(plan)
    backend_cls.check(plan)
    if auto and resolve_auto:
        from xp.autobatch import largest_fitting

        devices_workers = len(plan.devices) * plan.workers
        limit = min(65536, plan.dataset.train_size // devices_workers)
        batch, tried = largest_fitting(lambda b: backend_cls.fits(build_plan({**config, "batch": b}, visible_gpus=gpus,
                                                                             hosts=hosts)),
                                       limit)
        log.info(f"batch=auto: {batch} per device (tried {', '.join(map(str, tried))}; "
                 + ("the data set's size bounds it" if batch == limit else
                    "GPU memory" if plan.device_type == "gpu" else
                    f"auto_batch_memory_mb={plan.auto_batch_memory_mb:g}") + ")")
        config["batch"] = batch
        plan = build_plan(config, visible_gpus=gpus, hosts=hosts)
    return plan, backend_cls


def describe(plan: Plan, uri: str) -> str:
    d = plan.dataset
    lines = [
        f"xp: backend={plan.backend} model={plan.model.name} dataset={d.name} dtype={plan.dtype} "
        f"kvstore={plan.kvstore} hardware={plan.hardware.name}",
        f"  devices          {', '.join(plan.devices)}  ({plan.workers} worker{'s' if plan.workers > 1 else ''})",
        f"  batch            {plan.batch} per device, {plan.worker_batch} per worker, {plan.global_batch} global",
        f"  learning rate    {plan.lr:g} given at batch {plan.lr_ref_batch}, {plan.effective_lr:g} effective "
        f"(x {plan.effective_lr / plan.lr * plan.lr_ref_batch:g}/{plan.lr_ref_batch}"
        + (", the batch one asynchronous update sees" if plan.kvstore == "dist_async" else "")
        + f"); schedule {plan.lr_schedule}"
        + (f" at epochs {list(plan.lr_steps)} x{plan.lr_decay:g}" if plan.lr_schedule == "step" else "")
        + f"; warm-up {plan.warmup_epochs:g} epochs",
        f"  samples/epoch    {plan.samples_per_epoch} ({plan.steps_per_epoch} steps of {plan.global_batch}; "
        f"{d.train_size} training, {d.val_size} validation, {d.num_classes} classes, "
        f"{'x'.join(map(str, d.image_shape))} images)",
        f"  epochs           {plan.epochs}, seed {plan.seed}",
        f"  tracking         {uri}  experiment={plan.experiment}",
    ]
    return "\n".join(lines)


class History(Callback):
    """The metrics of every finished epoch, also when training stops early (and those before a resume)."""

    def __init__(self, before: list[dict[str, float]] | None = None):
        self.epochs: list[dict[str, float]] = list(before or [])

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.epochs.append(dict(metrics))


def run(config: dict[str, Any], job: JobInfo | None = None) -> Any:
    """Run one experiment from a resolved config (a plain dict).

    Returns the objective: the final val_accuracy, or io_throughput with test_io. A run
    that is a trial of a study returns {"state", "values"} for the study's objectives.
    """
    job = job or JobInfo()
    auto_batch = config.get("batch") == "auto"
    config = dict(config)
    uri = resolve_uri(config.get("tracking_uri"), job.cwd)
    reopen = None
    if config.get("resume") is not None and not job.run_id:
        config, reopen = checkpoint.resolve_resume(config, uri)
    plan, backend_cls = plan_and_backend(config, resolve_auto=True)
    trial = study.attach(config)
    log.info(describe(plan, uri))

    name = plan.run_name or run_name(job.overrides or ()) or f"{plan.model.name}-{plan.dataset.name}-{plan.backend}"
    tags = {"xp.backend": plan.backend, "xp.model": plan.model.name, "xp.dataset": plan.dataset.name}
    if trial:
        tags.update({"optuna.study": trial[0].study.study_name, "optuna.trial_number": str(trial[0].number),
                     "optuna.trial_state": "RUNNING"})
    backend = None
    if not plan.diagnose:
        # set up before tracking: a distributed worker learns its rank here, and only rank 0 logs
        backend = backend_cls()
        backend.setup(plan)
        plan = backend.plan
        if plan.rank != 0:
            for handler in logging.getLogger().handlers:  # one voice on the console and in the log: rank 0's
                handler.setLevel(logging.WARNING)
    tracker_cls = Tracker if plan.rank == 0 else lambda *a, **k: NullTracker()
    with tracker_cls(uri, plan.experiment, name, parent_run_id=job.parent_run_id, tags=tags,
                     attach_run_id=job.run_id, reopen_run_id=reopen) as tracker:
        if trial:
            trial[0].set_user_attr("mlflow_run_id", tracker.run_id)  # optuna-dashboard links trials to runs
        if job.output_dir is not None:
            hydra_dir = job.output_dir / ".hydra"
            for f in ("config.yaml", "overrides.yaml"):
                tracker.add_artifact_on_exit(hydra_dir / f, "hydra")
        if job.log_file is not None:
            tracker.add_artifact_on_exit(job.log_file)
        params = flatten(config)
        params.update({f"derived.{k}": v for k, v in plan.derived().items()})
        params.update({f"version.{k}": v for k, v in versions(backend_cls.requires).items()})
        params["batch_auto"] = auto_batch
        if not (os.environ.get(elastic.RESUMED_ENV) or reopen):  # a resumed run has them already
            tracker.log_params(params)
        log.info(f"  MLflow run       {tracker.run_id} ({name})")

        if plan.diagnose:
            return _diagnose(plan, backend_cls, tracker)
        before = checkpoint.require(plan.resume) if plan.resume else None
        done = list(before.history) if before else []
        if before:
            log.info(f"resuming after epoch {before.epoch} from {plan.resume}")
        meter = ThroughputMeter(plan.timing_warmup_batches, "io_throughput" if plan.test_io else "throughput")
        history = History(done)
        elastic_run = plan.elastic.enabled
        callbacks = [Progress(plan.rank), meter, WorkerMetrics(backend.gather, meter.name),
                     CostMeter(plan.cost_per_hour, plan.target_accuracy, done, plan.workers if elastic_run else 1)]
        if elastic_run:
            callbacks.append(elastic.WorkerHours(plan.workers, plan.hardware, done))
        # logged, then committed: an epoch interrupted in between is trained again, to the same numbers
        callbacks += [*telemetry(plan, tracker.run_id, uri), history, TrackingCallback(tracker)]
        if plan.checkpoint_dir:
            callbacks.append(checkpoint.Checkpointer(plan.checkpoint_dir, backend.save_state, lambda: history.epochs,
                                                     plan.rank, plan.checkpoint_every, plan.checkpoint_keep,
                                                     plan.epochs))
        callbacks += [ProgressBar(plan.steps_per_epoch, plan.worker_batch), ProgressPrinter(plan.epochs)]
        stop = None
        if os.environ.get(elastic.STOP_ENV):
            stop = elastic.StopAtMembershipChange(backend.gather, os.environ[elastic.STOP_ENV], plan.epochs)
            callbacks.append(stop)
        if trial and not trial[1].multi_objective:
            callbacks.append(study.TrialReporter(trial[0], trial[1].objectives[0].metric, plan.epochs))
        if before is not None:
            backend.resume_at = before.meta.get("position")  # an epoch interrupted mid-way goes on from there
            checkpoint.restore_random_state(before.folder)
        state = "COMPLETE"
        try:
            fit(plan, backend, callbacks, setup=False, start_epoch=before.epoch if before else 0)
        except (KeyboardInterrupt, Terminated):
            if plan.checkpoint_dir and plan.rank == 0:  # a spot notice or Ctrl-C: keep what was trained
                where = backend.partial()
                checkpoint.commit(plan.checkpoint_dir, len(history.epochs), history.epochs, backend.save_state,
                                  keep=plan.checkpoint_keep, position=where)
                log.warning(f"interrupted: committed epoch {len(history.epochs)}"
                            + (f" and {where['step']} batches of epoch {where['epoch']}" if where else "")
                            + f" to {plan.checkpoint_dir}; add resume=true to the same command to continue")
            raise
        except study.TrialPruned as e:
            state = "PRUNED"
            log.info(f"trial {trial[0].number}: {e}")
        except Exception as e:
            # into the log file now, while the run is open: the log is uploaded when it ends
            log.debug("training failed", exc_info=True)
            e.xp_logged = True
            if trial:
                tracker.set_tags({"optuna.trial_state": "FAIL"})
            raise
        if trial:
            tracker.set_tags({"optuna.trial_state": state})
        if stop is not None and stop.stopped:
            log.info(f"stopping after epoch {len(history.epochs)}: the workers change; the launcher goes on")
            return float(history.epochs[-1].get("val_accuracy", 0.0))
        if plan.save_params and plan.rank == 0:
            import numpy as np

            np.savez(plan.save_params, **backend.get_params())

        summary = report.summarize(history.epochs, plan.cost_per_hour, meter.name)
        tracker.log_metrics({
            "epochs": summary["epochs"],
            "summary.epoch_time_s": summary.get("epoch_time_s"),
            f"summary.{meter.name}": summary.get("throughput"),
            "train_time_s": summary["train_time_s"],
            "cost_usd": summary["cost_usd"],
            "best_val_accuracy": summary.get("best_val_accuracy"),
            "time_to_target_s": summary.get("time_to_target_s"),
            "cost_to_target_usd": summary.get("cost_to_target_usd"),
        }, step=len(history.epochs))
        row = {"run": name, "model": plan.model.name, "batch": plan.batch, "devices": len(plan.devices) * plan.workers,
               **summary,
               "state": state if trial else "FINISHED"}
        log.info("\n" + report.table([row]))
        log.info(f"logged to {uri} (experiment {plan.experiment}, run {tracker.run_id}); "
                 f"view with: {run_url_hint(uri)}")
    if trial:
        return {"state": state, "values": [float(summary.get(o.metric, float("nan"))) for o in trial[1].objectives]}
    # the objective: what a sweep compares
    return float(summary.get("throughput", 0.0) if plan.test_io else summary.get("val_accuracy", 0.0))


def _diagnose(plan: Plan, backend_cls: type, tracker: Tracker) -> float:
    import os

    from xp.diagnose import diagnose

    log.info(f"diagnosis: {min(plan.steps_per_epoch, plan.diagnose_steps)} batches each with real data, "
             "IO only and synthetic data" + (", and synthetic on one device" if len(plan.devices) > 1 else ""))
    d = diagnose(plan, backend_cls, plan.diagnose_steps, os.cpu_count())
    tracker.log_metrics({f"diagnosis.{k}_throughput": v for k, v in d.rates.items()}, step=1)
    tracker.set_tags({"xp.diagnosis": d.verdict})
    for k, v in d.rates.items():
        log.info(f"  {k:<20} {v:10.1f} samples/s")
    log.info(f"verdict: {d.verdict}: {d.advice}")
    return d.rates["real"]
