"""The MLflow work a sweep's or a study's command does besides its runs, each a function of JSON in and JSON out
(CALLS) that the tracking service runs for the command (`service.call`), so that the command never imports MLflow
on a SQLite store (2-3 s of CPU beside its trials on a 2-core machine); without a service the command runs it.

- `sweep_result`: the sweep's children read back (its table's rows), the parent's summary params and tags, the UI's
  view of its runs;
- `study_result`: the study's best trial (or Pareto front) on its parent run, its model registered;
- `best_model`: the registry's alias `best` moved to a trial's model once the run has it (a study's BestModel);
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from xp.states import RunStatus


def sweep_result(uri: str, experiment_id: str, parent: str, kind: str, params: list[str],
                 metrics: list[str], study: str | None = None) -> dict[str, Any]:
    """The sweep's children as its table's rows (one per job: a resumed sweep's latest), the parent's summary
    params and tags from them (the caller logs them on the parent, through its spool), and the key of the UI's
    view of its runs (None: not written)."""
    from xp import results as summary
    from xp.readback import view
    from xp.tracking.stores import open_client
    from xp.readback.sweepstate import latest_per_job

    client = open_client(uri)
    children = latest_per_job(search_all(client, [str(experiment_id)], f"tags.mlflow.parentRunId = '{parent}'",
                                         order_by=["attributes.start_time ASC"]))
    rows = [summary.row_from_mlflow(r) for r in children]
    for row, run in zip(rows, children):  # a run stopped before its summary (Ctrl-C): the epochs it logged
        if row["epochs"] is None and row["val_accuracy"] is not None:
            row["epochs"] = len(client.get_metric_history(run.info.run_id, "val_accuracy"))
    ends = [int(r.data.tags["xp.pbt.epochs"].rpartition("-")[2]) for r in children if "xp.pbt.epochs" in r.data.tags]
    return {"rows": rows, "params": summary.parent_params(rows, children), "tags": summary.parent_tags(children),
            "view": view.share(client, experiment_id, parent, kind, params, metrics, study, max(ends, default=None))}


def study_result(uri: str, parent: str | None, study: str, register_model: str, metric: str,
                 multi_objective: bool, front: list[dict[str, Any]], summary: dict[str, Any],
                 description: str = "") -> str | None:
    """The study's result on its parent MLflow run (`parent`; through a spool of its own: a store that is away
    takes it when it is back, or xp.sync delivers it): its best trial named in the run's description and tags,
    linked to its model; and (`register_model`) its best trial's model, or every Pareto member's, in the Model
    Registry; returns the line that says where, or None."""
    versions: list[tuple[int, str]] = []
    said = None
    if register_model:
        from xp.readback.registry import register_front, registered_line

        versions = register_front(uri, register_model, front, multi_objective)
        said = registered_line(register_model, versions, multi_objective)
    if parent:
        _on_parent(uri, parent, study, register_model, metric, multi_objective, front, summary,
                   description, dict(versions))
    return said


def _on_parent(uri: str, parent: str, study: str, register_model: str, metric: str, multi_objective: bool,
               front: list[dict[str, Any]], summary: dict[str, Any], description: str,
               versions: dict[int, str]) -> None:
    from xp.tracking.spool import state_dir
    from xp.tracking.tracker import Tracker

    tracker = Tracker(uri, "", "", attach_run_id=parent, spool_dir=state_dir() / "summaries")
    tracker.start()
    folder = Path(tempfile.mkdtemp(prefix="xp-study-"))
    try:
        best = front[0] if front and not multi_objective else None
        params = best["params"] if best else {}
        tags = {"optuna.study": study, "xp.register_model": register_model}
        head, _, rest = description.partition("\n")  # the study's line, then its best, then the rest
        lines = [head] if head else []
        for member in front:
            version = versions.get(int(member["trial"]))
            model = f"models:/{register_model}/{version}" if version else None
            lines.append(f"- {'best trial' if best else 'Pareto member'}: **trial {member['trial']}** "
                         + ", ".join(f"{k} = {v:.4g}" for k, v in member["values"].items()) + "; "
                         + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                                     for k, v in member["params"].items())
                         + (f"; its run: `{member['mlflow_run_id']}`" if member.get("mlflow_run_id") else "")
                         + (f"; its model: `{model}`" + (f" (`models:/{register_model}@best`)" if best else "")
                            if model else ""))
        lines += [rest] if rest else []
        if best:
            tags.update({"xp.best_trial": str(best["trial"]), "xp.best_run_id": str(best.get("mlflow_run_id") or "")})
            version = versions.get(int(best["trial"]))
            if version:
                tags["xp.best_model"] = f"models:/{register_model}/{version}"
        if lines:
            tags["mlflow.note.content"] = "\n".join(lines)  # the run page's description
        if summary.get("question_changes"):  # (the report says them beside its trials)
            tags["xp.study.changes"] = "\n".join(summary["question_changes"])
        tracker.log(params={f"best.{k}": v for k, v in params.items()}, tags=tags)
        if params:
            tracker.log_metrics({f"best_{metric}": best["values"][metric]} if best else {})
        name = folder / ("pareto_front.json" if multi_objective else "best_trial.json")
        name.write_text(json.dumps(summary, indent=1, default=str))
        tracker.add_artifact_on_exit(name)
    finally:
        tracker.end(RunStatus.FINISHED)  # attached: its records only; the parent's own end is the sweep's
        shutil.rmtree(folder, ignore_errors=True)  # the spool keeps its own copy


def best_model(uri: str, name: str, member: dict[str, Any]) -> dict[str, Any]:
    """The registry's alias `best` on trial `member`'s model, if its run has logged one: {"said": the line, or
    None; "waiting": its run is not in the store yet, or still RUNNING (its records are on their way)}."""
    from xp.tracking.models import RUN_TAG
    from xp.readback.registry import register_best
    from xp.tracking.stores import open_client

    run = open_client(uri).get_run(member["mlflow_run_id"])
    if run.data.tags.get(RUN_TAG):
        return {"said": register_best(uri, name, [member], False), "waiting": False}
    return {"said": None, "waiting": run.info.status == RunStatus.RUNNING}


def search_all(client: Any, experiment_ids: list[str], filter_string: str = "", order_by: list[str] | None = None,
               page: int = 1000) -> list[Any]:
    """Every run the search finds, a page at a time (search_runs answers at most max_results runs: a study of
    more trials than that would be counted short)."""
    runs, token = [], None
    while True:
        found = client.search_runs(experiment_ids, filter_string, max_results=page, order_by=order_by,
                                   page_token=token)
        runs.extend(found)
        token = found.token
        if not token:
            return runs


CALLS: dict[str, Callable[..., Any]] = {f.__name__: f for f in (sweep_result, study_result, best_model)}
