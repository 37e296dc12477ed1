"""A run's batches written as rows (xp.tracking.rows) leave the store as MLflow's own log_batch leaves it."""

from __future__ import annotations

import math
import sqlite3

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from xp.tracking import rows

NAN, INF = math.nan, math.inf

# a study's records, then what a store meets: the same batch sent again (its answer lost), metrics older than, equal
# to and later than the latest, NaN and infinities, a tag changed, one key twice in a batch
BATCHES = [
    {"params": [["lr", "0.1"], ["batch", "32"]], "tags": [["xp.state", "training"]],
     "metrics": [["loss", 2.0, 1000, 0], ["acc", 0.1, 1000, 0]]},
    {"params": [["lr", "0.1"], ["batch", "32"]], "tags": [["xp.state", "training"]],
     "metrics": [["loss", 2.0, 1000, 0], ["acc", 0.1, 1000, 0]]},
    {"metrics": [["loss", 1.5, 2000, 1], ["loss", 1.7, 1500, 1], ["acc", NAN, 2000, 1], ["acc", NAN, 2000, 1],
                 ["z", NAN, 4000, 3], ["z", 0.0, 4000, 3]]},  # (equal to MLflow's eyes but for is_nan: the first kept)
    {"metrics": [["loss", 9.0, 500, 0], ["acc", 0.5, 2000, 1], ["grad", INF, 3000, 2], ["grad", -INF, 3000, 2]]},
    {"metrics": [["loss", 1.5, 2000, 1], ["loss", 1.6, 2000, 1]], "tags": [["xp.state", "done"],
                                                                            ["note", "a"], ["note", "b"]]},
    {"params": [["momentum", "0.9"]] + [[f"p{i}", str(i)] for i in range(60)], "tags": [["xp.state", "done"]]},
]


