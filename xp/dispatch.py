"""The launching side of a run: what the command line asks, started (`start`): a distributed job's processes
through its engine and launcher, a batch submission followed, a sweep's jobs under one MLflow parent
(xp/multirun.py), or one run. This process owns the MLflow runs of jobs and submissions and ends them
(Tracker.owned: xp.tracking.ending.end_state decides how)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from xp.errors import ConfigError
from xp.run.worker import WORKER_ENV
from xp.states import Ending

if TYPE_CHECKING:
    from xp.launching.launcher import Launcher
    from xp.launching.placement import InBatches, OnSlots, Placement
    from xp.preflight import Checked
    from xp.run.plan import Plan
    from xp.studies.study import StudySpec

log = logging.getLogger("xp")


def start(argv: list[str], checked: Checked, hydra_main: Callable[[list[str]], int],
          placement: Placement | None = None) -> int:
    """What the command line asks (`checked` by xp.preflight), started: a distributed job or a batch submission
    (one at a time), a sweep under one MLflow parent run, or one run (Hydra's job, `hydra_main`). A study's trials
    go where `placement` (xp.launching.placement, made by the command line) decides, once the composed command
    says."""
    multirun = "-m" in argv or "--multirun" in argv
    first = checked.configs[0] if checked.configs else {}
    launching = checked.configs and not os.environ.get(WORKER_ENV)  # (a launched worker: its launcher did this)
    plan, engine, launcher = plan_engine_launcher(first) if launching else (None, None, None)
    spec = checked.study if multirun else None
    choice = study_placement(spec, first, argv, launcher) if spec is not None else None
    on_slots = _on_slots(choice)  # the launcher offers the study slots
    if launcher and launcher.submits() and multirun and not on_slots:
        raise ConfigError(f"launcher={launcher.name} submits one run at a time, or a study's workers (-m sweep=NAME); "
                          "run each configuration as its own command" + (f" ({launcher.sweeps})" if launcher.sweeps
                                                                          else ""))
    if engine and multirun and on_slots:
        raise ConfigError(f"a study of {engine.name} jobs launches its trials one after another: set "
                          "sweep.scheduler=hydra (a study's slot workers train in their own process)")
    if plan is not None and (engine or (launcher and launcher.submits())) and not multirun:
        launch_job(argv, plan, engine, launcher)
        return 0
    if launching and not (launcher and launcher.remote):  # runs of this machine: its tracking service started now
        from xp.tracking import service  # (its MLflow import overlaps this process's work)
        from xp.tracking.stores import resolve_uri

        service.ahead(resolve_uri(first.get("tracking_uri")))
    if not multirun:
        return hydra_main(argv)
    from xp import multirun as sweeps
    from xp.launching.placement import Placement
    from xp.tracking.stores import resolve_uri

    # (plan None: another config tree, --config-path; its jobs' store is the default one)
    uri = plan.tracking_uri if plan is not None else resolve_uri(None)
    with placement or Placement() as where:  # the study's sweeper, which Hydra makes, takes it from there
        if spec is not None and choice is not None:
            where.decide(first, choice, spec, uri)
        return sweeps.sweep(argv, first, uri, hydra_main)


def study_placement(spec: StudySpec, config: dict[str, Any], argv: list[str],
                    launcher: Launcher | None) -> OnSlots | InBatches:
    """Where a study's trials run (xp.launching.placement.choose: slots or Hydra's batches), from its spec (its
    sweep.* settings, read once by the preflight), its Hydra launcher and xp's launcher."""
    from xp.launching.hydra_launchers import chosen
    from xp.launching.placement import choose

    return choose(spec, chosen(argv), launcher, int(config.get("gpus") or 0))


def _on_slots(choice: OnSlots | InBatches | None) -> bool:
    from xp.launching.placement import OnSlots

    return isinstance(choice, OnSlots)


