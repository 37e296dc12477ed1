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


log = logging.getLogger("xp")

MODEL_ID = "model_id"  # the spool's file: the LoggedModel made for the run, reused if the send is tried again
RUN_TAG = "xp.logged_model"  # the run's tag: its model's URI (models:/ID)
INPUT = "xp_input.json"  # beside a model xp logged: what its input is (shape, classes' names, pixel transform)
BUILD = "xp_build.json"  # in a folder a backend saved a model into: it holds the model's parts, and names the
# function that makes the MLflow model of them ("module:function"), where MLflow is imported (models.built)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """MLflow saving or loading a model, without its notes (its pickling advice, its check of the input example,
    download progress bars) on the run's console: xp says what was logged."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow_log = logging.getLogger("mlflow")  # (its flavors' loggers take its level)
    level = mlflow_log.level
    from mlflow.utils import requirements_utils as requirements

    from xp.tracking.gate import private_ok

    # Saving a model checks the given requirements against what is installed, first mapping every installed
    # module to its package (0.9 s a process here); xp names packages, not modules: the map is not needed. A
    # private part of MLflow: only under the versions CI tests (another MLflow's save maps them, 0.9 s slower)
    unmapped = private_ok() and getattr(requirements, "_MODULES_TO_PACKAGES", False) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlflow_log.setLevel(logging.ERROR)
        if unmapped:
            requirements._MODULES_TO_PACKAGES = {}
        try:
            yield
        finally:
            mlflow_log.setLevel(level)
            if unmapped:
                requirements._MODULES_TO_PACKAGES = None


def built(folder: Path) -> None:
    """The MLflow model in `folder`, made (in place) from the parts a backend saved there, if it holds parts
    (BUILD). A build cut short by a kill is made again: the parts stay beside it until the model is whole."""
    import importlib
    import json
    import shutil

    parts = folder.with_name(folder.name + ".parts")
    if (folder / BUILD).exists():
        shutil.rmtree(parts, ignore_errors=True)
        folder.rename(parts)
    elif not parts.exists():
        return  # a whole MLflow model
    else:
        shutil.rmtree(folder, ignore_errors=True)  # a build cut short
    module, name = json.loads((parts / BUILD).read_text())["build"].split(":")
    getattr(importlib.import_module(module), name)(parts, folder)
    shutil.rmtree(parts)


def send_model(client: Any, run_id: str, spool_folder: Path, record: dict[str, Any]) -> None:
    """Log the model the run wrote into its spool (`record`: its folder, name, epoch and that epoch's metrics as
    they were logged: the run's store takes a point it has once): a LoggedModel of the run with the model's
    files, READY, and the epoch's metrics linked to it."""
    from mlflow.entities import LoggedModelOutput, Metric, RunTag

    built(spool_folder / record["dir"])
    kept = spool_folder / MODEL_ID
    model_id = kept.read_text().strip() if kept.exists() else ""
    if not model_id:
        experiment = record.get("experiment_id") or client.get_run(run_id).info.experiment_id
        model_id = client.create_logged_model(experiment, name=record["name"], source_run_id=run_id,
                                              tags={**record.get("tags", {}), "xp.epoch": str(record["step"])}).model_id
        kept.write_text(model_id)
    client.log_model_artifacts(model_id, str(spool_folder / record["dir"]))
    client.finalize_logged_model(model_id, "READY")
    linked = spool_folder / (MODEL_ID + ".output")
    if not linked.exists():  # the run's page lists it among its logged models (once)
        try:
            client.log_outputs(run_id, [LoggedModelOutput(model_id, record["step"])])
        except Exception:
            # sent before, its answer lost (the server killed as it committed): the store refuses it again as a
            # duplicate; the model was left out of the run (found by benchmarks/chaos.py). Linked already: done
            outputs = client.get_run(run_id).outputs
            if not any(o.model_id == model_id for o in (outputs.model_outputs if outputs else [])):
                raise
        linked.write_text(model_id)
    metrics = [Metric(k, v, t, step, model_id=model_id, run_id=run_id) for k, v, t, step in record["metrics"]]
    client.log_batch(run_id, metrics=metrics, tags=[RunTag(RUN_TAG, f"models:/{model_id}")], synchronous=True)


def run_model(client: Any, run_id: str) -> str | None:
    """The URI (models:/ID) of the model run `run_id` logged, or None."""
    return client.get_run(run_id).data.tags.get(RUN_TAG)
