"""One experiment: plan it, train it through its backend, track it.

`run(config)` is what `python -m xp` calls for every job; tests and sweepers call
it too. It returns the objective (see run()).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from xp.run import checkpoint
from xp.tracking import sweepstate
from xp.run.callbacks import (IO_THROUGHPUT, Callback, CostMeter, Progress, ProgressBar, ProgressPrinter,
                              StopAtMembershipChange, ThroughputMeter, TrackingCallback, TrialReporter, WorkerHours,
                              WorkerMetrics)
from xp.errors import ConfigError, Terminated
from xp.run.gpu import visible_gpus
from xp.run import handoff
from xp.run.worker import HOSTS_ENV, WORKER_ENV
from xp.run.plan import Plan, build_plan
from xp.data.recordio import with_kept_images
from xp.run.registry import Registry
from xp.run.telemetry import telemetry
from xp.studies.trial import TrialPruned, attach
from xp.tracking.stores import resolve_uri
from xp.tracking.tracker import NullTracker, Tracker, run_name, run_url_hint, versions
from xp.run.train import LoopState, fit

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
    stop_flag: str | None = None  # an elastic round's worker: the file that asks it to stop after an epoch
    resumed: bool = False  # an elastic round after the first: the run's params are logged already
    swept: tuple[str, ...] = ()  # a sweep job: the keys the sweep varies (they name the run)


_planned: dict[str, tuple[Plan, type] | None] = {}  # this process's plans by what they were made of


def plan_and_backend(config: dict[str, Any], resolve_auto: bool = False):
    """Validate the resolved config into a plan and load its backend; raises ConfigError/PluginError.

    batch=auto is checked as batch=1; with resolve_auto it is replaced by the largest batch that fits.
    A process plans a config once: the preflight's plan is the one its launch decision and its run use. A
    launched process plans nothing: it uses the plan its launching process handed down (xp.run.handoff).
    """
    import json

    if os.environ.get(WORKER_ENV) and "handed" not in _planned:
        _planned["handed"] = None
        if (plan := handoff.received()) is not None:  # None: batch=auto, each worker finds its batch
            backend_cls = Registry().load(plan.backend).for_plan(plan)
            backend_cls.check(plan)  # on this host: its frameworks, its devices
            _planned["handed"] = plan, backend_cls
    if _planned.get("handed") is not None:
        return _planned["handed"]
    auto = config.get("batch") == "auto"
    gpus = visible_gpus()
    hosts = int(os.environ.get(HOSTS_ENV) or 0) or None  # a launched worker: the launcher counted the hosts
    key = json.dumps([config, gpus, hosts], sort_keys=True, default=str)
    if key in _planned and not (auto and resolve_auto):
        return _planned[key]
    name = (config.get("backend") or {}).get("name")
    chosen = Registry().load(name) if isinstance(name, str) else None  # (the plan names a missing one)
    planned = functools.partial(build_plan, visible_gpus=gpus, hosts=hosts,
                                pretrained_by=chosen.resolve_pretrained if chosen else None)
    plan = planned({**config, "batch": 1} if auto else config)
    backend_cls = (chosen or Registry().load(plan.backend)).for_plan(plan)
    _check_decode(plan, backend_cls)
    backend_cls.check(plan)
    plan = backend_cls.planned(plan)
    if auto and resolve_auto:
        from xp.run.autobatch import largest_fitting

        devices_workers = len(plan.devices) * plan.workers
        limit = min(65536, plan.dataset.train_size // devices_workers)
        batch, tried = largest_fitting(lambda b: backend_cls.fits(planned({**config, "batch": b})), limit)
        log.info(f"batch=auto: {batch} per device (tried {', '.join(map(str, tried))}; "
                 + ("the data set's size bounds it" if batch == limit else
                    "GPU memory" if plan.device_type == "gpu" else
                    f"auto_batch_memory_mb={plan.auto_batch_memory_mb:g}") + ")")
        config["batch"] = batch
        return replace(backend_cls.planned(planned(config)), batch_auto=True), backend_cls
    _planned[key] = plan, backend_cls
    return plan, backend_cls


def _check_decode(plan: Plan, backend_cls: type) -> None:
    if plan.dataset.options.get("decode", "cpu") != "gpu":
        return
    if not backend_cls.decodes_on_gpu:
        registry = Registry()
        able = [f"backend={n}" for n in registry.names() if getattr(registry.load(n), "decodes_on_gpu", False)]
        raise ConfigError(f"dataset.decode=gpu: backend={plan.backend} decodes on the CPU (data_nthreads threads); "
                          f"{' and '.join(able) or 'no installed backend'} decode{'s' if len(able) == 1 else ''} on GPUs")
    if plan.device_type != "gpu":
        raise ConfigError("dataset.decode=gpu: needs GPUs (gpus=N); on the CPU the data_nthreads workers decode "
                          "(dataset.decode=cpu)")


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


@dataclass
class Outcome:
    """What a run ends with: its state and the value(s) a sweep or a study compares."""
    state: str  # FINISHED | COMPLETE | PRUNED (trials) | STOPPED (an elastic worker stops for a relaunch)
    objective: float  # val_accuracy, or io_throughput with test_io
    values: list[float] = field(default_factory=list)  # a study's objectives, in its order


def run(config: dict[str, Any], job: JobInfo | None = None) -> Outcome:
    """Run one experiment from a resolved config (a plain dict): plan, backend, tracking, callbacks, fit,
    summary."""
    job = job or JobInfo()
    uri = resolve_uri(config.get("tracking_uri"), job.cwd)
    config, reopen = (checkpoint.resolve_resume(config, uri) if config.get("resume") is not None and not job.run_id
                      else (dict(config), None))
    plan, backend_cls = plan_and_backend(config, resolve_auto=True)  # below here, only the plan
    plan = with_kept_images(plan)  # an image folder is prepared now: the plan counts the images that train
    trial = attach(plan.study)
    if job.parent_run_id and not trial and not job.run_id and os.environ.get(sweepstate.RESUMED_ENV):
        earlier = sweepstate.finished_job(uri, job.parent_run_id, sweepstate.job_key(job.overrides))
        if earlier is not None:  # a resumed sweep: this job finished before the sweep was killed
            log.info(f"reusing MLflow run {earlier.info.run_id} ({earlier.info.run_name}): it finished in the "
                     "interrupted sweep with the same settings and code")
            return Outcome("FINISHED", float(earlier.data.metrics.get("val_accuracy", 0.0)))
    log.info(describe(plan, uri))
    if plan.test_io and plan.dataset.options.get("kind", plan.dataset.name) not in ("rec", "folder"):
        log.warning(f"test_io: dataset={plan.dataset.name} is held in memory; its figure times slicing arrays, not "
                    "reading or decoding images (those are dataset=rec and dataset=folder)")
    backend = None if plan.diagnose else _set_up(plan, backend_cls)
    plan = backend.plan if backend else plan
    name = _name(plan, job, trial)
    with _open_tracker(plan, uri, name, job, trial, reopen) as tracker:
        _attach_files(tracker, job, trial)
        if not (job.resumed or reopen):  # a resumed run has its params already
            tracker.log_params(_params(plan, backend_cls))
        if backend is not None:
            tracker.set_tags({"xp.input": backend.input_path})  # where the batches are made (a fallback shows)
        log.info(f"  MLflow run       {tracker.run_id} ({name})")
        if plan.diagnose:
            return Outcome("FINISHED", _diagnose(plan, backend_cls, tracker))
        before = checkpoint.require(plan.resume) if plan.resume else None
        if before:
            log.info(f"resuming after epoch {before.epoch} from {plan.resume}")
        cbs = build_callbacks(plan, backend, tracker, before, trial, job.stop_flag)
        state = _fit(plan, backend, cbs, before, trial, tracker)  # a trial's state: COMPLETE or PRUNED
        if cbs.stop is not None and cbs.stop.stopped:
            log.info(f"stopping after epoch {len(cbs.history.epochs)}: the workers change; the launcher goes on")
            return Outcome("STOPPED", float(cbs.history.epochs[-1].get("val_accuracy", 0.0)))
        if plan.save_params and plan.rank == 0:
            import numpy as np

            np.savez(plan.save_params, **backend.get_params())
        state = state if trial else "FINISHED"
        summary = summarize_run(plan, cbs, tracker, name, state, uri)
    objective = float(summary.get("throughput", 0.0) if plan.test_io else summary.get("val_accuracy", 0.0))
    values = [float(summary.get(o.metric, float("nan"))) for o in trial[1].objectives] if trial else []
    return Outcome(state, objective, values)


def _name(plan: Plan, job: JobInfo, trial: Any) -> str:
    """run_name=, else a trial's number and parameters ("trial 3: lr=0.018 batch=128"), a sweep job's swept
    values ("batch=64 lr=0.1"), or its overrides; a plain run with none: model-dataset-backend."""
    if plan.run_name:
        return plan.run_name
    if trial:
        return f"trial {trial[0].number}: " + " ".join(f"{k}={_short(v)}" for k, v in trial[0].params.items())
    swept = [o for o in job.overrides if o.lstrip("+~").split("=", 1)[0] in job.swept]
    return " ".join(swept) or run_name(job.overrides or ()) or f"{plan.model.name}-{plan.dataset.name}-{plan.backend}"


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _set_up(plan: Plan, backend_cls: type) -> Any:
    """The backend, set up before tracking: a distributed worker learns its rank here, and only rank 0 logs."""
    backend = backend_cls()
    backend.setup(plan)
    if backend.plan.rank != 0:
        for handler in logging.getLogger().handlers:  # one voice on the console and in the log: rank 0's
            handler.setLevel(logging.WARNING)
    return backend


def _open_tracker(plan: Plan, uri: str, name: str, job: JobInfo, trial: Any, reopen: str | None) -> Any:
    tags = {"xp.backend": plan.backend, "xp.model": plan.model.name, "xp.dataset": plan.dataset.name,
            "xp.dtype": plan.dtype, "xp.hardware": plan.hardware.name}
    if trial:
        tags.update({"optuna.study": trial[0].study.study_name, "optuna.trial_number": str(trial[0].number),
                     "optuna.trial_state": "RUNNING"})
    elif job.parent_run_id and not job.run_id:  # a sweep's job: found again if the sweep is killed and resumed
        tags[sweepstate.JOB_KEY] = sweepstate.job_key(job.overrides)
    tracker_cls = Tracker if plan.rank == 0 else lambda *a, **k: NullTracker()
    spool = job.output_dir / "mlflow-spool" if job.output_dir is not None else None  # the run's writes wait here
    return tracker_cls(uri, plan.experiment, name, parent_run_id=job.parent_run_id, tags=tags,
                       attach_run_id=job.run_id, reopen_run_id=reopen, spool_dir=spool)


def _attach_files(tracker: Any, job: JobInfo, trial: Any) -> None:
    if trial:
        trial[0].set_user_attr("mlflow_run_id", tracker.run_id)  # optuna-dashboard links trials to runs
    if job.output_dir is not None:
        for f in ("config.yaml", "overrides.yaml"):
            tracker.add_artifact_on_exit(job.output_dir / ".hydra" / f, "hydra")
    if job.log_file is not None:
        tracker.add_artifact_on_exit(job.log_file)


def _params(plan: Plan, backend_cls: type) -> dict[str, Any]:
    params = {**plan.requested, "batch_auto": plan.batch_auto}
    params.update({f"derived.{k}": v for k, v in plan.derived().items()})
    params.update({f"version.{k}": v for k, v in versions(backend_cls.requires).items()})
    return params


@dataclass
class RunCallbacks:
    """The run's callbacks in the order their phases need, and the ones the pipeline reads afterwards."""
    all: list[Callback]
    meter: ThroughputMeter
    history: History
    stop: Any = None  # StopAtMembershipChange, in a relaunched elastic worker


