"""One experiment: plan it, train it through its backend, track it.

`run(config)` is what `python -m xp` calls for every job; tests and sweepers call
it too. It returns the objective (see run()).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from xp.data import datasets
from xp.data.recordio import with_kept_images
from xp.run import checkpoint, record
from xp.run.callbacks import (IO_THROUGHPUT, Callback, CostMeter, Progress, ProgressBar, ProgressPrinter,
                              StopAtMembershipChange, ThroughputMeter, TrackingCallback, TrialReporter, WorkerHours,
                              WorkerMetrics)
from xp.run.diagnose import diagnosed
from xp.run.model_out import SaveParams, model_output
from xp.run.plan import Plan
from xp.run.backend_plan import plan_and_backend
from xp.run.telemetry import telemetry
from xp.run.train import train_run
from xp.states import Ending, TrialState
from xp.studies.paretospec import PER_EPOCH
from xp.studies.trial import attach
from xp.readback import sweepstate
from xp.tracking.stores import resolve_uri
from xp.results import as_params, summarize
from xp.tracking.tracker import Tracker

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
    job_t0: float | None = None  # a launched worker: when its job's run started (time.time()): the bill's clock
    resumed: bool = False  # an elastic round after the first: the run's params are logged already
    swept: tuple[str, ...] = ()  # a sweep job: the keys the sweep varies (they name the run)
    trial: Any = None  # a study's trial run by a slot's worker (xp.studies.trial.StudyTrial); else from the config
    tags: dict[str, str] = field(default_factory=dict)  # more tags for the run (a trial's slot)
    # end the runs gone processes of this host left RUNNING before opening this one; a study's worker does it
    # before its first trial only (its later trials would find what its first found, less what it ended)
    tidy: bool = True
    started_ms: int | None = None  # when the job began, if before its run opens (a trial: when its worker took it)
    settle_later: bool = False  # its run's end does not wait for the store to take its records (a study's worker)


@dataclass
class Outcome:
    """What a run ends with: its state and the value(s) a sweep or a study compares."""
    state: Ending  # FINISHED | COMPLETE | PRUNED (trials) | STOPPED (an elastic worker stops for a relaunch)
    objective: float  # val_accuracy, or io_throughput with test_io
    values: list[float] = field(default_factory=list)  # a study's objectives, in its order


def run(config: dict[str, Any], job: JobInfo | None = None) -> Outcome:
    """Run one experiment from a resolved config (a plain dict): its resume point, plan and backend, its MLflow
    run, training (or a diagnosis) and its summary."""
    job = job or JobInfo()
    uri = resolve_uri(config.get("tracking_uri"), job.cwd)
    plan, backend_cls, before, reopen = planned(config, job, uri)
    trial = job.trial if job.trial is not None else attach(plan.study)
    plan = trials_folder(plan, trial)
    reused = finished_before(job, trial, uri)
    if reused is not None:
        return reused
    log.info(plan.describe(uri))
    if plan.test_io and datasets.held_in_memory(plan.dataset):
        log.warning(f"test_io: dataset={plan.dataset.name} is held in memory; its figure times slicing arrays, not "
                    "reading or decoding images (those are dataset=rec and dataset=folder)")
    plan, backend = set_up(plan, backend_cls)
    with record.open_run(plan, backend_cls, backend, uri, job, trial, reopen) as tracker:
        if trial:
            trial.optuna.set_user_attr("mlflow_run_id", tracker.run_id)  # optuna-dashboard links trials to runs
        log.info(f"  MLflow run       {tracker.run_id} ({tracker.run_name})")
        if backend is None:
            return diagnosis(plan, backend_cls, tracker, trial)
        if before:
            log.info(f"resuming after epoch {before.epoch} from {plan.resume}")
        cbs = build_callbacks(plan, backend, tracker, before, trial, job.stop_flag, job.job_t0)
        state = train_run(plan, backend, cbs.all, tracker, before, trial)  # COMPLETE or PRUNED
        if cbs.stop is not None and cbs.stop.stopped:
            log.info(f"stopping after epoch {len(cbs.history.epochs)}: the workers change; the launcher goes on")
            return Outcome(Ending.STOPPED, float(cbs.history.epochs[-1].get("val_accuracy", 0.0)))
        ending = Ending(state) if trial else Ending.FINISHED
        summary = own_summary(cbs.history.epochs, inherited(config, before, reopen, job), plan, cbs.meter.name)
        tracker.log(params=as_params(summary, cbs.meter.name))
        log.info("\n" + record.summary_table(plan, tracker.run_name, summary, ending, uri, tracker))
    return outcome(plan, trial, summary, ending)


def inherited(config: dict[str, Any], before: Any, reopen: str | None, job: JobInfo) -> int:
    """The epochs a run took from a commit another run made (resume=PATH: a PBT interval, a fine-tune going on):
    not its own. A run that goes on itself (resume=true reopens its MLflow run; an elastic group's next round)
    has trained them all."""
    if before is None or reopen or job.resumed or config.get("resume") is None:
        return 0
    return int(before.epoch)


def own_summary(history: list[dict[str, float]], inherited: int, plan: Plan, meter: str) -> dict[str, Any]:
    """The run's figures from the epochs it trained itself; those it took from a commit are named as inherited
    (summary.inherited_epochs, and the commit's best val_accuracy as summary.inherited_best_val_accuracy), not
    shown as its own best."""
    summary = summarize(history[inherited:], plan.cost_per_hour, meter)
    if inherited:
        before = summarize(history[:inherited], 0.0, meter)
        summary.update({"inherited_epochs": inherited, "first_epoch": inherited + 1,
                        **({"inherited_best_val_accuracy": before["best_val_accuracy"]}
                           if "best_val_accuracy" in before else {})})
        if "best_epoch" in summary:
            summary["best_epoch"] += inherited  # (the epoch's number in the training, as its metrics' steps)
    return summary


def planned(config: dict[str, Any], job: JobInfo, uri: str) -> tuple[Plan, Any, Any, str | None]:
    """The run's plan and backend class, the commit it goes on from (resume=; an elastic group's restart) and the
    MLflow run it reopens (resume=true or RUN_ID): (plan, backend class, commit or None, run id or None)."""
    config, reopen = sweepstate.resume_target(uri, config) if not job.run_id else (dict(config), None)
    before = checkpoint.require(config["resume"]) if config.get("resume") is not None else None
    plan, backend_cls = plan_and_backend(config, resolve_auto=True)  # below here, only the plan
    if before is None and plan.resume is not None:  # the group resumes itself (torchrun's elastic agent restarted it)
        before = checkpoint.require(plan.resume)
    return with_kept_images(plan), backend_cls, before, reopen  # (an image folder prepared: the plan counts it)


def trials_folder(plan: Plan, trial: Any) -> Plan:
    """A study's trials commit apart (and the study keeps its best's); an elastic trial's launcher owns its folder
    (its rounds resume from it)."""
    if trial and plan.checkpoint_dir and not plan.elastic.enabled:
        return replace(plan, checkpoint_dir=checkpoint.per_trial(plan.checkpoint_dir, trial.optuna.number))
    return plan


def finished_before(job: JobInfo, trial: Any, uri: str) -> Outcome | None:
    """A resumed sweep's job that finished before the sweep was killed: its run's outcome (None: it runs)."""
    if not (job.parent_run_id and not trial and not job.run_id and os.environ.get(sweepstate.RESUMED_ENV)):
        return None
    earlier = sweepstate.finished_job(uri, job.parent_run_id, sweepstate.job_key(job.overrides))
    if earlier is None:
        return None
    log.info(f"reusing MLflow run {earlier.info.run_id} ({earlier.info.run_name}): it finished in the interrupted "
             "sweep with the same settings and code")
    return Outcome(Ending.FINISHED, float(earlier.data.metrics.get("val_accuracy", 0.0)))


def set_up(plan: Plan, backend_cls: Any) -> tuple[Plan, Any]:
    """The backend, set up before tracking (a distributed worker learns its rank here; rank 0 logs, the others
    speak only of warnings), and the plan it completed; (plan, None) for a diagnosis, which makes its own."""
    if plan.diagnose:
        return plan, None
    backend = backend_cls()
    backend.setup(plan)
    if backend.plan.rank != 0:
        for handler in logging.getLogger().handlers:  # one voice on the console and in the log: rank 0's
            handler.setLevel(logging.WARNING)
    return backend.plan, backend


def diagnosis(plan: Plan, backend_cls: Any, tracker: Tracker, trial: Any) -> Outcome:
    """diagnose=true: where the time goes, logged on the run; its objective is the real data's throughput."""
    rate, params, tags = diagnosed(plan, backend_cls)
    tracker.log(params={**params, "summary.throughput_samples_per_s": f"{rate:.6g}"},
                tags={**tags, **({"optuna.trial_state": TrialState.COMPLETE} if trial else {})})
    values = [rate if o.metric == "throughput" else float("nan") for o in trial.spec.objectives] if trial else []
    return Outcome(Ending.COMPLETE if trial else Ending.FINISHED, rate, values)


