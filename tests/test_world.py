"""Nothing lost when the world misbehaves: several processes on new stores, a half-migrated store,
a full disk during a checkpoint, a tracking server that goes away, a killed sweep (issue 29)."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest

from conftest import ROOT, mlflow_runs, run_xp, xp_args, xp_env


@pytest.mark.slow
def test_eight_processes_on_new_stores_all_succeed_and_never_propose_the_same_trial(tmp_path):
    """8 studies started together on a fresh SQLite MLflow store and a fresh Optuna SQLite storage: before,
    MLflow's migrations raced (the file left unusable) and every sweeper drew the same proposals."""
    store, storage = f"sqlite:///{tmp_path}/mlruns/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    procs = [subprocess.Popen([*xp_args(tmp_path / str(i), "-m", "sweep=lr_batch", "sweep.n_trials=8", "epochs=1")],
                              cwd=ROOT, env=xp_env(store, {"XP_OPTUNA_STORAGE": storage}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    try:
        outs = [p.communicate(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    import optuna

    trials = optuna.load_study(study_name="lr_batch", storage=storage).get_trials()
    proposed = [tuple(sorted(t.params.items())) for t in trials]
    assert len(trials) >= 8 and len(set(proposed)) == len(proposed), proposed
    client, runs = mlflow_runs(store)  # the store is usable afterwards, and holds every run
    assert len([r for r in runs if r.data.tags.get("xp.sweep") == "true"]) == 8
    assert all(r.info.status == "FINISHED" for r in runs)
    with sqlite3.connect(f"{tmp_path}/mlruns/mlflow.db") as db:
        assert not db.execute("select name from sqlite_master where name like '_alembic_tmp%'").fetchall()


def test_a_half_migrated_store_is_named_with_the_fix(tmp_path):
    """A store whose schema stopped between two versions (a crash during creation): one line naming it."""
    store = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert run_xp(tmp_path, store, "epochs=1").returncode == 0
    with sqlite3.connect(f"{tmp_path}/mlruns/mlflow.db") as db:  # as a migration interrupted midway leaves it
        old = "7f2a7d5fae7d"  # an older revision of MLflow's schema
        db.execute("update alembic_version set version_num=?", (old,))
        db.execute("create table _alembic_tmp_params (x int)")
        db.execute("drop table webhooks")
    r = run_xp(tmp_path, store, "epochs=1")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "was left half-migrated" in lines[0] and f"mv {tmp_path}/mlruns/mlflow.db" in lines[0], lines[0]


DISK_FULL = r"""
set -u
T={tmpfs}; L={logs}
mount -t tmpfs -o size=4m xp-test-tmpfs "$T" || exit 97
step() {{ name=$1; shift; "$@" > "$L/$name.out" 2> "$L/$name.err"; echo $? > "$L/$name.rc"; }}
step first {xp} epochs=1 checkpoint_dir=$T/ck
dd if=/dev/zero of=$T/ballast bs=64k 2>/dev/null; truncate -s -200K $T/ballast   # 200 KB left: a commit is ~440
step new_dir {xp} epochs=1 checkpoint_dir=$T/ck2
step resumed_full {xp} epochs=3 resume=$T/ck checkpoint_dir=$T/ck
rm $T/ballast
step resumed {xp} epochs=2 resume=$T/ck checkpoint_dir=$T/ck
cat $T/ck/latest > $L/latest
(cd $T && find . | sort) > $L/files
"""


@pytest.mark.slow
def test_a_full_disk_during_a_commit_is_one_line_and_leaves_nothing_behind(tmp_path, store):
    """On a 4 MB tmpfs (in a mount namespace of the test's own): a first commit that does not fit, and a
    commit that the free-space check refuses, are one line naming checkpoint_dir (exit 1, run FAILED), leave no
    temporary folder, and the last good commit resumes once space is freed."""
    import shlex
    import shutil

    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed: ./dev.sh test installs it")
    tmpfs, logs = tmp_path / "disk", tmp_path / "logs"
    tmpfs.mkdir()
    logs.mkdir()
    xp = shlex.join(xp_args(tmp_path, "tracking_uri=" + store))
    script = DISK_FULL.format(tmpfs=tmpfs, logs=logs, xp=xp)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script], cwd=ROOT,
                       env=xp_env(store), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rc = {p.stem: int(p.read_text()) for p in logs.glob("*.rc")}
    err = {p.stem: p.read_text() for p in logs.glob("*.err")}
    assert rc == {"first": 0, "new_dir": 1, "resumed_full": 1, "resumed": 0}, (rc, err)
    for step, folder in (("new_dir", "ck2"), ("resumed_full", "ck")):
        lines = err[step].strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err[step], err[step]
        assert lines[0].startswith(f"xp: error: checkpoint_dir={tmpfs}/{folder}: the disk is full: a commit needs")
        assert "MB free" in lines[0]
    assert "is intact" in err["resumed_full"]
    assert (logs / "latest").read_text() == "epoch-2"  # resumed from epoch 1 once space was freed
    files = (logs / "files").read_text().split()
    assert not [f for f in files if ".tmp-" in f], files  # no temporary commit left behind
    assert {f.split("/")[1] for f in files if f != "."} == {"ck", "ck2"}  # nothing outside checkpoint_dir
    _, runs = mlflow_runs(store)
    assert [r.info.status for r in runs] == ["FINISHED", "FAILED", "FAILED", "FINISHED"]
