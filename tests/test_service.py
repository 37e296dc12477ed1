"""The tracking service (xp.tracking.service): a run's MLflow work done by a long-lived process, with nothing lost
when the service or the run is killed, one service for runs that start at once, and none of MLflow in a run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from conftest import ROOT, mlflow_runs, run_xp
from xp.tracking import service, services
from xp.tracking.tracker import Tracker


def _service_pids(state) -> list[int]:
    return [int(p.read_text()) for p in (state / "service").glob("*.pid")]


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A state folder of the test's own: its service is the test's, ended after it."""
    folder = tmp_path / "state"
    monkeypatch.setenv("XP_STATE_DIR", str(folder))
    monkeypatch.setattr(service, "starts", True)  # (as a command's process: xp.cli)
    yield folder
    services.stop(folder, every=True)


@pytest.mark.mlflow_paths
def test_a_run_imports_no_mlflow_and_its_model_and_records_arrive(tmp_path, store, state, monkeypatch):
    r = run_xp(tmp_path, store, "epochs=2", env={"XP_STATE_DIR": str(state), "PYTHONPROFILEIMPORTTIME": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert "mxnet" in imported and not [m for m in imported if m.startswith(("mlflow", "sqlalchemy"))]
    assert len(_service_pids(state)) == 1
    client, runs = mlflow_runs(store)
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["xp.pid"] != str(_service_pids(state)[0])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1, 2]
    assert "system/cpu_utilization_percentage" in run.data.metrics and run.data.params["epochs"] == "2"
    import mlflow.pyfunc
    import numpy as np

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # (where models:/ID is)
    model = mlflow.pyfunc.load_model(run.data.tags["xp.logged_model"])
    shape = model.metadata.get_input_schema().inputs[0].shape
    assert model.predict(np.zeros((2, *shape[1:]), dtype=np.float32)).shape[0] == 2
    assert not list(state.glob("pending/*"))  # (delivered: its spool is gone)


def test_runs_starting_at_once_share_one_service(tmp_path, store, state):
    script = textwrap.dedent(f"""
        from xp.tracking import service
        from xp.tracking.tracker import Tracker
        service.starts = True
        t = Tracker({store!r}, "xp", "together")
        t.start()
        t.log_metrics({{"x": 1.0}}, step=0)
        t.end("FINISHED")
    """)
    env = dict(os.environ, XP_STATE_DIR=str(state))
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert len(_service_pids(state)) == 1
    daemons = [p for p in psutil.process_iter(["cmdline"]) if "xp.trackingd" in (p.info["cmdline"] or [])
               and str(state) in " ".join(p.info["cmdline"])]
    assert len(daemons) == 1
    _, runs = mlflow_runs(store)
    assert [r.info.status for r in runs] == ["FINISHED"] * 3 and all(r.data.metrics == {"x": 1.0} for r in runs)


def test_a_run_whose_process_went_as_the_service_made_it_is_ended_by_the_service(store, state):
    """A run's process killed while the service creates its run (the next command's reaper may look before the run
    exists: tests/test_kill.py left one RUNNING under load): the service sees the process go before it opened its
    spool and ends that run FAILED, saying why."""
    import time

    from xp.tracking.messages import Start

    link = service.connect()
    link.send(Start(store, "xp", "went", {}))
    link.close()  # (the process gone before the service's answer)
    deadline, runs = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        _, runs = mlflow_runs(store)
        if runs and runs[0].info.status != "RUNNING":
            break
        time.sleep(0.2)
    assert [(r.info.run_name, r.info.status) for r in runs] == [("went", "FAILED")]
    assert runs[0].data.tags["xp.ended_by"] == "xp: its process went as its run was made"


@pytest.mark.mlflow_paths
def test_the_stores_refusals_reach_the_runs_console(store, state, caplog):
    """The service's lines about a run (here MLflow refusing a param's name) are said by the run's process."""
    run = Tracker(store, "xp", "refused")
    run.start()
    run.log(params={"bad!name": 1})
    with caplog.at_level(logging.WARNING, logger="xp"):
        run.end("FINISHED")
    assert "MLflow refused batch of run " + str(run.run_id) in caplog.text
    assert mlflow_runs(store)[1][0].info.status == "FINISHED"


def test_a_service_left_idle_goes_and_removes_its_socket(store, state, monkeypatch):
    monkeypatch.setenv("XP_SERVICE_IDLE_S", "1")
    run = Tracker(store, "xp", "short")
    run.start()
    run.end("FINISHED")
    [pid] = _service_pids(state)
    psutil.Process(pid).wait(30)  # (bounded: it fails the test if the service stays)
    assert not service.socket_path().exists() and not _service_pids(state)
    assert json.dumps(mlflow_runs(store)[1][0].info.status) == '"FINISHED"'


def test_a_model_saved_as_parts_is_built_once_and_again_after_a_build_cut_short(tmp_path):
    """An MXNet run saves its model's parts (no MLflow in its process); `built` makes the MLflow model of them
    where the model is logged, leaves a whole model as it is, and makes again one whose build a kill cut short."""
    import mlflow.pyfunc
    import mxnet as mx
    import numpy as np

    from xp.mx.saved import save
    from xp.tracking.models import BUILD, built

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=4))
    net.initialize()
    params = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    x = np.random.RandomState(0).rand(2, 4).astype(np.float32)
    folder = tmp_path / "model"
    save(net, params, folder, x, {"xp_input.json": "{}"})
    assert (folder / BUILD).exists() and not (folder / "MLmodel").exists()
    built(folder)
    expected = net(mx.nd.array(x)).asnumpy()
    assert np.allclose(mlflow.pyfunc.load_model(str(folder)).predict(x), expected, atol=1e-5)
    assert (folder / "xp_input.json").read_text() == "{}" and not folder.with_name("model.parts").exists()
    made = (folder / "MLmodel").stat().st_mtime_ns
    built(folder)  # whole: left as it is
    assert (folder / "MLmodel").stat().st_mtime_ns == made
    save(net, params, tmp_path / "cut", x, {})
    (tmp_path / "cut").rename(tmp_path / "cut.parts")  # killed mid-build: the parts aside, the model half-written
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "python_model.pkl").write_bytes(b"half")
    built(tmp_path / "cut")
    assert np.allclose(mlflow.pyfunc.load_model(str(tmp_path / "cut")).predict(x), expected, atol=1e-5)