def _table(db: str, run_id: str, table: str, columns: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return sorted(con.execute(f"SELECT {columns} FROM {table} WHERE run_uuid = ?", (run_id,)).fetchall(),
                      key=repr)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    where = tmp_path_factory.mktemp("rows")
    client = MlflowClient(f"sqlite:///{where / 'mlflow.db'}")
    return str(where / "mlflow.db"), client, client.create_experiment("rows", artifact_location=str(where / "a"))


@pytest.fixture
def two_runs(store):
    """The store, a client, a run MLflow's log_batch writes and one xp.tracking.rows writes."""
    db, client, experiment = store
    return db, client, client.create_run(experiment).info.run_id, client.create_run(experiment).info.run_id


def _never(*args, **kwargs):
    raise AssertionError("MLflow's log_batch was called")


def _theirs(client, run_id, batch):
    from mlflow.entities import Metric, Param, RunTag

    client.log_batch(run_id, metrics=[Metric(*m) for m in batch.get("metrics", [])],
                     params=[Param(*p) for p in batch.get("params", [])],
                     tags=[RunTag(*t) for t in batch.get("tags", [])], synchronous=True)


def test_batches_leave_the_same_rows_as_mlflows_log_batch(two_runs):
    db, client, mlflows, ours = two_runs
    own = MlflowClient(client.tracking_uri)
    own.log_batch = _never  # (rows writes them itself)
    for batch in BATCHES:
        _theirs(client, mlflows, batch)
        rows.log_batch(own, ours, [dict(batch, op="batch")])
    for table, columns in (("metrics", "key, value, timestamp, step, is_nan"),
                           ("latest_metrics", "key, value, timestamp, step, is_nan"),
                           ("params", "key, value"), ("tags", "key, value")):
        theirs, mine = _table(db, mlflows, table, columns), _table(db, ours, table, columns)
        if table == "tags":  # (the runs' own names)
            theirs, mine = ([t for t in rows_ if t[0] != "mlflow.runName"] for rows_ in (theirs, mine))
        assert mine == theirs, table
        assert mine
    assert repr(sorted(client.get_run(ours).data.metrics.items())) == \
        repr(sorted(client.get_run(mlflows).data.metrics.items()))  # (NaN: repr)
    assert client.get_run(ours).data.metrics["loss"] == 1.6  # (a later timestamp at the same step)
    assert client.get_run(ours).data.metrics["acc"] == 0.5  # (NaN's stored 0 at the same step and time: less)


@pytest.mark.mlflow_paths
@pytest.mark.parametrize("case", ["a changed parameter", "a deleted run", "no such run"])
def test_what_mlflow_refuses_is_refused_the_same_way_and_nothing_of_the_batch_is_written(two_runs, case):
    db, client, mlflows, ours = two_runs
    first = {"params": [["lr", "0.1"]]}
    bad = {"params": [["lr", "0.2"]], "metrics": [["loss", 1.0, 1000, 0]], "tags": [["t", "v"]]}
    for run_id in (mlflows, ours):
        _theirs(client, run_id, first)
        if case == "a deleted run":
            client.delete_run(run_id)
    errors = []
    for run_id, log in ((mlflows, _theirs), (ours, lambda c, r, b: rows.log_batch(c, r, [dict(b, op="batch")]))):
        with pytest.raises(MlflowException) as raised:
            log(client, "f" * 32 if case == "no such run" else run_id, bad)
        errors.append((raised.value.error_code, str(raised.value).replace(run_id, "RUN")))
    assert errors[0] == errors[1]
    assert _table(db, ours, "metrics", "key") == [] and _table(db, ours, "tags", "key, value").count(("t", "v")) == 0


def test_a_batch_with_the_runs_name_goes_through_mlflow(two_runs):
    db, client, _, ours = two_runs
    rows.log_batch(client, ours, [{"op": "batch", "tags": [["mlflow.runName", "renamed"]]}])
    assert client.get_run(ours).info.run_name == "renamed"


RUN_COLUMNS = ("name, source_type, source_name, entry_point_name, user_id, status, start_time, end_time, deleted_time, "
               "source_version, lifecycle_stage, artifact_uri, experiment_id")


def test_a_run_created_as_rows_is_the_run_mlflow_creates(store):
    db, client, experiment = store
    tags = {"xp.host": "h", "mlflow.user": "ann", "mlflow.parentRunId": "p" * 32}
    theirs = client.create_run(experiment, start_time=1234, tags=tags, run_name="trial-3")
    own = MlflowClient(client.tracking_uri)
    own.create_run = _never
    mine, artifact_uri = rows.create_run(own, experiment, "trial-3", 1234, tags)
    assert artifact_uri == theirs.info.artifact_uri.replace(theirs.info.run_id, mine)
    with sqlite3.connect(db) as con:
        runs = [con.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_uuid = ?", (r,)).fetchone()
                for r in (theirs.info.run_id, mine)]
    assert runs[1] == tuple(str(v).replace(theirs.info.run_id, mine) if isinstance(v, str) else v for v in runs[0])
    assert _table(db, mine, "tags", "key, value") == _table(db, theirs.info.run_id, "tags", "key, value")
    assert client.get_run(mine).info.run_name == "trial-3" and client.get_run(mine).info.user_id == "ann"


def test_a_run_in_a_deleted_or_missing_experiment_is_refused_as_mlflow_refuses_it(store):
    db, client, _ = store
    gone = client.create_experiment("gone")
    client.delete_experiment(gone)
    for experiment in (gone, "987654"):
        with pytest.raises(MlflowException) as theirs:
            client.create_run(experiment, start_time=1, tags={}, run_name="r")
        with pytest.raises(MlflowException) as mine:
            rows.create_run(client, experiment, "r", 1, {})
        assert (mine.value.error_code, str(mine.value)) == (theirs.value.error_code, str(theirs.value))


def test_under_an_mlflow_xp_was_not_tested_with_the_public_path_is_taken_and_said(store, monkeypatch, caplog):
    """xp's uses of MLflow's internals are gated to the MLflow versions CI tests (xp.tracking.gate): under another
    (faked here) a run is created and its batches written by MLflow's own public calls, said in one line."""
    import mlflow

    from xp.tracking import gate

    db, client, experiment = store
    monkeypatch.setattr(mlflow, "__version__", "3.99.0")
    gate.private_ok.cache_clear()
    public = []
    own = MlflowClient(client.tracking_uri)
    real_create, real_batch = own.create_run, own.log_batch
    own.create_run = lambda *a, **k: public.append("create_run") or real_create(*a, **k)
    own.log_batch = lambda *a, **k: public.append("log_batch") or real_batch(*a, **k)
    try:
        with caplog.at_level("WARNING", logger="xp"):
            run_id, _ = rows.create_run(own, experiment, "gated", 1234, {"xp.host": "h"})
            rows.log_batch(own, run_id, [{"op": "batch", "params": [["lr", "0.1"]], "metrics": [["acc", 0.5, 1, 0]]}])
    finally:
        gate.private_ok.cache_clear()
    assert public == ["create_run", "log_batch"]
    assert client.get_run(run_id).data.params == {"lr": "0.1"} and client.get_run(run_id).info.run_name == "gated"
    said = [r.getMessage() for r in caplog.records if "is not one xp was tested with" in r.getMessage()]
    assert len(said) == 1 and "MLflow 3.99.0" in said[0] and "public API" in said[0]
    monkeypatch.undo()
    gate.private_ok.cache_clear()
    assert gate.private_ok()  # the real MLflow is the tested one (pyproject.toml pins it)


def test_the_mlflow_ci_installs_is_the_one_the_gate_lets_xp_use_the_internals_of_and_pyproject_allows_others():
    """constraints.txt (what CI installs) names the MLflow of xp.tracking.gate.TESTED, whole (its skinny and
    tracing packages too); pyproject.toml asks for a range of 3.x, not that version (tests/test_install.py: the
    wheel beside MLflow 3.16.1 and 3.18.0)."""
    import tomllib

    from packaging.requirements import Requirement

    from conftest import ROOT
    from xp.tracking import gate

    pinned = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().split() if "==" in line)
    assert gate.TESTED == (pinned["mlflow"],) == (pinned["mlflow-skinny"],) == (pinned["mlflow-tracing"],)
    wanted = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    mlflow = next(r for r in wanted if r.name == "mlflow")
    assert pinned["mlflow"] in mlflow.specifier and "3.16.1" in mlflow.specifier and "3.99" in mlflow.specifier