def plan_engine_launcher(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The run's plan, the distributed engine it needs (its backend decides; None: this process trains) and
    its launcher."""
    from xp.launching.launcher import gpus_here, launcher_for
    from xp.run.backend_plan import plan_and_backend

    plan, backend_cls = plan_and_backend(config, gpus_here=gpus_here(config))
    return plan, backend_cls.engine_for(plan), launcher_for(plan)


def launched_job(job: Any, config: dict[str, Any]) -> Any:
    """A sweep's job, or a study's trial (sweep.scheduler=hydra), that is a distributed job: launched as its own
    command would be, its MLflow run under the sweep's parent; returns its outcome, read from that run (a trial's:
    its objectives' values). None: not a distributed job (this process trains it)."""
    from xp.run.experiment import Outcome
    from xp.tracking.stores import open_client
    from xp.results import row_from_mlflow

    plan, engine_cls, launcher = plan_engine_launcher(config)
    if engine_cls is None:
        return None
    swept = " ".join(o for o in job.overrides if o.lstrip("+~").split("=", 1)[0] in job.swept)
    if swept and not plan.run_name:
        plan = replace(plan, run_name=swept)  # as a sweep's other jobs are named: by what it varied
    run_id = launch_job(job.overrides, plan, engine_cls, launcher, parent=job.parent_run_id)
    row = row_from_mlflow(open_client(plan.tracking_uri).get_run(run_id))
    values = []
    if plan.study is not None:
        from xp.studies.study import spec_from

        spec = spec_from(plan.study.sweep, plan.study.sweep.get("name") or plan.study.study, search=False)
        values = [float("nan") if row.get(o.metric) is None else float(row[o.metric]) for o in spec.objectives]
    state = Ending.COMPLETE if plan.study is not None else Ending.FINISHED
    return Outcome(state, float(row.get("val_accuracy") or 0.0), values)


def launch_job(argv: list[str], plan: Plan, engine_cls: Any, launcher: Any, parent: str | None = None) -> str:
    """A distributed job, or a batch submission: this process owns the MLflow run (under `parent`: a sweep's
    job), and returns its id. It starts the workers, and rank 0 fills the run; or (a batch system, launcher=slurm
    from a login node) it submits the run, follows it and ends it with the job's outcome (the batch system's
    reason when it ended the job)."""
    if plan.resume is not None and not Path(str(plan.resume)).expanduser().is_dir():
        raise ConfigError(f"resume={plan.resume}: a distributed run resumes from a folder "
                          "(resume=CHECKPOINT_DIR, a new MLflow run)")
    from xp.launching.engine import prepared
    from xp.launching.job import launch
    from xp.run import handoff
    from xp.run.worker import HOSTS_ENV
    from xp.launching.reach import check_reachable
    from xp.tracking.tracker import Tracker
    from xp.tracking.naming import run_name

    uri, elastic_on, engine = plan.tracking_uri, plan.elastic.enabled, None
    tags = {"xp.launcher": launcher.name, "xp.engine": engine_cls.name if engine_cls else "none",
            "xp.workers": str(plan.workers)}

    def reached(hosts: list[str], address: str | None) -> None:  # the store, from the hosts
        check_reachable(uri, hosts, address)

    if launcher.submits():
        launcher.check_submission()
        reached([launcher.nodes], None)
    else:
        engine = prepared(plan, argv, engine_cls, launcher, {"MLFLOW_TRACKING_URI": uri}, elastic_on, reached)
        tags["xp.workers"] = str(engine.spec.workers)
        if engine.spec.remote:
            tags["xp.hosts"] = ",".join(engine.hosts())
            if not elastic_on:  # the instances the job occupies: rank 0 prices them (elastic: per worker)
                engine.spec.env[HOSTS_ENV] = str(len(engine.hosts()))
                plan = replace(plan, hosts=len(engine.hosts()))
    if parent:  # a sweep's job: under its parent run
        from xp.readback import sweepstate

        tags.update({"mlflow.parentRunId": parent, sweepstate.JOB_KEY: sweepstate.job_key(argv)})
    tracker = Tracker(uri, plan.experiment, plan.run_name or run_name([a for a in argv if not a.startswith("-")]),
                      attach_run_id=launcher.submitted_run(), tags=tags)
    run_id = tracker.start()
    with tracker.owned():
        if engine is None:
            launcher.submit(plan, argv, tracker)
            return run_id
        workers_plan = plan if plan.requested.get("batch") != "auto" else None  # (batch=auto: each finds its own)
        launched = handoff.Launched(run_id=run_id, job_t0=tracker.start_ms / 1000 if tracker.start_ms else None)
        engine.spec.env[handoff.PLAN_ENV] = handoff.dumps(workers_plan, launched)
        print(f"xp: launching {engine.describe()}; MLflow run {run_id}", flush=True)
        policy = None  # the job's processes run once, or (elastic) follow the members there are
        if elastic_on:  # as the engine's runner does that, or in xp's rounds
            policy = engine.elastic_policy(plan, tracker, launched)
            if policy is None:
                from xp.launching.elastic import Elastic

                policy = Elastic(plan, lambda metrics, step: tracker.log_metrics(metrics, step=step),
                                 workers_plan is not None, launched)
        launch(engine, policy)
    return run_id