def test_a_process_a_launcher_placed_starts_no_service_and_tracks_by_itself(store, tmp_path, monkeypatch):
    """Only a command starts the service (xp.cli): a study's worker, a job's rank or a Ray actor uses the one that
    is there, and without one does its MLflow work itself: none outlives a command on a host it was sent to."""
    monkeypatch.setenv("XP_STATE_DIR", str(tmp_path / "state"))
    assert service.starts is False
    run = Tracker(store, "xp", "placed")
    run.start()
    run.log_metrics({"x": 1.0}, step=0)
    run.end("FINISHED")
    assert not isinstance(run._spool.drain, service.Served) and not _service_pids(tmp_path / "state")
    assert mlflow_runs(store)[1][0].info.status == "FINISHED"


def test_a_run_whose_spool_is_a_relative_folder_is_delivered_from_the_services_own_folder(store, state, tmp_path,
                                                                                         monkeypatch):
    """A run names its output folder relative to where it runs (Hydra's outputs/...); the service runs elsewhere."""
    monkeypatch.chdir(tmp_path)
    run = Tracker(store, "xp", "relative", spool_dir="outputs/run/mlflow-spool")
    run.start()
    run.log_metrics({"x": 1.0}, step=0)
    run.add_artifact_on_exit(tmp_path / "log.txt")
    (tmp_path / "log.txt").write_text("a line\n")
    run.end("FINISHED")
    client, [stored] = mlflow_runs(store)
    assert stored.info.status == "FINISHED" and stored.data.metrics == {"x": 1.0}
    assert [a.path for a in client.list_artifacts(stored.info.run_id)] == ["log.txt"]
    assert not (tmp_path / "outputs" / "run" / "mlflow-spool").exists()  # delivered: gone


@pytest.mark.mlflow_paths
def test_many_trials_at_once_through_one_service_all_arrive_and_a_busy_store_is_retried_not_left_out(
        store, state, caplog):
    """16 trials' runs (settle_later, as a study's 16 workers' are) delivered side by side by one service all
    arrive whole, none left out and none taken over by its own process (the service writes a store one run at a
    time, daemon.Gate: at 1,000 trials on 16 slots, 16 threads each holding a connection of SQLAlchemy's pool of 15
    timed out); and a store too busy to answer (that pool exhausted, which MLflow reports as INVALID_STATE) is
    away for now: its records are sent again, never left out as refused."""
    import threading

    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, INVALID_STATE

    from xp.tracking.spool import settle
    from xp.tracking.stores import away, refused as _refused

    spools = []

    def trial(i: int) -> None:
        run = Tracker(store, "xp", f"trial {i}", settle_later=True, params={f"p{k}": k for k in range(40)})
        run.start()
        assert isinstance(run._spool.drain, service.Served)
        spools.append(run._spool)
        for step in range(5):
            run.log_metrics({"val_accuracy": step / 10, "loss": 1.0 / (step + 1)}, step=step)
        run.end("FINISHED")

    with caplog.at_level(logging.INFO, logger="xp"):
        threads = [threading.Thread(target=trial, args=(i,)) for i in range(16)]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        assert len(spools) == 16
        settle()  # (each ended run's end asked of the service: delivered, its spool folder gone)
        assert not [s.folder for s in spools if s.folder.exists()]
    client, runs = mlflow_runs(store)
    assert len(runs) == 16 and {r.info.status for r in runs} == {"FINISHED"}
    assert all(len(r.data.params) == 40 and len(client.get_metric_history(r.info.run_id, "loss")) == 5 for r in runs)
    assert "left out" not in caplog.text and "this process delivers" not in caplog.text
    busy = MlflowException("(sqlite3) QueuePool limit of size 5 overflow 10 reached, connection timed out, timeout "
                           "30.00", error_code=INVALID_STATE)
    assert not _refused(busy) and away(busy)
    assert _refused(MlflowException("Changing param values is not allowed", error_code=INVALID_PARAMETER_VALUE))


