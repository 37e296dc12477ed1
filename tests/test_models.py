"""Models as outputs (model.log): a run's model in MLflow, a study's best registered, predicted with in a fresh
process and by python -m xp.predict, for both frameworks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, mlflow_client, mlflow_runs, run_xp, xp_process
from images import digit_images

STUDY = """
    study_name: {name}
    n_trials: 2
    sampler: random
    sampler_seed: 3
    pruner: none
    params:
      lr: {{type: float, low: 0.005, high: 0.2, log: true}}
"""

# in a fresh process: the registered best's predictions on the digits' validation set, and its accuracy
PREDICT = """
import json, sys
import mlflow, numpy as np
from xp.data.datasets import describe, load_arrays
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
_, _, x, y = load_arrays(describe("digits", {"val_fraction": 0.2}))
scores = np.asarray(model.predict(x))
print(json.dumps({"shape": list(scores.shape), "accuracy": float((scores.argmax(1) == y).mean())}))
"""


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory):
    """A virtual environment without xp, as MLflow's serving makes one (`mlflow models serve --env-manager
    virtualenv`: Python from python_env.yaml, then the model's requirements.txt): `install(model folder)` adds a
    model's requirements from the package index, except torch (gigabytes with its CUDA libraries), taken from
    this environment through a path file (in which this environment's editable xp stays inactive). Returns
    install and the environment's bin folder."""
    venv = tmp_path_factory.mktemp("served") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())

    def install(model: Path) -> None:
        assert "3.11" in (model / "python_env.yaml").read_text()
        wanted = [line for line in (model / "requirements.txt").read_text().split() if line]
        assert not [r for r in wanted if r.split("=")[0].split("<")[0] in ("xp", "xp-example")], wanted
        here = [r for r in wanted if not r.startswith("torch")]
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", *here],  # (not byte-compiled: faster)
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        if len(here) < len(wanted):
            import sysconfig

            (site / "torch-from-here.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        gone = subprocess.run([str(py), "-c", "import xp"], cwd=venv, capture_output=True, text=True)
        assert gone.returncode != 0 and "No module named 'xp'" in gone.stderr  # the model must load without it

    return install, venv / "bin"


def served_predictions_match(store, uri, tmp_path, served):
    """`mlflow models serve` in an environment made from the model's own requirements (`served`: the fresh_env
    fixture) answers a real HTTP request with the predictions the model makes in this process."""
    import os
    import signal
    import socket
    import time
    import urllib.request

    import mlflow

    from xp.data.datasets import describe, load_arrays

    x = load_arrays(describe("digits", {"val_fraction": 0.2}))[2][:5]
    mlflow.set_tracking_uri(store)
    here = np.asarray(mlflow.pyfunc.load_model(uri).predict(x))
    model = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "served-model")))
    install, bin_dir = served
    install(model)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen([str(bin_dir / "mlflow"), "models", "serve", "-m", str(model), "--env-manager",
                                 "local", "-h", "127.0.0.1", "-p", str(port)], env=env, cwd=tmp_path,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # until it answers /ping (or is gone, or the deadline passes)
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations",
                                         data=json.dumps({"inputs": x.tolist()}).encode(),
                                         headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        assert np.allclose(np.asarray(answer["predictions"]), here, atol=1e-5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the uvicorn it started, which this test began
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gluon", "torch"])
def test_a_studys_best_model_is_registered_and_predicts_as_its_run_measured(tmp_path, store, backend, fresh_env):
    name = f"digits_{backend}"
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "small.yaml").write_text(textwrap.dedent(STUDY.format(name=name)))
    env = {"XP_SWEEPS_DIR": str(sweeps), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}
    ckpt = tmp_path / "ckpt"
    proc = run_xp(tmp_path, store, "-m", "sweep=small", f"backend={backend}", "epochs=3", "sweep.parallel=2",
                  f"checkpoint_dir={ckpt}", "checkpoint.keep_last=1", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"the best trial's model: models:/{name}@best" in proc.stdout

    import optuna

    best = optuna.load_study(study_name=name, storage=env["XP_OPTUNA_STORAGE"]).best_trial
    # the study's retention: the best trial's commits stay (its latest only), the other trials' went
    assert [p.name for p in ckpt.iterdir()] == [f"trial-{best.number}"]
    assert [p.name for p in (ckpt / f"trial-{best.number}").glob("epoch-*")] == ["epoch-3"]
    client = mlflow_client(store)
    version = client.get_model_version_by_alias(name, "best")
    assert version.run_id == best.user_attrs["mlflow_run_id"]
    assert version.tags["trial"] == str(best.number) and float(version.tags["param.lr"]) == best.params["lr"]
    assert version.source == client.get_run(version.run_id).data.tags["xp.logged_model"]
    model = client.get_logged_model(version.source.split("/")[-1])
    assert model.source_run_id == version.run_id and str(model.status).endswith("READY")
    # the experiment's models list names each "model": its tags say which network, data and backend it is
    assert {k: model.tags.get(k) for k in ("xp.model", "xp.dataset", "xp.backend")} == \
        {"xp.model": "lenet", "xp.dataset": "digits", "xp.backend": backend}
    outputs = client.get_run(version.run_id).outputs.model_outputs  # the run's page lists its logged model
    assert [(o.model_id, o.step) for o in outputs] == [(model.model_id, int(model.tags["xp.epoch"]))]
    linked = {m.key: m for m in model.metrics}  # the metrics of the epoch the model came from
    history = client.get_metric_history(version.run_id, "val_accuracy")
    assert linked["val_accuracy"].value == max(m.value for m in history)  # model.log=best: the best epoch's

    # every run of the study logged its own model (its tag says which)
    _, runs = mlflow_runs(store)
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(trials) == 2 and all(r.data.tags["xp.logged_model"].startswith("models:/m-") for r in trials)

    fresh = subprocess.run([sys.executable, "-c", PREDICT, store, f"models:/{name}@best"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    said = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert said["shape"] == [359, 10]
    assert round(said["accuracy"], 4) == round(linked["val_accuracy"].value, 4)

    # served where only its own requirements are installed (no xp): MXNet's too
    served_predictions_match(store, f"models:/{name}@best", tmp_path, fresh_env)
    if backend == "gluon":  # the report of the study says which trial is registered, and each trial's model
        parent = [r for r in runs if r.data.tags.get("xp.sweep") == "true"][0]
        report = subprocess.run([sys.executable, "-m", "xp.report", "--tracking-uri", store, "--parent",
                                 parent.info.run_id, "--out", str(tmp_path / "report")], cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        assert report.returncode == 0, report.stderr[-3000:]
        text = (tmp_path / "report" / "report.md").read_text()
        assert f"Registered: `models:/{name}@best` is version {version.version}, trial {best.number}" in text
        assert all(r.data.tags["xp.logged_model"] in text for r in trials)

    # back in: fine-tuning from the registered model starts from its accuracy (its first epoch within a point)
    tuned = run_xp(tmp_path / "tuned", store, f"backend={backend}", f"pretrained=models:/{name}@best", "epochs=1",
                   "lr=0.002", "run_name=tuned", timeout=300)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    run = [r for r in mlflow_runs(store)[1] if r.info.run_name == "tuned"][0]
    assert run.data.metrics["val_accuracy"] >= linked["val_accuracy"].value - 0.01
    other = "gluon" if backend == "torch" else "torch"
    wrong = run_xp(tmp_path / "wrong", store, f"backend={other}", f"pretrained=models:/{name}@best", "epochs=1")
    assert wrong.returncode == 2 and f"pretrained=models:/{name}@best: a" in wrong.stderr, wrong.stderr[-2000:]
    if backend == "gluon":  # (the registry's check, before either backend loads the model: once)
        shape = run_xp(tmp_path / "shape", store, f"backend={backend}", f"pretrained=models:/{name}@best",
                       "dataset.classes=[1,2,3]", "epochs=1")
        assert shape.returncode == 2 and "the model takes 1x8x8 images into 10 classes; this data set has 1x8x8 " \
            "images and 3 classes" in shape.stderr, shape.stderr[-2000:]

    images = digit_images(tmp_path / "images", 12)
    out = subprocess.run([sys.executable, "-m", "xp.predict", f"models:/{name}@best", str(images),
                          "--tracking-uri", store], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split("\t") for line in out.stdout.strip().splitlines()]
    assert len(lines) == 12 and all(0.0 < float(p) <= 1.0 for _, _, p in lines)
    right = sum(path.rsplit("-", 1)[1].split(".")[0] == label for path, label, _ in lines)
    assert right >= 10, out.stdout  # the files' pixels, read back as the data set's: its accuracy, about


@pytest.mark.slow
def test_the_best_alias_moves_to_a_better_trial_while_the_study_runs(tmp_path, store):
    """Trial 0 (one epoch) ends while trial 1 (2,000 epochs) trains on the other slot: the alias `best` is on trial
    0's model before the study ends."""
    import signal
    import time

    import optuna

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "follow.yaml").write_text("study_name: follow\nn_trials: 2\nsampler: grid\npruner: none\n"
                                        "parallel: 2\nparams:\n  epochs: {type: categorical, choices: [1, 2000]}\n")
    env = {"XP_SWEEPS_DIR": str(sweeps), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}
    with xp_process(tmp_path, store, "-m", "sweep=follow", env=env) as proc:
        deadline, version = time.monotonic() + 240, None
        while version is None:  # the event: the alias exists (bounded)
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("no alias best while the study ran: " + proc.communicate(timeout=60)[1][-3000:])
            try:
                version = mlflow_client(store).get_model_version_by_alias("follow", "best")
            except Exception:
                time.sleep(0.5)
        assert proc.poll() is None  # the study still runs: trial 1 trains
        trials = optuna.load_study(study_name="follow", storage=env["XP_OPTUNA_STORAGE"]).trials
        assert [t.state.name for t in trials] == ["COMPLETE", "RUNNING"]
        assert version.tags["trial"] == "0" and version.run_id == trials[0].user_attrs["mlflow_run_id"]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]


@pytest.mark.mlflow_paths
@pytest.mark.parametrize("backend", ["gluon", "torch"])
def test_the_best_epochs_model_is_the_best_epochs_when_a_later_epoch_is_worse(tmp_path, store, backend):
    """lr=0.1 overshoots after its best epoch (gluon's 2nd of 5, torch's 4th): the logged model predicts at the
    best epoch's accuracy, not the last's (a view of the live weights made it the last epoch's)."""
    proc = run_xp(tmp_path, store, f"backend={backend}", "epochs=5", "lr=0.1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = mlflow_runs(store)
    history = sorted(client.get_metric_history(run.info.run_id, "val_accuracy"), key=lambda m: m.step)
    best = max(history, key=lambda m: m.value)
    assert best.step < history[-1].step and best.value > history[-1].value + 0.01, history  # the case it proves
    model = client.get_logged_model(run.data.tags["xp.logged_model"].split("/")[-1])
    assert model.tags["xp.epoch"] == str(best.step)
    fresh = subprocess.run([sys.executable, "-c", PREDICT, store, run.data.tags["xp.logged_model"]], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    said = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert round(said["accuracy"], 4) == round(best.value, 4), (said, history)


@pytest.mark.mlflow_paths
def test_model_log_none_logs_no_model_and_last_logs_the_last_epochs(tmp_path, store):
    for how in ("none", "last"):
        proc = run_xp(tmp_path / how, store, "epochs=2", f"model.log={how}", f"run_name={how}", "lr=0.5",
                      timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = mlflow_runs(store)
    by_name = {r.info.run_name: r for r in runs}
    assert "xp.logged_model" not in by_name["none"].data.tags
    model = client.get_logged_model(by_name["last"].data.tags["xp.logged_model"].split("/")[-1])
    assert {m.step for m in model.metrics} == {2}


def test_predict_with_a_model_that_is_not_there_is_one_line(tmp_path, store):
    images = digit_images(tmp_path / "images", 1)
    mlflow_client(store)  # the store exists, the model does not
    for uri, fragment in (("models:/nope@best", "models:/nope@best: no such model in"),
                          ("runs:/0123/model", "runs:/0123/model: no such model in")):
        out = subprocess.run([sys.executable, "-m", "xp.predict", uri, str(images), "--tracking-uri", store],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and fragment in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "xp.predict", "models:/nope@best", str(tmp_path / "none.png"),
                          "--tracking-uri", store], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "none.png: no such file or folder" in out.stderr


def test_a_models_metrics_are_its_epochs_points_though_another_thread_logged_between(tmp_path, store, monkeypatch):
    """The model links its epoch's points as they were logged, also when the telemetry's thread logged its system
    metrics (at a step of its own) between the epoch's metrics and the model: before, the model then carried new
    points, a millisecond later, and the run's curve had that epoch twice (found by benchmarks/chaos.py)."""
    import itertools

    from xp.tracking import tracker as module

    clock = itertools.count(1_000_000)
    monkeypatch.setattr(module.time, "time", lambda: next(clock))  # each call a later second
    monkeypatch.setenv("XP_TRACKING_SERVICE", "0")
    monkeypatch.setenv("XP_STATE_DIR", str(tmp_path / "state"))
    t = module.Tracker(store, "xp", "points")
    t.start()
    try:
        t.log_metrics({"val_accuracy": 0.5, "loss": 1.0}, step=2)
        epoch = [p for p in t._points[2].values()]
        t.log_metrics({"system/cpu_percent": 50.0}, step=9)  # the telemetry's thread, meanwhile
        t.log_model(lambda folder: None, 2, {"val_accuracy": 0.5, "loss": 1.0})
        assert sorted(t.model[2]) == sorted(epoch)  # the same points: (key, value, time, step)
    finally:
        t.model = None
        t.end("FINISHED")


@pytest.mark.mlflow_paths
def test_a_model_sent_again_after_its_answer_was_lost_is_linked_once_not_left_out(tmp_path, store):
    """The server killed as it committed the run's link to its model: the spool sends the model again, and the store
    refuses the link as a duplicate. It was left out (the run without its model tag); now found linked, it is done."""
    from mlflow.entities import RunStatus

    from xp.tracking.models import MODEL_ID, RUN_TAG, send_model

    client = mlflow_client(store)
    run = client.create_run(client.create_experiment("lost-answer"))
    spool = tmp_path / "spool"
    (spool / "model").mkdir(parents=True)
    (spool / "model" / "MLmodel").write_text("flavors: {}\n")  # a whole model's folder (its files are copied)
    record = {"dir": "model", "name": "model", "step": 2, "metrics": [["val_accuracy", 0.5, 1000, 2]]}
    send_model(client, run.info.run_id, spool, record)
    (spool / (MODEL_ID + ".output")).unlink()  # as if the link's answer never came back
    client.delete_tag(run.info.run_id, RUN_TAG)
    send_model(client, run.info.run_id, spool, record)
    again = client.get_run(run.info.run_id)
    assert again.data.tags[RUN_TAG] == f"models:/{(spool / MODEL_ID).read_text().strip()}"
    assert len(again.outputs.model_outputs) == 1
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