def build_callbacks(plan: Plan, backend: Any, tracker: Any, before: Any, trial: Any,
                    stop_flag: str | None = None) -> RunCallbacks:
    """Every callback of a run, by phase. At each epoch's end they see one metrics dict in this order:
    measure (time, throughput, telemetry) -> aggregate (across workers, cost) -> record (history, MLflow)
    -> commit (checkpoint: after it is logged, so an epoch interrupted in between is trained again to the
    same numbers) -> print -> decide (stop for a relaunch, prune a trial)."""
    done = list(before.history) if before else []
    # test_io times the whole epoch: a reader's start (threads, files, the first decodes) is part of reading the data
    meter = ThroughputMeter(0, IO_THROUGHPUT) if plan.test_io else ThroughputMeter(plan.timing_warmup_batches)
    history = History(done)
    billed = plan.workers if plan.elastic.enabled else 1
    system_log = (lambda m, step: tracker.log_metrics(m, step=step)) if tracker.run_id else None  # rank 0
    phases: dict[str, list[Callback]] = {
        "measure": [Progress(plan.rank), meter, *telemetry(plan, system_log)],
        "aggregate": [WorkerMetrics(backend.gather, meter.name),
                      CostMeter(plan.cost_per_hour, plan.target_accuracy, done, billed)],
        "record": [history, TrackingCallback(tracker)],
        "commit": [],
        "print": [ProgressBar(plan.steps_per_epoch, plan.worker_batch), ProgressPrinter(plan.epochs)],
        "decide": [],
    }
    if plan.elastic.enabled:
        phases["aggregate"].append(WorkerHours(plan.workers, plan.hardware, done))
    if plan.checkpoint_dir:
        phases["commit"].append(checkpoint.Checkpointer(plan.checkpoint_dir, backend.save_state,
                                                        lambda: history.epochs, plan.rank, plan.checkpoint_every,
                                                        plan.checkpoint_keep, plan.epochs))
    stop = None
    if stop_flag:  # an elastic round's worker
        stop = StopAtMembershipChange(backend.gather, stop_flag, plan.epochs)
        phases["decide"].append(stop)
    if trial and not trial[1].multi_objective:
        phases["decide"].append(TrialReporter(trial[0], trial[1].objectives[0].metric, plan.epochs))
    return RunCallbacks([cb for group in phases.values() for cb in group], meter, history, stop)


