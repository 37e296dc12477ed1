"""What interrupted work goes on from: a killed sweep's parent run and finished jobs, and the MLflow run a
`resume=true` (or resume=RUN_ID) continues (resume_target).

A killed sweep resumes: the same command again finds its interrupted parent run and reuses its finished jobs.

A sweep's parent run carries the key of its command (experiment, overrides, and the code: git commit, and a
hash of the changes when the tree has any); each job's run the key of its own overrides and the code. Run
again after a kill, the sweep reopens the interrupted parent with the same key, and each job whose key has a
FINISHED run under it is reused instead of trained again (runs are deterministic: same settings, same code,
same result); the rest run, and the parent ends with its summary. A FINISHED parent is never reopened: the
same command after a complete sweep is a new sweep.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from typing import Any

from xp.errors import ConfigError
from xp.states import RunStatus

log = logging.getLogger("xp")

SWEEP_KEY, JOB_KEY = "xp.sweep_key", "xp.job_key"
RESUMED_ENV = "XP_SWEEP_RESUMED"  # set by the sweep for its jobs: the parent was reopened, look for earlier jobs


@functools.lru_cache(maxsize=None)
def code_identity() -> str:
    """What the code is: xp's git commit, plus a hash of the uncommitted changes to tracked files; or xp's
    version where it runs from an installed wheel."""
    import subprocess

    from xp.tracking.provenance import CHECKOUT, _git, versions

    git = _git()
    if not git:
        return "xp " + versions(()).get("xp", "?")
    ident = git["mlflow.source.git.commit"]
    if git.get("xp.git.dirty") == "true":
        root = CHECKOUT
        try:
            diff = subprocess.run(["git", "-C", str(root), "diff", "HEAD"], capture_output=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            diff = os.urandom(8)  # unknown changes: never the same code as another run's
        ident += "+" + hashlib.sha1(diff).hexdigest()[:12]
    return ident


def key(*parts: Any) -> str:
    return hashlib.sha1(json.dumps([*parts, code_identity()], sort_keys=True, default=str).encode()).hexdigest()


def job_key(overrides: list[str]) -> str:
    return key("job", sorted(o for o in overrides if not o.lstrip("+~").startswith("hydra")))


def finished_job(uri: str, parent_run_id: str, job: str) -> Any:
    """The FINISHED run of job key `job` under the parent, or None."""
    from xp.tracking.stores import open_client

    client = open_client(uri)
    exp = client.get_run(parent_run_id).info.experiment_id
    runs = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`{JOB_KEY}` = '{job}' "
                                     f"and attributes.status = '{RunStatus.FINISHED}'", max_results=1)
    return runs[0] if runs else None


def latest_per_job(children: list[Any]) -> list[Any]:
    """A resumed sweep's children, one per job: its FINISHED run, else its latest (runs in start order)."""
    best: dict[str, Any] = {}
    order: list[str] = []
    for c in children:
        k = c.data.tags.get(JOB_KEY) or c.info.run_id
        if k not in best:
            order.append(k)
        if k not in best or best[k].info.status != RunStatus.FINISHED or c.info.status == RunStatus.FINISHED:
            best[k] = c
    return [best[k] for k in order]


def resume_target(uri: str, config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """resume=true | RUN_ID -> (the config resuming from that run's checkpoint folder, the MLflow run to
    continue); resume=FOLDER, or none: (the config, None).

    true: the latest run of the experiment that did not finish and committed a state (runs left
    RUNNING by a dead process are ended FAILED first); RUN_ID: that run. Both continue the same run
    (run the same command again, adding resume=...). A folder starts a new run from its commit.
    """
    import re

    from xp.tracking.tracker import Tracker

    value = config.get("resume")
    if value is True or str(value).lower() == "true" or re.fullmatch(r"[0-9a-f]{32}", str(value)):
        tracker = Tracker(uri, config.get("experiment") or "xp", "")
        try:
            tracker.experiment_id = tracker._experiment_id()
            tracker.end_orphans()
            if value is True or str(value).lower() == "true":
                runs = tracker.client.search_runs(
                    [tracker.experiment_id], f"attributes.status != '{RunStatus.FINISHED}' and "
                                            f"attributes.status != '{RunStatus.RUNNING}'",
                    order_by=["attributes.start_time DESC"], max_results=200)
                runs = [r for r in runs if r.data.params.get("checkpoint_dir") not in (None, "None")]
                if not runs:
                    raise ConfigError("resume=true: no interrupted run with a checkpoint_dir in experiment "
                                      f"{config.get('experiment') or 'xp'}")
                run = runs[0]
            else:
                run = tracker.client.get_run(str(value))
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"resume={value}: cannot find that run ({type(e).__name__})") from None
        if run.info.status == RunStatus.RUNNING:
            raise ConfigError(f"resume={value}: run {run.info.run_id} is still running")
        folder = run.data.params.get("checkpoint_dir")
        if run.info.status == RunStatus.FINISHED:  # its summary is logged: more epochs are a new run
            raise ConfigError(f"resume={value}: run {run.info.run_id} finished; to train on from its last commit "
                              f"start a new run from its folder: resume={folder}")
        if folder in (None, "None"):
            raise ConfigError(f"resume={value}: run {run.info.run_id} committed no state (it had no checkpoint_dir)")
        return {**config, "resume": folder, "checkpoint_dir": folder}, run.info.run_id
    return dict(config), None
