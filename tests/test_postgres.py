"""MLflow tracking and Optuna storage on a real PostgreSQL server (started by the tests on 127.0.0.1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import pg
from conftest import ROOT, mlflow_runs, run_together, run_xp, xp_env

PASSWORD = "pg-Secret-42"


@pytest.fixture(scope="module")
def postgres():
    server = pg.Server(PASSWORD)
    try:
        yield server.start()
    finally:
        server.stop()


def _texts_of_run(client, run, folder) -> list[str]:
    """Everything MLflow keeps of a run: params, tags, metrics' names, and its text artifacts."""
    out = [run.info.run_name or "", repr(run.data.params), repr(run.data.tags), repr(list(run.data.metrics))]
    stack = [""]
    while stack:
        for a in client.list_artifacts(run.info.run_id, stack.pop() or None):
            if a.is_dir:
                stack.append(a.path)
            elif a.path.endswith((".yaml", ".log", ".json", ".txt", ".md")):
                out.append(open(client.download_artifacts(run.info.run_id, a.path, str(folder))).read())
    return out


@pytest.mark.slow
def test_a_sweep_tracks_in_postgres_and_keeps_its_study_there_without_showing_the_password(tmp_path, postgres):
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "pgsmall.yaml").write_text(textwrap.dedent("""
        study_name: pgsmall
        n_trials: 3
        sampler: random
        sampler_seed: 3
        pruner: none
        params:
          lr: {type: float, low: 0.01, high: 0.3, log: true}
          batch: {type: categorical, choices: [16, 32]}
    """))
    mlflow_url, optuna_url = postgres.url("mlflow"), postgres.url("optuna")
    env = {"XP_SWEEPS_DIR": str(sweeps), "XP_OPTUNA_STORAGE": optuna_url}
    proc = run_xp(tmp_path, mlflow_url, "-m", "sweep=pgsmall", "epochs=2", f"tracking_uri='{mlflow_url}'", env=env,
                  timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    import optuna

    trials = optuna.load_study(study_name="pgsmall", storage=optuna_url).get_trials()
    assert len(trials) == 3 and {t.state.name for t in trials} == {"COMPLETE"}
    client, runs = mlflow_runs(mlflow_url)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len([r for r in runs if r.data.tags.get("xp.sweep") == "true"]) == 1
    ran = {t.user_attrs["mlflow_run_id"] for t in trials if "mlflow_run_id" in t.user_attrs}
    assert ran and ran == {r.info.run_id for r in children}
    assert all(r.info.status == "FINISHED" and r.data.metrics["val_accuracy"] > 0.5 for r in children)

    report = subprocess.run([sys.executable, "-m", "xp.report", "--out", str(tmp_path / "report")], cwd=ROOT,
                            env=xp_env(mlflow_url), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    client, runs = mlflow_runs(mlflow_url)  # the report's own run too
    seen = [proc.stdout, proc.stderr, report.stdout, report.stderr]
    seen += [p.read_text(errors="replace") for p in (tmp_path / "report").rglob("*") if p.suffix in (".md", ".csv", ".html", ".json")]
    for r in runs:
        seen += _texts_of_run(client, r, tmp_path / "artifacts")
    seen += [p.read_text(errors="replace") for p in tmp_path.rglob("*.log")]
    assert any("postgresql://xp:***@127.0.0.1" in s for s in seen)  # the URL is recorded, its password is not
    assert not [s[:200] for s in seen if PASSWORD in s]


@pytest.mark.slow
def test_a_wrong_database_password_is_one_line_without_it(tmp_path, postgres):
    wrong = postgres.url("mlflow", password="not-the-one")
    before = len(mlflow_runs(postgres.url("mlflow"))[1])
    proc = run_xp(tmp_path, wrong, "epochs=1", f"tracking_uri='{wrong}'", timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("xp: error: ") and "\n" not in err and "Traceback" not in proc.stdout + err
    assert "password authentication failed" in err and "not-the-one" not in proc.stdout + err
    assert len(mlflow_runs(postgres.url("mlflow"))[1]) == before  # nothing was created


@pytest.mark.slow
def test_four_sweepers_on_one_postgres_study_never_propose_the_same_trial(tmp_path, postgres):
    """Several machines share one PostgreSQL study by running the same command: before, each seeded its sampler
    from the trial count they all read at once, and 4 of them ran 12 trials with 6 distinct parameter sets."""
    import optuna

    storage = postgres.url("optuna")
    store = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    done = run_together([[sys.executable, "-m", "xp", "-m", "sweep=lr_batch", "sweep.study_name=four", "sweep.n_trials=8",
                          "epochs=1", f"hydra.sweep.dir={tmp_path}/s{i}"] for i in range(4)],
                        xp_env(store, {"XP_OPTUNA_STORAGE": storage}))
    assert all(r.returncode == 0 for r in done), [r.stderr[-1500:] for r in done]
    trials = optuna.load_study(study_name="four", storage=storage).get_trials()
    proposed = [tuple(sorted(t.params.items())) for t in trials]
    assert len(trials) >= 8 and len(set(proposed)) == len(proposed), proposed


OPEN_AT_ONCE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import optuna
    from xp.storefiles import first_use
    url, go = sys.argv[1], Path(sys.argv[2])
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:  # all of them at the same moment
        time.sleep(0.001)
    with first_use(url, "sweep.storage"):
        optuna.storages.RDBStorage(url).engine.dispose()
""")


def test_processes_opening_a_new_postgres_database_at_once_all_succeed(tmp_path, postgres):
    """Two commands starting at once on a new PostgreSQL database both create Optuna's tables: one died with
    `duplicate key value violates unique constraint "pg_type_typname_nsp_index"` (found by benchmarks/chaos.py).
    The first use holds the database's advisory lock: 3 new databases, 4 processes at once on each."""
    import psycopg

    for round_ in range(3):
        db = f"fresh{round_}"
        with psycopg.connect(postgres.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        go = tmp_path / f"go{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, postgres.url(db), str(go)], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, [err[-600:] for _, err in outs]


def test_a_studys_storage_rides_out_its_database_going_away(tmp_path, postgres, caplog):
    """PostgreSQL stopped under a study's command (found by benchmarks/chaos.py: a 5-40 s stop ended the command in
    a traceback, its trials in flight lost): the call that finds it away waits for it, with one line saying so and
    one when it is back; Optuna's heartbeats still fail and retry a dead sweeper's trials (its BaseHeartbeat)."""
    import logging
    import threading

    import optuna

    from xp.studies.study import spec_from
    from xp.studies.trial import open_study

    spec = spec_from({"study_name": "away", "storage": postgres.url("optuna"), "n_trials": 3, "heartbeat_s": 1,
                      "grace_s": 2, "params": {"lr": {"type": "float", "low": 0.01, "high": 0.1}}}, "away")
    study = open_study(spec)
    assert isinstance(study._storage, optuna.storages._heartbeat.BaseHeartbeat)  # (xp.studies.outage's gate)
    trial = study.ask()
    postgres.halt()
    back = threading.Timer(3.0, postgres.resume)  # the server comes back while tell waits
    back.start()
    try:
        with caplog.at_level(logging.WARNING, logger="xp"):
            study.tell(trial, 0.5)
    finally:
        back.join(timeout=90)
    said = [r.getMessage() for r in caplog.records]
    assert any("is away (OperationalError): the study waits for it" in line for line in said), said
    assert any("is back after" in line for line in said) and PASSWORD not in " ".join(said), said
    assert optuna.load_study(study_name="away", storage=postgres.url("optuna")).trials[0].state.name == "COMPLETE"
