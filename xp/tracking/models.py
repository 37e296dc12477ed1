"""Models as outputs: a run's model becomes an MLflow LoggedModel of its run, and a study's best is registered.

A run writes its model into its spool (xp.run.model_out); the spool's drain sends it with `send_model`, in order
with the run's other records (a store that is away takes it when it is back, or xp.sync delivers it). A study's
end registers its best trial's model in the Model Registry under the study's name (`sweep.register_model`),
alias `best` on it (multi-objective: every Pareto member's version, tagged `pareto`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

from xp.errors import one_line

log = logging.getLogger("xp")

MODEL_ID = "model_id"  # the spool's file: the LoggedModel made for the run, reused if the send is tried again
RUN_TAG = "xp.logged_model"  # the run's tag: its model's URI (models:/ID)
INPUT = "xp_input.json"  # beside a model xp logged: what its input is (shape, classes' names, pixel transform)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """MLflow saving or loading a model, without its notes (its pickling advice, its check of the input example,
    download progress bars) on the run's console: xp says what was logged."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow_log = logging.getLogger("mlflow")  # (its flavors' loggers take its level)
    level = mlflow_log.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlflow_log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            mlflow_log.setLevel(level)


def send_model(client: Any, run_id: str, spool_folder: Path, record: dict[str, Any]) -> None:
    """Log the model the run wrote into its spool (`record`: its folder, name, epoch and that epoch's metrics): a
    LoggedModel of the run with the model's files, READY, and the epoch's metrics linked to it."""
    from mlflow.entities import Metric, RunTag

    kept = spool_folder / MODEL_ID
    model_id = kept.read_text().strip() if kept.exists() else ""
    if not model_id:
        experiment = record.get("experiment_id") or client.get_run(run_id).info.experiment_id
        model_id = client.create_logged_model(experiment, name=record["name"], source_run_id=run_id,
                                              tags={"xp.epoch": str(record["step"])}).model_id
        kept.write_text(model_id)
    client.log_model_artifacts(model_id, str(spool_folder / record["dir"]))
    client.finalize_logged_model(model_id, "READY")
    metrics = [Metric(k, v, record["time"], record["step"], model_id=model_id, run_id=run_id)
               for k, v in record["metrics"].items()]
    client.log_batch(run_id, metrics=metrics, tags=[RunTag(RUN_TAG, f"models:/{model_id}")], synchronous=True)


def run_model(client: Any, run_id: str) -> str | None:
    """The URI (models:/ID) of the model run `run_id` logged, or None."""
    return client.get_run(run_id).data.tags.get(RUN_TAG)


def register_best(uri: str, name: str, front: list[dict[str, Any]], multi_objective: bool) -> str | None:
    """Register the study's best trial's model (every Pareto member's, multi-objective) under `name`, alias `best`
    moved to it; tags: the trial, its parameters and objective values, its run. Returns what it says, or None
    when no best trial logged a model. A registry that cannot be reached is one warning: the study stands."""
    from mlflow.exceptions import MlflowException

    from xp.tracking.stores import open_client

    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)  # MLflow's SQL registry finds a models:/ID source on the global tracking store
    try:
        client = open_client(uri)
        said = []
        for member in front:
            run_id = member.get("mlflow_run_id")
            source = run_model(client, run_id) if run_id else None
            if source is None:
                continue
            tags = {"trial": str(member["trial"]), "run_id": run_id,
                    **{f"param.{k}": str(v) for k, v in member["params"].items()},
                    **{f"objective.{k}": f"{v:.6g}" for k, v in member["values"].items()},
                    **({"pareto": "true"} if multi_objective else {})}
            version = _version(client, name, source, run_id, tags)
            if not multi_objective:
                client.set_registered_model_alias(name, "best", version)
            said.append(f"version {version}: trial {member['trial']}")
        if not said:
            return None
        return (f"the best trial's model: models:/{name}@best ({said[0]})" if not multi_objective
                else f"the Pareto front's models: models:/{name} ({'; '.join(said)}; tagged pareto)")
    except MlflowException as e:
        log.warning(f"model registry {name}: not registered ({one_line(e)[:200]})")
        return None
    finally:
        mlflow.set_tracking_uri(before)


def _version(client: Any, name: str, source: str, run_id: str, tags: dict[str, str]) -> str:
    """The registered version of `source` under `name`, made if it is not there yet (a resumed study registers
    its best again: the same version)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="The best trials of xp study " + name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_id = source.split("/", 1)[1].lstrip("/")
    for v in client.search_model_versions(f"name = '{name}'"):
        if v.source == source:
            return str(v.version)
    return str(client.create_model_version(name, source, run_id=run_id, tags=tags, model_id=model_id).version)