def outcome(plan: Plan, trial: Any, summary: dict[str, Any], ending: Ending) -> Outcome:
    """What a sweep or a study compares: validation accuracy (test_io: the read throughput); a study's trial, its
    objectives in the study's order."""
    objective = float(summary.get("throughput", 0.0) if plan.test_io else summary.get("val_accuracy", 0.0))
    values = [float(summary.get(o.metric, float("nan"))) for o in trial.spec.objectives] if trial else []
    return Outcome(ending, objective, values)


class History(Callback):
    """The metrics of every finished epoch, also when training stops early (and those before a resume)."""

    def __init__(self, before: list[dict[str, float]] | None = None):
        self.epochs: list[dict[str, float]] = list(before or [])

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.epochs.append(dict(metrics))


@dataclass
class RunCallbacks:
    """The run's callbacks in the order their phases need, and the ones the pipeline reads afterwards."""
    all: list[Callback]
    meter: ThroughputMeter
    history: History
    stop: Any = None  # StopAtMembershipChange, in a relaunched elastic worker


def bill(plan: Plan, done: list[dict[str, float]], tracker: Tracker, job_t0: float | None) -> CostMeter:
    """The run's cost (CostMeter): from its MLflow run's start, or an elastic job's (its rounds' clock). An
    elastic run bills each worker as an instance, on a spot trace at the trace's prices (and says what the same
    instance time costs on demand); so does the fixed cluster of a trace's peak (elastic.enabled=false with a
    trace), at the plan's price."""
    e = plan.elastic
    start = tracker.start_ms / 1000 if tracker.start_ms else job_t0  # (a launched job's run's)
    cluster = e.enabled or bool(plan.requested.get("elastic.trace"))  # a worker an instance
    return CostMeter(plan.cost_per_hour, plan.target_accuracy, done, plan.workers if cluster else 1, start,
                     job_t0 if e.enabled else None, (e.trace, e.trace_speed) if e.enabled and e.trace else None,
                     plan.hardware.price_per_hour * plan.hosts if e.enabled else 0.0)


