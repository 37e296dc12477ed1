"""A run's record in MLflow: its name, the tags and parameters it opens
with (one batch), and the one-row summary table it ends with. The tracker writes; this module decides what."""

from __future__ import annotations

import json
import logging
from typing import Any

from xp.run.backend import Backend
from xp.run.plan import Plan
from xp.states import RunStatus, TrialState
from xp.readback import sweepstate
from xp.readback.view import run_url_hint
from xp.tracking.provenance import versions
from xp.tracking.tracker import Tracker
from xp.tracking.naming import run_name

log = logging.getLogger("xp")


def name_of(plan: Plan, job: Any, trial: Any) -> str:
    """run_name=, else a trial's number and parameters ("trial 3: lr=0.018 batch=128"; a run that confirms a study's
    best: "confirm 0: lr=0.018 batch=128 seed=43"), a sweep job's swept
    values ("batch=64 lr=0.1"), or its overrides; a plain run with none: model-dataset-backend."""
    if plan.run_name:
        return plan.run_name
    if trial:
        from xp.studies.confirm import study_of

        name = trial.optuna.study.study_name  # (sweep.confirm's runs: "confirm N")
        kind = "trial" if study_of(name) == name else "confirm"
        return f"{kind} {trial.optuna.number}: " + " ".join(f"{k}={_short(v)}" for k, v in trial.optuna.params.items())
    swept = [o for o in job.overrides if o.lstrip("+~").split("=", 1)[0] in job.swept]
    return " ".join(swept) or run_name(job.overrides or ()) or f"{plan.model.name}-{plan.dataset.name}-{plan.backend}"


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def params_of(plan: Plan, backend_cls: type[Backend], trial: Any = None) -> dict[str, Any]:
    """A run's MLflow parameters: what was asked, what was derived from it, the versions that ran it. A study's
    trial leaves out the study's settings (sweep.*: the same for every trial, on the study's parent run); a run
    that is not elastic, the elastic settings it does not use (elastic.enabled says so). Each such row is written
    to the tracking store once a trial (134 rows a trial before, 96 after: under MLflow's 100 a call)."""
    asked = {k: v for k, v in plan.requested.items()
             if not (trial and k.startswith("sweep.")) and (plan.elastic.enabled or not k.startswith("elastic.")
                                                            or k == "elastic.enabled")}
    return {**asked, "batch_auto": plan.batch_auto, **{f"derived.{k}": v for k, v in plan.derived().items()},
            **{f"version.{k}": v for k, v in versions(backend_cls.requires).items()}}


def open_run(plan: Plan, backend_cls: type[Backend], backend: Any, uri: str, job: Any, trial: Any,
             reopen: str | None) -> Tracker:
    """The run's tracker (rank 0's; the other ranks write nothing), to start with its name, tags and parameters
    (a resumed run has its parameters already), and the files it keeps when it ends."""
    name = name_of(plan, job, trial)
    tags = {"xp.backend": plan.backend, "xp.model": plan.model.name, "xp.dataset": plan.dataset.name,
            "xp.dtype": plan.dtype, "xp.hardware": plan.hardware.name}
    if backend is not None:
        tags["xp.input"] = backend.input_path  # where the batches are made (a fallback shows)
    if trial:
        from xp.studies.confirm import study_of

        tags.update({"optuna.study": trial.optuna.study.study_name, "optuna.trial_number": str(trial.optuna.number),
                     "optuna.trial_state": TrialState.RUNNING,
                     "xp.study": study_of(trial.optuna.study.study_name)})  # (the study it answers for)
        if job.run_id:  # a launched trial (sweep.scheduler=hydra): its launcher named the run by its command line
            tags["mlflow.runName"] = name
        spec = trial.spec
        if getattr(spec, "claim", None):  # a recipe's trial: the report's seed-claims section finds it by these
            tags.update({"xp.recipe": spec.name, "xp.claim": json.dumps(spec.claim, sort_keys=True)})
    elif job.parent_run_id and not job.run_id:  # a sweep's job: found again if the sweep is killed and resumed
        tags[sweepstate.JOB_KEY] = sweepstate.job_key(job.overrides)
    tags.update(job.tags)
    params = None if job.resumed or reopen else params_of(plan, backend_cls, trial)
    spool = job.output_dir / "mlflow-spool" if job.output_dir is not None else None  # the run's writes wait here
    tracker_cls = Tracker if plan.rank == 0 else lambda *a, **k: NullTracker()
    tracker = tracker_cls(uri, plan.experiment, name, parent_run_id=job.parent_run_id,
                          tags=tags, attach_run_id=job.run_id, reopen_run_id=reopen, spool_dir=spool, params=params,
                          tidy=job.tidy, start_ms=job.started_ms, settle_later=job.settle_later)
    kept = [(job.output_dir / ".hydra" / f, "hydra") for f in ("config.yaml", "overrides.yaml")
            if job.output_dir is not None] + ([(job.log_file, None)] if job.log_file is not None else [])
    for path, dest in kept:
        tracker.add_artifact_on_exit(path, dest)
    return tracker


def summary_table(plan: Plan, name: str, summary: dict[str, Any], state: str, uri: str, tracker: Any) -> str:
    """The end of a run on the console: its one-row table and where it is logged."""
    from xp.results import table

    row = {"run": name, "model": plan.model.name, "batch": plan.batch, "devices": len(plan.devices) * plan.workers,
           **summary, "state": state}
    model = getattr(tracker, "model", None)  # model.log: (folder, epoch, metrics)
    accuracy = next((m[1] for m in model[2] if m[0] == "val_accuracy"), float("nan")) if model else None
    said = (f"\nits model (epoch {model[1]}, val_accuracy {accuracy:.4f}): "
            f"runs:/{tracker.run_id}/model; predict with: python -m xp.predict runs:/{tracker.run_id}/model IMAGE..."
            if model else "")
    return (table([row]) + f"\nlogged to {uri} (experiment {plan.experiment}, run {tracker.run_id}); view with: "
            f"{run_url_hint(uri, getattr(tracker, 'experiment_id', None), tracker.run_id)}" + said)


class NullTracker(Tracker):
    """For distributed workers other than rank 0: only rank 0 writes to MLflow."""

    def __init__(self):
        super().__init__("", "", "")

    def start(self) -> str:
        return ""

    def log(self, params: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> None: ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def end(self, status: RunStatus) -> None: ...
