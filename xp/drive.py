"""The launching side of a run: a distributed job's processes started through its engine and watched, a Slurm
submission followed, a sweep's jobs run under one MLflow parent; this process owns those MLflow runs and ends
them (xp.tracking.tracker.end_state decides how)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from xp.errors import ConfigError, XPError, one_line
from xp.run.worker import WORKER_ENV

PARENT_ENV = "XP_PARENT_RUN_ID"  # set for the jobs of a sweep: their MLflow parent run
SWEPT_ENV = "XP_SWEPT_KEYS"  # set for the jobs of a sweep: the keys it varies, comma-separated

log = logging.getLogger("xp")


def error_line(msg: object, code: int) -> int:
    """Print the one line of an error (stderr) and return its exit code."""
    print(f"xp: error: {one_line(msg)}", file=sys.stderr)
    return code


def start(argv: list[str], configs: list[dict[str, Any]], hydra_main: Callable[[list[str]], int]) -> int:
    """What the command line asks, started: a distributed job or a batch submission (one at a time), a sweep
    under one MLflow parent run, or one run (Hydra's job, `hydra_main`)."""
    multirun = "-m" in argv or "--multirun" in argv
    first = configs[0] if configs else {}
    plan, engine, launcher = job_of(first) if configs and not os.environ.get(WORKER_ENV) else (None, None, None)
    if engine or (launcher and launcher.submits()):
        if multirun:
            raise ConfigError(f"{engine.name if engine else f'launcher={launcher.name}'} runs are launched one at a "
                              "time; run each configuration as its own command (a sweep's jobs go to Slurm with "
                              "hydra/launcher=submitit_slurm)")
        return launch_job(argv, plan, engine, launcher)
    if not multirun:
        return hydra_main(argv)
    check_cluster_sweep(argv, first)
    if first.get("sweep"):
        _register_study_sweeper()
        argv = [*argv, "hydra/sweeper=xp_optuna"]
    return sweep(argv, first, hydra_main)


def _register_study_sweeper() -> None:
    """Hydra instantiates sweepers only from hydra_plugins; ours is installed there and registered here."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.xp_optuna_sweeper import XPOptunaSweeper

    Plugins.instance().register(XPOptunaSweeper)


def job_of(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The run's plan, the distributed engine it needs (its backend decides; None: this process trains) and
    its launcher."""
    from xp.launching.launcher import launcher_for
    from xp.run.experiment import plan_and_backend

    plan, backend_cls = plan_and_backend(config)
    return plan, backend_cls.launch(plan), launcher_for(plan)


def launch_job(argv: list[str], plan: Any, engine_cls: Any, launcher: Any) -> int:
    """A distributed job: this process starts the workers and owns the MLflow run, which rank 0 fills (or, for
    a batch system, submits the run and follows it)."""
    from xp.launching.job import LaunchError, launch, prepare, spec_for
    from xp.run import handoff
    from xp.run.worker import HOSTS_ENV
    from xp.tracking.stores import check_reachable, resolve_uri
    from xp.tracking.tracker import Tracker, run_name

    uri = resolve_uri(plan.tracking_uri)
    if plan.resume is not None and not Path(str(plan.resume)).expanduser().is_dir():
        raise ConfigError(f"resume={plan.resume}: a distributed run resumes from a folder "
                          "(resume=CHECKPOINT_DIR, a new MLflow run)")
    overrides = [a for a in argv if not a.startswith("-")]
    if launcher.submits():
        return submit(argv, plan, engine_cls, launcher, uri, overrides)
    elastic_on = plan.elastic.enabled
    spec = spec_for(plan, argv, engine_cls, env={"MLFLOW_TRACKING_URI": uri}, launcher=launcher,
                    elastic=elastic_on)
    engine = engine_cls(spec)
    prepare(engine, [h.name for h in spec.hosts] if elastic_on else None,  # elastic: every listed host
            before_probe=lambda: check_reachable(uri, [h.name for h in spec.hosts], spec.host_ip))
    if spec.remote and not elastic_on:  # the instances the job occupies: rank 0 prices them (elastic: per worker)
        spec.env[HOSTS_ENV] = str(len(engine.hosts()))
        plan = replace(plan, hosts=len(engine.hosts()))
    tracker = Tracker(uri, plan.experiment, plan.run_name or run_name(overrides), attach_run_id=launcher.submitted_run(),
                      tags={"xp.launcher": launcher.name, "xp.engine": engine.name, "xp.workers": str(spec.workers),
                            **({"xp.hosts": ",".join(engine.hosts())} if spec.remote else {})})
    tracker.start()
    handed = plan if plan.requested.get("batch") != "auto" else None  # batch=auto: each worker finds its batch
    spec.env[handoff.PLAN_ENV] = handoff.dumps(handed, handoff.Launched(run_id=tracker.run_id))
    print(f"xp: launching {engine.describe()}; MLflow run {tracker.run_id}", flush=True)

    policy = None  # the job's processes run once
    if elastic_on:  # or in rounds, on the members there are
        from xp.launching.elastic import Elastic

        policy = Elastic(plan, lambda metrics, step: tracker.log_metrics(metrics, step=step))
    return owned_run(tracker, lambda: launch(engine, policy), LaunchError)


def owned_run(tracker: Any, body: Any, expected: type[XPError]) -> int:
    """body() in the MLflow run this process owns, which it ends FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED
    (`expected`: one line and its exit code; anything else propagates)."""
    from xp.tracking.tracker import end_state

    error: BaseException | None = None
    try:
        body()
        return 0
    except expected as e:
        error = e
        return error_line(e, e.exit_code)
    except BaseException as e:
        error = e
        raise
    finally:
        tracker.end(end_state(error))


def check_cluster_sweep(argv: list[str], config: dict[str, Any]) -> None:
    """hydra/launcher=submitit_slurm: every job or trial runs on a cluster node, so the MLflow store, and a
    study's Optuna storage (its trials report every epoch for pruning), must be ones every node reaches."""
    from xp.tracking.stores import check_reachable, resolve_uri

    launcher = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("hydra/launcher=")), "")
    if not launcher.startswith("submitit_slurm"):
        return
    nodes = [f"the Slurm jobs' nodes (hydra/launcher={launcher})"]
    check_reachable(resolve_uri(config.get("tracking_uri")), nodes, None)
    if config.get("sweep"):
        from xp.studies.study import storage_url

        check_reachable(storage_url(config["sweep"].get("storage")), nodes, None, key="sweep.storage",
                        fix="give the study a database every node reaches: "
                            "sweep.storage=postgresql://USER:PASSWORD@HOST/DB (or $XP_OPTUNA_STORAGE)")


