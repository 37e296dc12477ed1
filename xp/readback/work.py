"""The MLflow work a sweep's or a study's command does besides its runs, each a function of JSON in and JSON out
that the tracking service runs for the command (an operation of its protocol each: xp.trackingd), so that the
command never imports MLflow on a SQLite store (2-3 s of CPU beside its trials on a 2-core machine); without a
service the command runs it.

- `sweep_result`: the sweep's children read back (its table's rows), the parent's summary params and tags, the UI's
  view of its runs;
- `study_result`: the study's best trial (or Pareto front) on its parent run, its model registered;
- `best_model`: the registry's alias `best` moved to a trial's model once the run has it (a study's BestModel);
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from xp.states import RunStatus


def sweep_result(uri: str, experiment_id: str, parent: str, kind: str, params: list[str],
                 metrics: list[str], study: str | None = None, ranked: bool = False,
                 confirmed: bool = False, last_epoch: int | None = None) -> dict[str, Any]:
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
    return {"rows": rows, "params": summary.parent_params(rows, children), "tags": summary.parent_tags(children),
            "view": view.share(client, experiment_id, parent, kind, params, metrics, study, last_epoch, ranked,
                               confirmed)}


def study_result(uri: str, parent: str | None, register_model: str, answer: dict[str, Any],
                 counts_line: str = "") -> str | None:
    """A study's answer (xp.answers, as its search wrote it) on its parent MLflow run (`parent`; through a
    spool of its own: a store that is away takes it when it is back, or xp.sync delivers it): its best trial named
    in the run's description and tags, linked to its model, the record itself as best_trial.json; and
    (`register_model`) its best trial's model, or every Pareto member's, in the Model Registry; returns the line
    that says where, or None."""
    from xp.answers import Answer

    record = Answer.from_dict(answer)
    front = [dataclasses.asdict(m) for m in record.best]
    versions: list[tuple[int, str]] = []
    said = None
    if register_model:
        from xp.readback.registry import register_front, registered_line

        versions = register_front(uri, register_model, front, record.multi_objective)
        said = registered_line(register_model, versions, record.multi_objective)
    if parent:
        _on_parent(uri, parent, register_model, record, counts_line, dict(versions))
        _rank(uri, parent, record)
    return said


def _rank(uri: str, parent: str, answer: Any) -> None:
    """Each of the study's trial runs tagged with its place in the answer's ranking (xp.rank; a run no longer
    ranked loses it): the UI's view of the study orders by it, its answer first (MLflow's shared views keep no
    pinned rows). A store that is away leaves the ranks as they were: the view still shows every trial."""
    import logging

    from xp.readback.view import RANK
    from xp.tracking.stores import open_client

    place = {n: f"{i:05d}" for i, n in enumerate(answer.ranking)}
    try:
        client = open_client(uri)
        runs = search_all(client, [client.get_run(parent).info.experiment_id],
                          f"tags.`optuna.study` = '{answer.study}'", order_by=["attributes.start_time ASC"])
        latest = {r.data.tags["optuna.trial_number"]: r for r in runs if "optuna.trial_number" in r.data.tags}
        for number, run in latest.items():  # (a retried trial: its latest run)
            want, have = place.get(int(number)), run.data.tags.get(RANK)
            if want is not None and want != have:
                client.set_tag(run.info.run_id, RANK, want)
            elif want is None and have is not None:
                client.delete_tag(run.info.run_id, RANK)
    except Exception as e:
        from xp.errors import one_line

        logging.getLogger("xp").debug("the study's ranks not written: %s", one_line(e))


def _on_parent(uri: str, parent: str, register_model: str, answer: Any, counts_line: str,
               versions: dict[int, str]) -> None:
    from xp.tracking.spool import state_dir
    from xp.tracking.tracker import Tracker

    tracker = Tracker(uri, "", "", attach_run_id=parent, spool_dir=state_dir() / "summaries")
    tracker.start()
    folder = Path(tempfile.mkdtemp(prefix="xp-study-"))
    try:
        best = answer.first
        tags = {**answer.tags(), "xp.register_model": register_model,
                "mlflow.note.content": answer.description(counts_line, versions, register_model)}
        if best is not None and versions.get(best.trial):
            tags["xp.best_model"] = f"models:/{register_model}/{versions[best.trial]}"
        tracker.log(params={f"best.{k}": v for k, v in (best.params if best else {}).items()}, tags=tags)
        if best is not None:
            tracker.log_metrics({f"best_{answer.metric}": best.values[answer.metric]})
        name = folder / answer.file
        name.write_text(json.dumps(answer.as_dict(), indent=1, default=str))
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