def build_callbacks(plan: Plan, backend: Any, tracker: Tracker, before: Any, trial: Any,
                    stop_flag: str | None = None, job_t0: float | None = None) -> RunCallbacks:
    """Every callback of a run, by phase. At each epoch's end they see one metrics dict in this order:
    measure (time, throughput, telemetry) -> aggregate (across workers, cost) -> record (history, MLflow)
    -> commit (checkpoint: after it is logged, so an epoch interrupted in between is trained again to the
    same numbers) -> output (the run's model: model.log; save_params) -> print -> decide (stop for a relaunch,
    prune a trial). A resumed run's random state comes back first."""
    done = list(before.history) if before else []
    system_log = (lambda m, step: tracker.log_metrics(m, step=step)) if tracker.run_id else None  # rank 0
    sampled = telemetry(plan, system_log)
    history = History(done)
    restore = [checkpoint.Restore(before)] if before is not None else []
    member = bool(trial) and getattr(trial.spec, "pbt", None) is not None  # (a PBT population keeps its own commits)
    objective = trial.spec.objectives[0] if trial and not trial.spec.multi_objective and not plan.elastic.enabled \
        and not member else None
    commits: list[Callback] = [
        checkpoint.Checkpointer(plan.checkpoint_dir, backend.save_state, lambda: history.epochs, plan.rank,
                                plan.checkpoint_every, plan.checkpoint_keep, plan.epochs,
                                objective and (objective.metric, objective.direction))
    ] if plan.checkpoint_dir else []
    if member and plan.rank == 0:  # after the commit: what it ends with is what the next interval loads
        from xp.run.lineage import Lineage

        commits.append(Lineage(tracker, backend.get_params, dict(trial.optuna.params), plan.epochs))
    # test_io times the whole epoch: a reader's start (threads, files, the first decodes) is part of reading the data
    meter = ThroughputMeter(0, IO_THROUGHPUT) if plan.test_io else ThroughputMeter(plan.timing_warmup_batches)
    stop = StopAtMembershipChange(backend.gather, stop_flag, plan.epochs) if stop_flag else None  # elastic rounds
    phases: dict[str, list[Callback]] = {
        "measure": [*restore, Progress(plan.rank), meter, *sampled],
        "aggregate": [WorkerMetrics(backend.gather, meter.name),
                      bill(plan, done, tracker, job_t0), *([WorkerHours(plan.workers, done)] if plan.elastic.enabled
                                                             else [])],
        "record": [history, TrackingCallback(tracker)],
        "commit": commits,
        "output": [*model_output(plan, backend, tracker, before), *([SaveParams(plan.save_params, backend.get_params)]
                                                             if plan.save_params and plan.rank == 0 else [])],
        "print": [ProgressBar(plan.steps_per_epoch, plan.worker_batch), ProgressPrinter(plan.epochs)],
        "decide": [*([stop] if stop else []),
                   *([TrialReporter(trial.pruner, [PER_EPOCH.get(o.metric, o.metric) for o in trial.spec.objectives],
                                    plan.epochs)]
                     if trial and (not trial.spec.multi_objective or trial.spec.pruner == "pareto") else [])],
    }
    return RunCallbacks([cb for group in phases.values() for cb in group], meter, history, stop)