def _fit(plan: Plan, backend: Any, cbs: RunCallbacks, before: Any, trial: Any, tracker: Any) -> str:
    """Train (from a commit, if resuming); returns the trial state: COMPLETE, or PRUNED."""
    loop = LoopState(resume_at=before.meta.get("position") if before else None)  # mid-epoch: go on from there
    if before is not None:
        checkpoint.restore_random_state(before.folder)
    state = "COMPLETE"
    try:
        fit(plan, backend, cbs.all, setup=False, start_epoch=before.epoch if before else 0, state=loop)
    except (KeyboardInterrupt, Terminated):
        checkpoint.commit_interrupted(plan, backend, cbs.history.epochs, loop.partial())  # a spot notice, Ctrl-C
        raise
    except TrialPruned as e:
        state = "PRUNED"
        log.info(f"trial {trial[0].number}: {e}")
    except Exception as e:
        log.debug("training failed", exc_info=True)  # into the log file now, while the run is open
        e.xp_logged = True
        if trial:
            tracker.set_tags({"optuna.trial_state": "FAIL"})
        raise
    if trial:
        tracker.set_tags({"optuna.trial_state": state})
    return state


def summarize_run(plan: Plan, cbs: RunCallbacks, tracker: Any, name: str, state: str, uri: str) -> dict[str, Any]:
    """The end-of-run summary: logged once, printed as the report's one-row table."""
    from xp.tracking.summary import as_params, summarize, table

    summary = summarize(cbs.history.epochs, plan.cost_per_hour, cbs.meter.name)
    tracker.log_params(as_params(summary, cbs.meter.name))
    row = {"run": name, "model": plan.model.name, "batch": plan.batch, "devices": len(plan.devices) * plan.workers,
           **summary, "state": state}
    log.info("\n" + table([row]))
    log.info(f"logged to {uri} (experiment {plan.experiment}, run {tracker.run_id}); view with: "
             f"{run_url_hint(uri, getattr(tracker, 'experiment_id', None), tracker.run_id)}")
    return summary


