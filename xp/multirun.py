"""A sweep: a Hydra multirun (`-m`; a study is one, with xp's Optuna sweeper) whose jobs run under one MLflow
parent run this process owns; a killed sweep resumes where it was; its table at the end."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from xp.interrupts import held_interrupts
from xp.launching import hydra_launchers
from xp.states import RunStatus

PARENT_ENV = "XP_PARENT_RUN_ID"  # set for the jobs of a sweep: their MLflow parent run
SHOWN = 20  # the most runs the table at the end of a sweep shows (the best; xp.report shows them all)
SWEPT_ENV = "XP_SWEPT_KEYS"  # set for the jobs of a sweep: the keys it varies, comma-separated

log = logging.getLogger("xp")


def sweep(argv: list[str], config: dict[str, Any], uri: str, hydra_main: Callable[[list[str]], int]) -> int:
    """Run a Hydra multirun under one MLflow parent run in the store `uri` (the first job's plan resolved it);
    print the sweep's table at the end."""
    hydra_launchers.check_cluster_sweep(argv, config, uri)
    if config.get("sweep"):
        _register_study_sweeper()
        argv = [*argv, "hydra/sweeper=xp_optuna"]
    from xp.readback import sweepstate
    from xp.tracking.ending import end_state
    from xp.tracking.tracker import Tracker
    from xp.tracking.naming import run_name

    overrides = [a for a in argv if a not in ("-m", "--multirun") and not a.startswith("hydra/sweeper=")]
    chosen = next((a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("sweep=")), "")
    study = config.get("sweep") or {}  # (a study's parent is named after the study, not the file that defines it)
    kind = f"study {study.get('study_name') or study.get('name') or chosen}" if study else "sweep"
    experiment = config.get("experiment") or "xp"
    skey = sweepstate.key("sweep", experiment, overrides)
    recipe = set((config.get("sweep") or {}).get("settings") or ())  # a recipe's own: in its params, not its name
    parent = Tracker(uri, experiment, f"{kind}: " + run_name([o for o in overrides if o not in recipe]),  # (a killed
                     tags={"xp.sweep": "true", sweepstate.SWEEP_KEY: skey}, resumes=(sweepstate.SWEEP_KEY, skey))
    error: BaseException | None = None
    rc = 1
    try:
        with held_interrupts() as held:  # Ctrl-C while the parent run is made: it is made, then ended KILLED below
            parent.start()  # sweep goes on where it was: its parent run is reopened)
            if parent.reopen_run_id:
                os.environ[sweepstate.RESUMED_ENV] = "1"
                log.info(f"sweep: resuming the interrupted sweep of MLflow parent run {parent.run_id}: its finished "
                         "jobs are reused")
            else:
                parent.log_params({"sweep.overrides": " ".join(overrides), **_study_settings(config)})
            os.environ[PARENT_ENV] = parent.run_id or ""
            from hydra._internal.utils import get_args_parser

            os.environ[SWEPT_ENV] = ",".join(swept_keys(get_args_parser().parse_args(argv).overrides))
        held.check()
        rc = hydra_main(argv)
        return rc
    except BaseException as e:
        error = e
        raise
    finally:
        swept = os.environ.pop(SWEPT_ENV, "")
        os.environ.pop(PARENT_ENV, None), os.environ.pop(sweepstate.RESUMED_ENV, None)
        if parent.run_id is not None:  # (None: the store never made it; its error is on its way)
            _end(parent, uri, config, swept, kind, end_state(error, failed=rc != 0))


def _end(parent: Any, uri: str, config: dict[str, Any], swept: str, kind: str, status: RunStatus) -> None:
    """The sweep's parent run ended `status`, its table printed: after what stopped workers left in spools is
    delivered (the table shows how the runs ended)."""
    rows, view = None, None
    deliver_left_over(uri, STOPPED_DELIVER_S if status == RunStatus.KILLED else DELIVER_S)
    try:
        result = _result(parent, config, swept, kind)
        rows, view = result["rows"], result["view"]
        parent.log_params(result["params"])
        parent.set_tags(result["tags"])
    except Exception as e:  # the store is away: the jobs' records wait in spools; the sweep still ends
        from xp.errors import one_line

        log.warning(f"sweep: no table: the tracking store did not answer ({one_line(e)[:200]})")
    finally:
        parent.end(status)
    if rows is not None:
        _say_table(parent, rows, status, view)


def _result(parent: Any, config: dict[str, Any], swept: str, kind: str) -> dict[str, Any]:
    """The sweep's children read back (xp.readback.work.sweep_result, by the tracking service where there is
    one), and the UI's view of its runs written: a study's searched parameters and its answer first, as the
    study's answer names them (xp.answers), a sweep's varied keys, against the objective(s)."""
    from xp.tracking.messages import SweepResult
    from xp.trackingd import call

    study = config.get("sweep") or {}
    params = [k for k in swept.split(",") if k]
    metrics = [o["metric"] for o in study.get("objectives") or []] or ["val_accuracy"]
    name = (study.get("study_name") or study.get("name")) if study else None
    answer = _answer(study, name) if study else None
    if study:
        params = answer.searched if answer is not None else list(study.get("params") or {})
    return call(SweepResult(parent.uri, str(parent.experiment_id), parent.run_id, kind, params, metrics, study=name,
                            ranked=bool(answer is not None and answer.ranking),
                            confirmed=bool(answer is not None and answer.confirmed),
                            last_epoch=answer.extra.get("last_epoch") if answer is not None else None))


def _answer(study: dict[str, Any], name: str | None) -> Any:
    """The answer the study's search wrote (None: none, or its storage away: the view goes without it)."""
    from xp.studies.study import storage_url
    from xp.studies.summary import load

    try:
        return load(storage_url(study.get("storage")), str(name))
    except Exception as e:  # (the study's error, if any, was said by its sweeper)
        log.debug("the study's answer not read: %s", e)
        return None


def _say_table(parent: Any, rows: list[dict[str, Any]], status: str, view: str | None = None) -> None:
    """The sweep's table: every run, or the SHOWN best of a larger sweep with where to see them all."""
    from xp import results as summary

    print(f"\nsweep: {len(rows)} runs under MLflow parent run {parent.run_id} ({status})")
    print(summary.table(rows if len(rows) <= SHOWN else summary.best(rows, SHOWN)))
    if len(rows) > SHOWN:
        print(f"(the {SHOWN} best of {len(rows)} by best val_accuracy; all of them in the report below)")
    print(compare_lines(parent.uri, parent.experiment, parent.experiment_id, parent.run_id, view))


def compare_lines(uri: str, experiment: str, experiment_id: str | None, run_id: str, view: str | None = None) -> str:
    """How to compare a sweep's runs: its report's command, its runs in the MLflow UI (the view xp shared: what it
    varied against the objective), and the parent's page."""
    import sys
    from pathlib import Path

    from xp.errors import redact
    from xp.readback import view as views
    from xp.readback.view import page, typed
    from xp.tracking.stores import DEFAULT_URI, resolve_uri

    default = uri == resolve_uri(DEFAULT_URI)
    store = "" if default else f" --tracking-uri '{redact(uri)}'"
    named = "" if experiment == "xp" else f" --experiment {experiment}"
    python = typed(Path(sys.executable))
    if uri.startswith(("http://", "https://")):
        base, start = uri.rstrip("/"), ""
    else:
        mlflow = typed(Path(sys.executable).parent / "mlflow")
        base = "http://127.0.0.1:5000"
        serve = "make ui PORT=5000" if default else f"{mlflow} ui --backend-store-uri {redact(uri)!r} --port 5000"
        start = f"{serve}, then "
    lines = [f"compare: {python} -m xp.report --parent {run_id}{named}{store}   (tables and plots into reports/)"]
    if view and experiment_id:
        lines.append(f"     UI: {start}{base}/{views.view_page(experiment_id, view)}   (its runs, what it varied "
                     "against the objective)")
        start = ""
    lines.append(f"{'     UI' if start else ' parent'}: {start}{base}/{page(experiment_id, run_id)}")
    return "\n".join(lines)


DELIVER_S = 30.0  # how long a sweep's end waits for a store that is away to take what its processes left
STOPPED_DELIVER_S = 3.0  # ... when it was stopped (Ctrl-C): the records then wait in their spools (xp.sync)


def deliver_left_over(uri: str, wait_s: float = DELIVER_S) -> int:
    """What the sweep's processes left in spools for `uri` (a study's workers that ended while the store was away)
    delivered, within wait_s in all; one line says how many records still wait. Returns that number."""
    from xp.tracking.leftovers import pending
    from xp.tracking.messages import DeliverLeft
    from xp.trackingd import call

    if not pending(uri):  # (the common case: nothing left, no call to the service)
        return 0
    left = call(DeliverLeft(uri, wait_s))  # (by the tracking service: this process imports no
    # MLflow; delivered by this one if the service does not serve the store)
    if left:
        from xp.errors import redact

        log.warning(f"sweep: {left} records wait for {redact(uri)}, which is away; deliver them with: "
                    "python -m xp.sync")
    return left


def _register_study_sweeper() -> None:
    """Hydra instantiates sweepers only from hydra_plugins; ours is installed there and registered here."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.xp_optuna_sweeper import XPOptunaSweeper

    Plugins.instance().register(XPOptunaSweeper)


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun varies (KEY=a,b or a sweep function), as Hydra's override parser reads them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()]


def _study_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A study's settings (sweep.*, as its trials' configs have them), logged once on its parent run: its trials
    leave them out (xp.run.record.params_of)."""
    if not config.get("sweep"):
        return {}
    from xp.run.plan import flatten

    return flatten({"sweep": config["sweep"]})