def submit(argv: list[str], plan: Any, engine_cls: Any, launcher: Any, uri: str, overrides: list[str]) -> int:
    """The run as a batch job (launcher=slurm from a login node); this process owns its MLflow run and ends it
    with the job's outcome (the batch system's reason when it ended the job)."""
    from xp.tracking.stores import check_reachable
    from xp.tracking.tracker import Tracker, run_name

    launcher.check_submission()
    check_reachable(uri, [f"the {launcher.name} job's nodes"], None)
    tracker = Tracker(uri, plan.experiment, plan.run_name or run_name(overrides),
                      tags={"xp.launcher": launcher.name, "xp.engine": engine_cls.name if engine_cls else "none",
                            "xp.workers": str(plan.workers)})
    tracker.start()
    return owned_run(tracker, lambda: launcher.submit(plan, argv, tracker), XPError)


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun varies (KEY=a,b or a sweep function), as Hydra's override parser reads them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()]


def sweep(argv: list[str], config: dict[str, Any], hydra_main: Callable[[list[str]], int]) -> int:
    """Run a Hydra multirun under one MLflow parent run; print the sweep's table at the end."""
    from xp.tracking import summary
    from xp.tracking import sweepstate
    from xp.tracking.stores import resolve_uri
    from xp.tracking.tracker import Tracker, end_state, run_name

    uri = resolve_uri(config.get("tracking_uri"))
    overrides = [a for a in argv if a not in ("-m", "--multirun") and not a.startswith("hydra/sweeper=")]
    chosen = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("sweep=")), "")
    kind = f"study {config['sweep'].get('name') or chosen}" if config.get("sweep") else "sweep"
    experiment = config.get("experiment") or "xp"
    skey = sweepstate.key("sweep", experiment, overrides)
    parent = Tracker(uri, experiment, f"{kind}: " + run_name(overrides),
                     tags={"xp.sweep": "true", sweepstate.SWEEP_KEY: skey})
    parent.reopen_run_id = sweepstate.interrupted_parent(parent, skey)  # a killed sweep goes on where it was
    parent.start()
    if parent.reopen_run_id:
        os.environ[sweepstate.RESUMED_ENV] = "1"
        log.info(f"sweep: resuming the interrupted sweep of MLflow parent run {parent.run_id}: its finished jobs "
                 "are reused")
    else:
        parent.log_params({"sweep.overrides": " ".join(overrides)})
    os.environ[PARENT_ENV] = parent.run_id
    from hydra._internal.utils import get_args_parser

    os.environ[SWEPT_ENV] = ",".join(swept_keys(get_args_parser().parse_args(argv).overrides))
    error: BaseException | None = None
    rc = 1
    try:
        rc = hydra_main(argv)
        return rc
    except BaseException as e:
        error = e
        raise
    finally:
        status = end_state(error, failed=rc != 0)
        os.environ.pop(PARENT_ENV, None)
        os.environ.pop(SWEPT_ENV, None)
        os.environ.pop(sweepstate.RESUMED_ENV, None)
        try:
            children = sweepstate.latest_per_job(parent.child_runs())
            rows = [summary.row_from_mlflow(r) for r in children]
            parent.log_params(summary.parent_params(rows, children))
            parent.set_tags(summary.parent_tags(children))
        finally:
            parent.end(status)
        print(f"\nsweep: {len(rows)} runs under MLflow parent run {parent.run_id} ({status})")
        print(summary.table(rows))