def _diagnose(plan: Plan, backend_cls: type, tracker: Tracker) -> float:
    import os

    from xp.run.diagnose import diagnose

    log.info(f"diagnosis: {min(plan.steps_per_epoch, plan.diagnose_steps)} batches each with real data, "
             "IO only and synthetic data" + (", and synthetic on one device" if len(plan.devices) > 1 else ""))
    d = diagnose(plan, backend_cls, plan.diagnose_steps, os.cpu_count())
    tracker.log_params({**{f"diagnosis.{k}_samples_per_s": f"{v:.6g}" for k, v in d.rates.items()},
                        "diagnosis.input_path": d.pipeline, "diagnosis.input_kept_up": str(d.kept_up).lower()})
    tracker.set_tags({"xp.diagnosis": d.verdict, "xp.input": d.pipeline})
    for k, v in d.rates.items():
        log.info(f"  {k:<20} {v:10.1f} samples/s")
    log.info(f"input: {d.pipeline}: " + (f"kept up ({d.rates['io']:.0f} samples/s alone, training alone takes "
                                          f"{d.rates['synthetic']:.0f})" if d.kept_up else
                                          f"did not keep up ({d.rates['io']:.0f} samples/s alone, training alone "
                                          f"could take {d.rates['synthetic']:.0f})"))
    log.info(f"verdict: {d.verdict}: {d.advice}")
    return d.rates["real"]
