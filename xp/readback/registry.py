"""The Model Registry and models read back: a study's best trial's model registered under the study's name
(`sweep.register_model`), alias `best` on it (multi-objective: every Pareto member's version, tagged `pareto`); a
model xp logged fetched for `pretrained=` and `python -m xp.predict`, and checked against the data it meets.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Iterator

from xp.errors import one_line, redact
from xp.tracking.models import INPUT, quiet, run_model

log = logging.getLogger("xp")


def register_best(uri: str, name: str, front: list[dict[str, Any]], multi_objective: bool) -> str | None:
    """Register the study's best trial's model (every Pareto member's, multi-objective) under `name`, alias `best`
    moved to it; tags: the trial, its parameters and objective values, its run. Returns what it says, or None
    when no best trial logged a model. A registry that cannot be reached is one warning: the study stands."""
    return registered_line(name, register_front(uri, name, front, multi_objective), multi_objective)


def registered_line(name: str, versions: list[tuple[int, str]], multi_objective: bool) -> str | None:
    """What register_front did, said in one line (None: nothing registered)."""
    if not versions:
        return None
    said = [f"version {v}: trial {t}" for t, v in versions]
    return (f"the best trial's model: models:/{name}@best ({said[0]})" if not multi_objective
            else f"the Pareto front's models: models:/{name} ({'; '.join(said)}; tagged pareto)")


def register_front(uri: str, name: str, front: list[dict[str, Any]], multi_objective: bool) -> list[tuple[int, str]]:
    """register_best's work: [(trial number, registered version)] of the members that logged a model."""
    from mlflow.exceptions import MlflowException

    from xp.tracking.stores import open_client

    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)  # MLflow's SQL registry finds a models:/ID source on the global tracking store
    try:
        client = open_client(uri)
        out = []
        for member in front:
            run_id = member.get("mlflow_run_id")
            source = run_model(client, run_id) if run_id else None
            if source is None or run_id is None:
                continue
            tags = {"trial": str(member["trial"]), "run_id": run_id,
                    **{f"param.{k}": str(v) for k, v in member["params"].items()},
                    **{f"objective.{k}": f"{v:.6g}" for k, v in member["values"].items()},
                    **({"pareto": "true"} if multi_objective else {})}
            version = _version(client, name, source, run_id, tags)
            if not multi_objective:
                client.set_registered_model_alias(name, "best", version)
            out.append((int(member["trial"]), version))
        return out
    except MlflowException as e:
        log.warning(f"model registry {name}: not registered ({one_line(e)[:200]})")
        return []
    finally:
        mlflow.set_tracking_uri(before)


def _version(client: Any, name: str, source: str, run_id: str, tags: dict[str, str]) -> str:
    """The registered version of `source` under `name`, made if it is not there yet (a resumed study registers
    its best again: the same version); the logged model names it (the tag MLflow's own register_model writes, which
    its UI reads: the model's page lists its registered versions)."""
    import json

    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="The best trials of xp study " + name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_id = source.split("/", 1)[1].lstrip("/")
    version = next((str(v.version) for v in client.search_model_versions(f"name = '{name}'") if v.source == source),
                   None)
    if version is None:
        version = str(client.create_model_version(name, source, run_id=run_id, tags=tags, model_id=model_id).version)
    linked = json.loads(client.get_logged_model(model_id).tags.get(MODEL_VERSIONS_TAG) or "[]")
    this = {"name": name, "version": int(version)}  # (as MLflow's register_model writes it)
    if this not in linked:
        client.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps([*linked, this])})
    return version


MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # a logged model's registered versions, as MLflow's UI reads them


LOGGED = "logged"  # a PretrainedSpec's source: a model xp logged (pretrained=models:/... or runs:/...)


def is_model_uri(value: str) -> bool:
    return value.startswith(("models:/", "runs:/"))


def fetch(uri: str, tracking_uri: str, what: str = "pretrained=") -> tuple[Path, dict[str, Any]]:
    """The model xp logged at `uri` (models:/NAME@ALIAS, models:/NAME/VERSION, models:/ID, runs:/RUN_ID/model),
    downloaded once into xp's cache under its model id (the alias may move; a model's files do not), and its
    input's description (xp_input.json). Anything else is one ConfigError line, `what` (the setting) before it."""
    import hashlib
    import json
    import shutil
    import tempfile

    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    from xp.errors import ConfigError
    from xp.tracking.stores import open_client

    try:
        client = open_client(tracking_uri)
        source = _source(client, uri)
        cache = Path(os.environ.get("XP_CACHE_DIR") or "~/.cache/xp").expanduser() / "models"
        key = hashlib.sha1(f"{tracking_uri} {source}".encode()).hexdigest()[:16]
        local = cache / f"{source.rsplit('/', 1)[-1]}-{key}"
        if not (local / "MLmodel").is_file():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache))
            with quiet(), _tracking(tracking_uri):  # models:/ID resolves in the global store, not tracking_uri
                got = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(tmp),
                                                               tracking_uri=tracking_uri))
            try:
                got.rename(local)  # whole or absent; a process that fetched it meanwhile has it there
            except OSError:
                pass
            shutil.rmtree(tmp, ignore_errors=True)
    except MlflowException as e:
        raise ConfigError(f"{what}{uri}: no such model in {redact(tracking_uri)} ({one_line(e)[:200]})") from None
    if not (local / INPUT).is_file():
        raise ConfigError(f"{what}{uri}: not a model xp logged (it has no {INPUT}: its input is unknown)")
    return local, json.loads((local / INPUT).read_text())


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to `uri` meanwhile (xp.predict --tracking-uri with no
    $MLFLOW_TRACKING_URI: the logged model was looked up in ./mlruns)."""
    import mlflow

    before, env = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)
        if env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env


def _source(client: Any, uri: str) -> str:
    """The models:/ID an xp model URI stands for."""
    from mlflow.exceptions import MlflowException

    if uri.startswith("runs:/"):
        run_id = uri[len("runs:/"):].split("/", 1)[0]
        found = run_model(client, run_id)
        if found is None:
            raise MlflowException(f"run {run_id} logged no model")
        return found
    rest = uri[len("models:/"):]
    if "@" in rest:
        return client.get_model_version_by_alias(*rest.split("@", 1)).source
    if "/" in rest:
        return client.get_model_version(*rest.split("/", 1)).source
    return uri


def fits(spec: Any, image_shape: tuple[int, ...], classes: int) -> None:
    """A model xp logged (a PretrainedSpec of source `logged`) fits a data set of `image_shape` and `classes`, and
    is fine-tuned whole; else one ConfigError line."""
    from xp.errors import ConfigError

    shape, names = tuple(spec.described["image_shape"]), spec.described["classes"]
    if shape != tuple(image_shape) or len(names) != classes:
        raise ConfigError(f"pretrained={spec.name}: the model takes {'x'.join(map(str, shape))} images into "
                          f"{len(names)} classes; this data set has {'x'.join(map(str, image_shape))} images and "
                          f"{classes} classes")
    if spec.freeze_backbone or spec.backbone_lr_mult != 1.0:
        raise ConfigError(f"pretrained={spec.name}: a model xp logged is fine-tuned whole, its classifier too; "
                          "freeze_backbone and backbone_lr_mult apply to weights with a new classifier")


def flavors(local: Path) -> set[str]:
    """The flavors an MLflow model downloaded to `local` has (its MLmodel file)."""
    import yaml

    return set((yaml.safe_load((local / "MLmodel").read_text()) or {}).get("flavors", {}))