def test_the_service_is_keyed_by_what_it_writes_with_said_once_and_ended_by_its_command(tmp_path, store, state,
                                                                                     monkeypatch):
    """A living service must not go on writing a store with an MLflow (or SQLAlchemy) that is no longer the one
    installed: its address is keyed by their versions and the protocol. The command that starts it says so;
    `python -m xp.tracking status | stop` say which runs and end it."""
    import importlib.metadata

    real = importlib.metadata.version
    service.identity.cache_clear()
    before = service.socket_path()
    for name in ("mlflow", "sqlalchemy"):
        monkeypatch.setattr(importlib.metadata, "version", lambda n, name=name: "9.9.9" if n == name else real(n))
        service.identity.cache_clear()
        assert service.socket_path() != before
    monkeypatch.setattr(importlib.metadata, "version", real)
    service.identity.cache_clear()
    assert service.socket_path() == before

    env = {"XP_STATE_DIR": str(state)}
    first = run_xp(tmp_path, store, "epochs=1", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.count("xp: started the tracking service (process ") == 1
    assert "python -m xp.tracking stop ends it now" in first.stdout
    again = run_xp(tmp_path, store, "epochs=1", env=env)
    assert again.returncode == 0 and "started the tracking service" not in again.stdout
    [pid] = _service_pids(state)
    tool = lambda what: subprocess.run([sys.executable, "-m", "xp.tracking", what], cwd=ROOT, capture_output=True,  # noqa: E731
                                       text=True, timeout=60, env={**os.environ, **env})
    said = tool("status").stdout
    assert said.startswith(f"tracking service {pid} (this checkout's)\n  checkout   {ROOT / 'xp'} (Python "), said
    assert f"MLflow {importlib.metadata.version('mlflow')}, SQLAlchemy " in said and f"  state      {state}\n" in said
    assert f"  stores     {store}\n" in said and "  now        0 run(s) or command(s) connected; idle " in said
    assert tool("stop").stdout.strip() == f"tracking service {pid} ended (this checkout's)"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert tool("status").stdout.startswith("no tracking service runs for ")


def test_stop_ends_this_checkouts_service_only_and_a_service_superseded_by_its_checkouts_newer_one_goes(
        tmp_path, state):
    """Two checkouts of xp (a second clone's code, here a copy of xp/) each have their service in the one state
    folder: `status` says whose each is; `stop` ends this checkout's and leaves the other running (`--every` ends
    it too). A checkout whose code changed starts a new service; the one it supersedes goes once it is idle
    (it idled 30 minutes)."""
    import shutil
    import time

    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "xp", clone / "xp", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "XP_STATE_DIR": str(state)}
    env.pop("PYTHONPATH", None)
    start = "from xp.tracking import service; service.starts = True; service.connect().close()"

    def start_in_clone() -> None:
        done = subprocess.run([sys.executable, "-c", start], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]

    def tool(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "xp.tracking", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    service.connect().close()  # this checkout's service
    start_in_clone()
    found = {said.checkout: process.pid for process, said in services.running(state)}
    assert set(found) == {str(ROOT / "xp"), str(clone / "xp")}, found
    ours, theirs = found[str(ROOT / "xp")], found[str(clone / "xp")]
    said = tool("status")
    assert f"tracking service {ours} (this checkout's)" in said and \
        f"tracking service {theirs} (another checkout's: {clone / 'xp'})" in said, said
    said = tool("stop")
    assert said.startswith(f"tracking service {ours} ended (this checkout's)\nleft running: 1 of other checkouts "
                           f"(process {theirs}:"), said
    assert psutil.pid_exists(theirs) and psutil.Process(theirs).status() != psutil.STATUS_ZOMBIE

    edited = clone / "xp" / "errors.py"  # the clone's code changes: its next command starts another service
    edited.write_text(edited.read_text() + "\n")
    os.utime(edited, (time.time() + 5, time.time() + 5))
    start_in_clone()
    psutil.Process(theirs).wait(60)  # the one it superseded, idle, goes (bounded: a failure if it stays)
    [(process, newer)] = services.running(state)
    assert newer.checkout == str(clone / "xp") and process.pid != theirs
    log = "".join(p.read_text() for p in (state / "service").glob("*.log"))
    assert f"superseded by service {process.pid} (the same checkout's, started since), gone" in log
    assert tool("stop", "--every").startswith(f"tracking service {process.pid} ended (another checkout's: ")
    assert services.running(state) == []


def test_every_operation_of_the_protocol_is_one_the_services_process_does():
    """The command's MLflow work goes to the service by name (a message kind each), and its process names the
    function for each: none is left out (the service would refuse it, and the command fail)."""
    from xp import trackingd
    from xp.tracking.messages import TRACKING, Op

    ops = {kind for kind in TRACKING.kinds.values() if issubclass(kind, Op)}
    assert ops == set(trackingd.OPS) and len(ops) == 5, ops