def test_a_run_ended_as_a_row_is_the_run_mlflow_ends_and_an_ended_run_is_refused_the_same(two_runs):
    from mlflow.exceptions import MlflowException

    db, client, theirs, mine = two_runs
    client.set_terminated(theirs, "KILLED", end_time=5678)
    own = MlflowClient(client.tracking_uri)
    own.set_terminated = _never
    rows.end_run(own, mine, "KILLED", 5678)
    with sqlite3.connect(db) as con:
        ended = [con.execute("SELECT status, end_time, lifecycle_stage FROM runs WHERE run_uuid = ?", (r,)).fetchone()
                 for r in (theirs, mine)]
    assert ended[0] == ended[1] == ("KILLED", 5678, "active")
    client.delete_run(theirs)
    client.delete_run(mine)
    refused = []
    for end, run in ((client.set_terminated, theirs), (lambda *a: rows.end_run(own, *a), mine)):
        with pytest.raises(MlflowException) as e:
            end(run, "FINISHED", 9)
        refused.append((e.value.error_code, str(e.value).replace(run, "RUN")))
    assert refused[0] == refused[1], refused


def test_a_new_store_writes_ahead_and_a_reader_sees_what_is_committed(tmp_path):
    """A new SQLite store xp opens is in write-ahead-log mode (a commit: one append, not a rollback journal
    and two syncs), which every connection to the file, MLflow's or another process's, then uses."""
    from xp.tracking.stores import open_client

    db = tmp_path / "mlflow.db"
    client = open_client(f"sqlite:///{db}")
    run_id = client.create_run(client.create_experiment("wal")).info.run_id
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert con.execute("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)).fetchone() == ("RUNNING",)
