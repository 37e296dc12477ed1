"""A run's creation and its batches of records written to an SQLite store as rows, each in one transaction.

MLflow's `SqlAlchemyStore.log_batch` opens a session (and re-reads the run) for the batch, then again for its
parameters, its metrics and its tags, each committed on its own, each row an ORM object: about 25 ms of CPU for
one trial's epoch, most of what the tracking service spends on a study's trial (benchmarks/README.md, stop 68).
`log_batch` here does what it does (and `create_run` what MLflow's does) with MLflow's own validation, tables
and errors, in one session, one commit and a few plain statements; `tests/test_rows.py` holds them to MLflow's
rows. Only on SQLite (xp's own store, the one the service writes), only under the MLflow versions that test ran
with (xp.tracking.gate), and only for what xp logs: a batch with a model's metrics or the run's name as a tag goes
through MLflow's.
"""

from __future__ import annotations

import time
import uuid
from typing import Any


def _sqlite(client: Any) -> Any:
    """The client's store if it is an SQLite SqlAlchemyStore (whose rows are written here) of an MLflow this was
    tested with (xp.tracking.gate), else None: MLflow's public calls."""
    from xp.tracking.gate import private_ok

    if not private_ok():
        return None
    store = client._tracking_client.store
    return store if getattr(store, "db_type", None) == "sqlite" else None


def create_run(client: Any, experiment_id: str | None, run_name: str, start_time: int,
               tags: dict[str, str]) -> tuple[str, str]:
    """`client.create_run(experiment_id, start_time, tags, run_name)`'s run id and artifact URI, on SQLite in one
    session (MLflow's reads the experiment, its tags and the new run back, in two)."""
    from mlflow.entities import LifecycleStage, RunStatus, SourceType, ViewType
    from mlflow.store.tracking.dbmodels.models import SqlRun, SqlTag
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME, MLFLOW_USER
    from mlflow.utils.name_utils import _generate_random_name
    from mlflow.utils.uri import append_to_uri_path
    from sqlalchemy import insert

    store = _sqlite(client)
    if store is None or MLFLOW_RUN_NAME in tags:
        run = client.create_run(experiment_id, start_time=start_time, tags=tags, run_name=run_name)
        return run.info.run_id, run.info.artifact_uri
    with store.ManagedSessionMaker(read_only=False) as session:
        experiment = store._get_experiment(session, experiment_id, ViewType.ALL)
        store._check_experiment_is_active(experiment)
        run_id, name = uuid.uuid4().hex, run_name or _generate_random_name()
        artifact_uri = append_to_uri_path(experiment.artifact_location, run_id, store.ARTIFACTS_FOLDER_NAME)
        session.execute(insert(SqlRun.__table__), [{
            "run_uuid": run_id, "name": name, "artifact_uri": artifact_uri, "experiment_id": experiment.experiment_id,
            "source_type": SourceType.to_string(SourceType.UNKNOWN), "source_name": "", "entry_point_name": "",
            "user_id": tags.get(MLFLOW_USER, "unknown"), "status": RunStatus.to_string(RunStatus.RUNNING),
            "start_time": start_time, "end_time": None, "deleted_time": None, "source_version": "",
            "lifecycle_stage": LifecycleStage.ACTIVE}])
        session.execute(insert(SqlTag.__table__), [{"run_uuid": run_id, "key": k, "value": v}
                                                   for k, v in {**tags, MLFLOW_RUN_NAME: name}.items()])
    return run_id, artifact_uri


