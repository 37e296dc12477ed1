"""Checkpoint and resume: a run killed with SIGKILL mid-training and resumed ends bit-identical
to an uninterrupted one, in the same MLflow run."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from conftest import metric_by_step, mlflow_runs, run_xp, wait_for_line, xp_process
from xp.run import checkpoint

METRICS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr")


def reference_and_interrupted(tmp_path, store, common: list[str], line: str, sig: signal.Signals,
                              settle_s: float = 0.0):
    """An uninterrupted run (its own store), then the same run with checkpoints, sent `sig` once `line`
    is printed. Returns (the interrupted process's exit code and stderr, its checkpoint folder, the
    arguments to run it again, the reference store)."""
    ref_store = f"sqlite:///{tmp_path / 'ref.db'}"
    ref = run_xp(tmp_path / "ref", ref_store, *common, f"save_params={tmp_path / 'ref.npz'}", timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    ckpt = tmp_path / "ckpt"
    args = [*common, f"checkpoint_dir={ckpt}", f"save_params={tmp_path / 'resumed.npz'}",
            "checkpoint.keep_last=1", "checkpoint.keep_best=1"]  # retention on: resuming needs only the latest
    with xp_process(tmp_path / "a", store, *args) as proc:
        wait_for_line(proc, line, timeout=120)
        time.sleep(settle_s)  # past the line's own moment (an epoch boundary) into the next epoch's batches
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    return proc.returncode, err, ckpt, args, ref_store


def assert_same_as_reference(tmp_path, store, ref_store) -> None:
    got, want = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "ref.npz")
    assert set(got.files) == set(want.files)
    for name in want.files:
        assert np.array_equal(got[name], want[name]), name  # bit-exact: momentum, schedule and data order kept
    client, runs = mlflow_runs(store)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # the same run, continued
    assert runs[0].data.tags["xp.resumed"] == "true"
    ref_client, ref_runs = mlflow_runs(ref_store)
    for key in METRICS:
        assert metric_by_step(client, runs[0].info.run_id, key) == metric_by_step(ref_client, ref_runs[0].info.run_id, key), key


# torch's threads fitted to a busy machine change how its sums are split, and so the last bits: a run that must
# repeat another bit for bit keeps its threads (docs/reference/configuration.md, backend.fit_threads)
BIT_EXACT = {"torch": ["backend.fit_threads=false"]}


@pytest.mark.slow
@pytest.mark.parametrize("backend, dropout", [("gluon", 0.0), ("gluon", 0.5), ("module", 0.5), ("torch", 0.5)])
def test_sigkill_then_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, store, backend, dropout):
    # with dropout the resumed run must draw the same masks: the generator is reseeded per step; the core's path
    # that draws nothing (no dropout) is the same for every backend: gluon's here, torch's mid-epoch further down
    common = [f"backend={backend}", "epochs=8", "lr_schedule=step", "lr_steps=[4,6]", "momentum=0.9",
              f"model.dropout={dropout}", *BIT_EXACT.get(backend, [])]
    # killed in epoch 4, or just after epoch 3's commit
    code, _, ckpt, args, ref_store = reference_and_interrupted(tmp_path, store, common, "epoch 3/8", signal.SIGKILL)
    assert code == -signal.SIGKILL
    committed = checkpoint.latest(ckpt).epoch
    assert 3 <= committed < 8

    r = run_xp(tmp_path / "b", store, *args, "resume=true", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming after epoch {committed}" in r.stdout
    assert_same_as_reference(tmp_path, store, ref_store)


@pytest.mark.slow
def test_resume_errors_are_one_line(tmp_path, store):
    r = run_xp(tmp_path, store, "resume=true", timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "xp: error: resume=true: no interrupted run with a checkpoint_dir in experiment xp")
    r = run_xp(tmp_path, store, f"resume={tmp_path / 'nothing'}", timeout=120)
    assert r.returncode == 2 and "no committed state there" in r.stderr
    assert all(run.info.status != "RUNNING" for run in mlflow_runs(store)[1])


@pytest.mark.slow
def test_sigterm_commits_mid_epoch_ends_killed_and_resumes_exactly(tmp_path, store):
    """A spot interruption notice: the batch in flight finishes, the state is committed with the batch
    position, the run ends KILLED (exit 143); resume=true goes on from that batch."""
    common = ["epochs=4", "batch=4", "lr=0.005"]  # 359 batches an epoch: the signal lands inside one
    code, err, ckpt, args, ref_store = reference_and_interrupted(tmp_path, store, common, "epoch 1/4",
                                                                 signal.SIGTERM, settle_s=0.2)
    assert code == 143, err
    assert [r.info.status for r in mlflow_runs(store)[1]] == ["KILLED"]
    done = checkpoint.latest(ckpt)
    assert done.epoch == 1 and done.meta["position"]["epoch"] == 2 and 0 < done.meta["position"]["step"] < 359

    r = run_xp(tmp_path / "b", store, *args, "resume=true", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # the interrupted epoch's training scores carried over the interruption too
    assert_same_as_reference(tmp_path, store, ref_store)


@pytest.mark.slow
def test_torch_on_records_resumes_mid_epoch_bit_identically(tmp_path, store, monkeypatch):
    """backend=torch reading RecordIO through its decode workers (unaugmented): SIGTERM mid-epoch, resume=true
    goes on from that batch with the samples the uninterrupted run read there."""
    from images import make_folder

    monkeypatch.setenv("XP_CACHE_DIR", str(tmp_path / "cache"))
    root = make_folder(tmp_path / "imgs", per_class=200, size=(28, 28), with_photos=False)
    common = [*BIT_EXACT["torch"], "backend=torch", "dataset=folder", f"dataset.root={root}",
              "dataset.image_shape=[3,24,24]",
              "dataset.store_size=24", "dataset.resize=24", "dataset.random_resized_crop=false",
              "dataset.rand_mirror=false", "epochs=3", "batch=2", "lr=0.01", "data_nthreads=2"]
    code, err, ckpt, args, ref_store = reference_and_interrupted(tmp_path, store, common, "epoch 1/3",
                                                                 signal.SIGTERM, settle_s=0.3)
    assert code == 143, err
    done = checkpoint.latest(ckpt)
    steps = 240  # 480 training images, batch 2
    assert done.meta["position"]["epoch"] == 2 and 0 < done.meta["position"]["step"] < steps, done.meta

    r = run_xp(tmp_path / "b", store, *args, "resume=true", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_as_reference(tmp_path, store, ref_store)


def test_retention_keeps_the_latest_and_the_best_commits(tmp_path):
    """checkpoint.keep_last=1 checkpoint.keep_best=1: a 20-epoch run leaves at most 2 commits, the latest (which
    resume= continues from) and the one after the best val_accuracy."""
    accuracy = [0.5, 0.7, 0.9, 0.8] + [0.6] * 16  # the best after epoch 3
    history = []
    for epoch, acc in enumerate(accuracy, 1):
        history.append({"val_accuracy": acc})
        checkpoint.commit(tmp_path, epoch, list(history), lambda folder: (folder / "params").write_text("x"),
                          keep=(1, 1))
    assert sorted(p.name for p in tmp_path.glob("epoch-*")) == ["epoch-20", "epoch-3"]
    assert checkpoint.latest(tmp_path).epoch == 20
    for epoch in range(21, 23):  # the default: the latest 2, no best
        history.append({"val_accuracy": 0.1})
        checkpoint.commit(tmp_path, epoch, list(history), lambda folder: None)
    assert sorted(p.name for p in tmp_path.glob("epoch-*")) == ["epoch-21", "epoch-22"]


def test_a_studys_retention_keeps_the_best_complete_trial_and_what_a_resume_needs(tmp_path):
    """When a trial ends, the folders of ended trials go but the best complete one's; a trial still running or
    killed (no trial.json: a resume continues it) keeps its folder."""
    import json

    def trial(n, ended):
        folder = tmp_path / f"trial-{n}"
        (folder / "epoch-1").mkdir(parents=True)
        if ended is not None:
            (folder / checkpoint.TRIAL).write_text(json.dumps(ended))
        return folder

    trial(0, {"complete": True, "val_accuracy": 0.8})
    trial(1, {"complete": True, "val_accuracy": 0.9})
    trial(2, {"complete": False})  # pruned
    trial(3, None)  # running, or killed
    gone = checkpoint.keep_best_trial(tmp_path / "trial-2", "val_accuracy", "maximize")
    assert sorted(p.name for p in gone) == ["trial-0", "trial-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trial-1", "trial-3"]
    trial(4, {"complete": True, "val_accuracy": 0.95})
    checkpoint.keep_best_trial(tmp_path / "trial-4", "val_accuracy", "maximize")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trial-3", "trial-4"]
    trial(5, {"complete": True, "val_accuracy": 0.5})
    checkpoint.keep_best_trial(tmp_path / "trial-5", "val_accuracy", "minimize")  # minimize: the lowest stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trial-3", "trial-5"]


@pytest.mark.slow
def test_a_resumed_runs_model_is_the_best_epoch_of_the_whole_run(tmp_path, store):
    """lr=0.1 peaks early (gluon's 2nd epoch of 5) and a SIGKILL lands after the 3rd: the resumed run's model is
    the best epoch's of the whole run, loaded from its kept commit (checkpoint.keep_best=1), though no epoch after
    the resume beats it; it predicts at that epoch's accuracy (before: the best epoch since the resume)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT
    from test_models import PREDICT

    args = ["backend=gluon", "epochs=5", "lr=0.1", f"checkpoint_dir={tmp_path / 'ckpt'}", "checkpoint.keep_last=1",
            "checkpoint.keep_best=1"]
    with xp_process(tmp_path / "a", store, *args) as proc:
        wait_for_line(proc, "epoch 3/5", timeout=120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    r = run_xp(tmp_path / "b", store, *args, "resume=true", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    client, [run] = mlflow_runs(store)
    history = sorted(client.get_metric_history(run.info.run_id, "val_accuracy"), key=lambda m: m.step)
    best = max(history, key=lambda m: m.value)
    resumed_at = int(r.stdout.split("resuming after epoch ")[1].split()[0])
    assert best.step < resumed_at and max(m.value for m in history if m.step > resumed_at) < best.value, history
    model = client.get_logged_model(run.data.tags["xp.logged_model"].split("/")[-1])
    assert model.tags["xp.epoch"] == str(best.step)
    fresh = subprocess.run([sys.executable, "-c", PREDICT, store, run.data.tags["xp.logged_model"]], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert round(json.loads(fresh.stdout.strip().splitlines()[-1])["accuracy"], 4) == round(best.value, 4)