def log_batch(client: Any, run_id: str, records: list[dict[str, Any]]) -> None:
    """A spool's batch `records` (xp.tracking.spool) logged to run `run_id`: MLflow's `client.log_batch`, in one
    transaction on SQLite."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils import validation
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    metrics = [Metric(k, v, t, s) for r in records for k, v, t, s in r.get("metrics", [])]
    params = [Param(k, v) for r in records for k, v in r.get("params", [])]
    tags = [RunTag(k, v) for r in records for k, v in r.get("tags", [])]
    store = _sqlite(client)
    if store is None or any(m.model_id is not None for m in metrics) or any(t.key == MLFLOW_RUN_NAME for t in tags):
        client.log_batch(run_id, metrics=metrics, params=params, tags=tags, synchronous=True)
        return
    validation._validate_run_id(run_id)
    metrics, params, tags = validation._validate_batch_log_data(metrics, params, tags)
    validation._validate_batch_log_limits(metrics, params, tags)
    validation._validate_param_keys_unique(params)
    with store.ManagedSessionMaker(read_only=False) as session:
        store._check_run_is_active(store._get_run(session=session, run_uuid=run_id))
        _params(session, run_id, params)
        _metrics(store, session, run_id, metrics)
        _tags(session, run_id, tags)


def end_run(client: Any, run_id: str, status: str, end_time: int | None) -> None:
    """`client.set_terminated(run_id, status, end_time)`; on SQLite one update (MLflow's reads the run back)."""
    from mlflow.store.tracking.dbmodels.models import SqlRun
    from sqlalchemy import update

    store = _sqlite(client)
    if store is None:
        client.set_terminated(run_id, status, end_time=end_time)
        return
    with store.ManagedSessionMaker(read_only=False) as session:
        store._check_run_is_active(store._get_run(session=session, run_uuid=run_id))
        session.execute(update(SqlRun.__table__).where(SqlRun.__table__.c.run_uuid == run_id).values(
            status=status, end_time=end_time or int(time.time() * 1000)))


def _params(session: Any, run_id: str, params: list[Any]) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
    from mlflow.store.tracking.dbmodels.models import SqlParam
    from sqlalchemy import insert, select

    if not params:
        return
    table = SqlParam.__table__
    had = dict(session.execute(select(table.c.key, table.c.value).where(
        table.c.run_uuid == run_id, table.c.key.in_([p.key for p in params]))).all())
    changed = [{"key": p.key, "old_value": had[p.key], "new_value": p.value}
               for p in params if p.key in had and had[p.key] != p.value]
    if changed:  # (MLflow's own words)
        raise MlflowException(f"Changing param values is not allowed. Params were already logged='{changed}' for "
                              f"run ID='{run_id}'.", INVALID_PARAMETER_VALUE)
    new = [{"run_uuid": run_id, "key": p.key, "value": p.value} for p in params if p.key not in had]
    if new:
        session.execute(insert(table), new)


def _metrics(store: Any, session: Any, run_id: str, metrics: list[Any]) -> None:
    """The metrics' rows (one already there, sent again after a lost answer, is not doubled) and each key's latest:
    the greatest (step, timestamp, value), the first of equals kept, as MLflow keeps it."""
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric
    from sqlalchemy import insert, select, update

    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for m in metrics:
        is_nan, value = store.sanitize_metric_value(m.value)
        row = {"run_uuid": run_id, "key": m.key, "value": value, "timestamp": m.timestamp, "step": m.step,
               "is_nan": is_nan}
        rows.setdefault((m.key, m.timestamp, m.step, value, is_nan), row)
    if not rows:
        return
    session.execute(insert(SqlMetric.__table__).prefix_with("OR IGNORE"), list(rows.values()))
    latest = SqlLatestMetric.__table__
    keys = sorted({row["key"] for row in rows.values()})
    had = {r.key: r._asdict() for r in session.execute(select(latest).where(
        latest.c.run_uuid == run_id, latest.c.key.in_(keys))).all()}
    now = dict(had)
    for row in rows.values():
        was = now.get(row["key"])
        if was is None or (row["step"], row["timestamp"], row["value"]) > (was["step"], was["timestamp"],
                                                                            was["value"]):
            now[row["key"]] = row
    new = [row for key, row in now.items() if key not in had]
    if new:
        session.execute(insert(latest), new)
    for key, row in now.items():
        if key in had and row is not had[key]:
            session.execute(update(latest).where(latest.c.run_uuid == run_id, latest.c.key == key).values(
                value=row["value"], timestamp=row["timestamp"], step=row["step"], is_nan=row["is_nan"]))


def _tags(session: Any, run_id: str, tags: list[Any]) -> None:
    """Each tag set (the last of one key wins): its row updated if there is one, else added."""
    from mlflow.store.tracking.dbmodels.models import SqlTag
    from sqlalchemy import insert, select, update

    if not tags:
        return
    table = SqlTag.__table__
    values = {t.key: t.value for t in tags}
    had = set(session.execute(select(table.c.key).where(table.c.run_uuid == run_id,
                                                        table.c.key.in_(list(values)))).scalars())
    new = [{"run_uuid": run_id, "key": k, "value": v} for k, v in values.items() if k not in had]
    if new:
        session.execute(insert(table), new)
    for key in had:
        session.execute(update(table).where(table.c.run_uuid == run_id, table.c.key == key).values(
            value=values[key]))
