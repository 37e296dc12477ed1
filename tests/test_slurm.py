"""launcher=slurm for real: jobs submitted from a login node to a Slurm cluster the tests start (tests/slurm.py:
slurmctld on h1, one slurmd on each of h2 and h3, munge, in network namespaces), run by every engine through
srun, followed to their end; the MLflow server on h1's address serves every node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conformance import assert_killed_line, conformance, kill_one_worker
from conftest import ROOT, load_study, mlflow_client, said, unless_given, wait_for_line
from test_distributed import EXACT, assert_same_params, one_process

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

DAEMONS = ("slurmstepd", "/usr/sbin/slurmd", "/usr/sbin/munged")  # the cluster's own processes on a node


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import hosts
    import slurm

    why = hosts.requirements() or slurm.requirements()
    if why:
        pytest.fail(why)  # CI runs as root with the packages ./dev.sh installs: a missing piece is a failure
    with slurm.SlurmCluster(3) as c:
        c.db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
        c.uri = c.mlflow_server(c.db)
        yield c


def xp_argv(c, tmp_path: Path, *args: str, experiment: str) -> list[str]:
    """python -m xp launcher=slurm with the cluster's settings (an argument with the same key replaces one)."""
    settings = unless_given(("launcher=slurm", "network_interface=eth0", f"tracking_uri={c.uri}",
                             f"launcher.output_dir={c.shared}", "launcher.poll_s=0.5", "dist_timeout_s=120"), args)
    return [sys.executable, "-m", "xp", *settings, f"experiment={experiment}", f"hydra.run.dir={tmp_path}/run", *args]


def env(c) -> dict:
    e = {**os.environ, **c.env, "PYTHONUNBUFFERED": "1"}
    for k in ("MLFLOW_TRACKING_URI", "XP_PARENT_RUN_ID", "XP_RUN_ID", "XP_COMMAND"):
        e.pop(k, None)
    return e


def submit(c, tmp_path: Path, *args: str, experiment: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """python -m xp launcher=slurm on the login node h1: xp submits the job and follows it."""
    return subprocess.run(c.on_launcher(xp_argv(c, tmp_path, *args, experiment=experiment)), cwd=ROOT, env=env(c),
                          capture_output=True, text=True, timeout=timeout)


def the_run(c, experiment: str):
    client = mlflow_client(f"sqlite:///{c.db}")
    exp = client.get_experiment_by_name(experiment)
    found = [] if exp is None else client.search_runs([exp.experiment_id])
    assert len(found) == 1, [r.info.run_name for r in found]  # the submitter's run; no worker opened another
    return found[0]


def nothing_left(c) -> None:
    """No process of a job on any node, and no job of xp's queued, running or completing."""
    deadline = time.monotonic() + 30
    while True:
        left = {h.name: [p for p in c.processes(h) if not p.split(" ", 1)[1].startswith(DAEMONS)] for h in c.workers}
        queued = c.slurm(["squeue", "-h", "-o", "%j %T"]).stdout.strip()
        if (not any(left.values()) and "xp-" not in queued) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), left
    assert "xp-" not in queued, queued


@conformance("exact", "launcher, engine, args, reference", [
    ("slurm", "ps-lite", ["backend=gluon", "kvstore=dist_sync"], "gluon"),
    ("slurm", "torchrun", ["backend=torch"], "torch"),
    ("slurm", "horovod", ["backend=horovod"], "gluon"),
])
def test_a_2_node_job_from_the_login_node_computes_what_one_process_computes(cluster, tmp_path, launcher, engine,
                                                                             args, reference):
    c, experiment = cluster, f"slurm-{engine}"
    want = one_process(reference, *EXACT, "batch=48")
    out = c.shared / f"{engine}.npz"
    r = submit(c, tmp_path, f"launcher={launcher}", *args, *EXACT, "workers=2", "launcher.nodes=2", "batch=24", f"save_params={out}",
               experiment=experiment)
    assert r.returncode == 0, said(r)
    assert "submitted Slurm job" in r.stdout and "epoch 1/1" in r.stdout  # the job's output, relayed
    assert_same_params(dict(np.load(out)), want)
    run = the_run(c, experiment)
    assert run.info.status == "FINISHED" and run.data.tags["xp.slurm.state"] == "COMPLETED"
    assert run.data.tags["xp.launcher"] == "slurm" and run.data.params["derived.global_batch"] == "48"
    nothing_left(c)


@conformance("killed", "launcher", ["slurm"])
def test_a_killed_worker_fails_the_job_naming_rank_and_node(cluster, tmp_path, launcher):
    """Inside the job, xp's launcher sees the worker on h3 die and fails the job naming it; the Slurm job ends
    FAILED, and so does the run."""
    c = cluster
    proc = subprocess.Popen(c.on_launcher(xp_argv(c, tmp_path, f"launcher={launcher}", "kvstore=dist_sync",
                                                  "workers=2", "launcher.nodes=2", "batch=16", "epochs=400",
                                                  experiment="slurm-killed")),
                            cwd=ROOT, env=env(c), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "/400", timeout=180)  # "epoch   1/400": the job trains
        kill_one_worker(c.host("h3").pids)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 1, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("xp: error: Slurm job ") and "FAILED" in err, err[-2000:]
    assert_killed_line(out, host="h3")  # relayed from the job's output
    assert the_run(c, "slurm-killed").info.status == "FAILED"
    nothing_left(c)


def test_a_single_process_run_is_a_one_node_job(cluster, tmp_path):
    c = cluster
    r = submit(c, tmp_path, "epochs=2", experiment="slurm-one")
    assert r.returncode == 0, said(r)
    run = the_run(c, "slurm-one")  # the submitter's run, filled by the job's process
    assert run.info.status == "FINISHED" and run.data.tags["xp.slurm.state"] == "COMPLETED"
    assert run.data.params["summary.epochs_completed"] == "2" and run.data.metrics["val_accuracy"] > 0.5
    nothing_left(c)


def test_inside_an_allocation_the_job_runs_on_its_nodes(cluster, tmp_path):
    """salloc gives the nodes and runs xp on the login node: xp reads SLURM_* and starts the roles with srun."""
    c = cluster
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", "--time=5", "--quiet",
            *xp_argv(c, tmp_path, "kvstore=dist_sync", "workers=2", "launcher.nodes=2", *EXACT, "batch=24",
                     experiment="slurm-salloc")]
    r = subprocess.run(c.on_launcher(argv), cwd=ROOT, env=env(c), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert "submitted" not in r.stdout and "on h2, h3 over srun" in r.stdout, r.stdout[-2000:]
    run = the_run(c, "slurm-salloc")
    assert run.info.status == "FINISHED" and run.data.tags["xp.launcher"] == "slurm"
    nothing_left(c)


def test_a_job_over_its_time_limit_ends_the_run_failed_with_slurms_reason(cluster, tmp_path):
    c = cluster
    r = submit(c, tmp_path, "kvstore=dist_sync", "workers=2", "launcher.nodes=2", "launcher.time_min=1", "epochs=100000",
               experiment="slurm-timeout", timeout=240)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert err and err[-1].startswith("xp: error: Slurm job ") and "ended TIMEOUT" in err[-1], r.stderr[-2000:]
    run = the_run(c, "slurm-timeout")
    assert run.info.status == "FAILED" and run.data.tags["xp.slurm.state"] == "TIMEOUT"
    nothing_left(c)


@pytest.mark.parametrize("args, fragment", [
    (["launcher.partition=gpu"], "launcher.partition=gpu: no such partition; valid: debug"),
    (["workers=3", "launcher.nodes=3"], "launcher.nodes=3: partition debug has 2 nodes"),
    (["workers=3"], "workers=3: launcher=slurm runs launcher.nodes x launcher.tasks_per_node = 2 x 1 = 2 workers"),
    (["tracking_uri=sqlite:///mlruns/mlflow.db"], "a file on this machine, which the workers on the Slurm job's nodes"),
])
def test_bad_slurm_input_is_one_line_and_nothing_is_submitted(cluster, tmp_path, args, fragment):
    c = cluster
    before = c.slurm(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
    r = submit(c, tmp_path, "kvstore=dist_sync", "workers=2", "launcher.nodes=2", *args, experiment="slurm-bad")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xp: error: ") and fragment in lines[0], r.stderr
    assert c.slurm(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split() == before  # nothing submitted


def test_a_node_taken_away_ends_the_run_failed_and_leaves_no_process(cluster, tmp_path):
    """slurmd on h3 is killed mid-job: Slurm marks the node down and ends the job NODE_FAIL; the run ends FAILED
    with that reason; the job's processes on both nodes end (xp's workers end when their srun session closes)."""
    c = cluster
    proc = subprocess.Popen(c.on_launcher(xp_argv(c, tmp_path, "kvstore=dist_sync", "workers=2", "launcher.nodes=2",
                                                  "epochs=100000", "launcher.time_min=10", experiment="slurm-node")),
                            cwd=ROOT, env=env(c), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "/100000", timeout=120)  # "epoch      1/100000": the job trains
        c.stop_slurmd("h3")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    try:
        assert proc.returncode == 1, err[-2000:]
        assert err.strip().splitlines()[-1].startswith("xp: error: Slurm job ") and "NODE_FAIL" in err, err[-2000:]
        run = the_run(c, "slurm-node")
        assert run.info.status == "FAILED" and run.data.tags["xp.slurm.state"] == "NODE_FAIL"
        nothing_left_on(c, "h2")  # the node that stayed: the job ended there at once
    finally:
        c.start_slurmd("h3")
    # the node comes back: Slurm ends what the lost job left running there (a crashed node kept nothing)
    nothing_left(c)


def nothing_left_on(c, name: str) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not [p for p in c.processes(c.host(name)) if not p.split(" ", 1)[1].startswith(DAEMONS)]:
            return True
        time.sleep(0.5)
    raise AssertionError(f"left on {name}: {c.processes(c.host(name))}")


def sweep_argv(c, tmp_path: Path, *args: str, experiment: str) -> list[str]:
    """python -m xp -m ... with Hydra's submitit launcher: every job (or trial) its own Slurm job."""
    return [sys.executable, "-m", "xp", "-m", "hydra/launcher=submitit_slurm", f"tracking_uri={c.uri}",
            f"hydra.sweep.dir={c.shared}/{experiment}", "hydra.launcher.timeout_min=5", f"experiment={experiment}",
            *args]


def children_of_one_parent(c, experiment: str):
    client = mlflow_client(f"sqlite:///{c.db}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if r.data.tags.get("xp.sweep") == "true"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == len(runs) - 1
    assert {r.data.tags["xp.host"] for r in children} <= {"h2", "h3"}  # each ran on a node, as a Slurm job
    return children


def test_a_sweep_runs_each_job_as_a_slurm_job_under_one_parent(cluster, tmp_path):
    c = cluster
    r = subprocess.run(c.on_launcher(sweep_argv(c, tmp_path, "batch=16,32", "epochs=2", experiment="slurm-sweep")),
                       cwd=ROOT, env=env(c), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    children = children_of_one_parent(c, "slurm-sweep")
    assert sorted(ch.data.params["batch"] for ch in children) == ["16", "32"]
    assert all(ch.info.status == "FINISHED" for ch in children)
    nothing_left(c)


def test_a_study_runs_its_trials_as_slurm_jobs_two_at_a_time(cluster, tmp_path):
    """6 trials, 2 in flight; the study's storage is PostgreSQL on the login node's address (every node reports
    each epoch there for pruning)."""
    import optuna
    import pg

    c = cluster
    server = pg.Server("slurm-pw", host=c.launcher.address, enter=tuple(c.launcher.enter())).start()
    try:
        storage = server.url("optuna")
        argv = sweep_argv(c, tmp_path, "sweep=lr_batch", "sweep.n_trials=6", "sweep.parallel=2",
                          f"sweep.storage={storage}", "epochs=4", experiment="slurm-study")
        r = subprocess.run(c.on_launcher(argv), cwd=ROOT, env=env(c), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, said(r)
        children = children_of_one_parent(c, "slurm-study")
        assert len(children) == 6 and all(ch.info.status == "FINISHED" for ch in children)
        states = sorted(ch.data.tags["optuna.trial_state"] for ch in children)
        assert set(states) <= {"COMPLETE", "PRUNED"} and "COMPLETE" in states, states
        probe = subprocess.run(c.on_launcher([sys.executable, "-c", (
            "import optuna, sys; s = optuna.load_study(study_name='lr_batch', storage=sys.argv[1]); "
            "print(sorted(t.state.name for t in s.trials))"), storage]),
            capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr[-2000:]
        assert probe.stdout.strip() == str(states), (probe.stdout, states)  # Optuna agrees with MLflow
        assert optuna  # the storage is Optuna's own schema, read back through Optuna above
        nothing_left(c)
    finally:
        server.stop()


def test_a_study_on_a_node_local_sqlite_file_is_refused_before_anything_is_submitted(cluster, tmp_path):
    c = cluster
    before = c.slurm(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
    r = subprocess.run(c.on_launcher(sweep_argv(c, tmp_path, "sweep=lr_batch", f"sweep.storage=sqlite:///{tmp_path}/o.db",
                                                experiment="slurm-bad-study")),
                       cwd=ROOT, env=env(c), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"xp: error: sweep.storage=sqlite:///{tmp_path}/o.db: a file "
                                                   "on this machine"), r.stderr
    assert c.slurm(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split() == before


def test_sigterm_to_the_submitter_cancels_the_job(cluster, tmp_path):
    """Ctrl-C or SIGTERM on the login node: scancel, the run KILLED, nothing left on the nodes."""
    import signal

    c = cluster
    proc = subprocess.Popen(c.on_launcher(xp_argv(c, tmp_path, "kvstore=dist_sync", "workers=2", "launcher.nodes=2",
                                                  "epochs=100000", experiment="slurm-cancel")),
                            cwd=ROOT, env=env(c), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "/100000", timeout=120)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert "cancelled Slurm job" in err and err.strip().splitlines()[-1] == "xp: error: terminated (SIGTERM)", err
    run = the_run(c, "slurm-cancel")
    assert run.info.status == "KILLED"
    state = c.slurm(["scontrol", "show", "-o", "job", run.data.tags["xp.slurm.job"]]).stdout
    assert "JobState=CANCELLED" in state, state  # ended by the time xp exits
    nothing_left(c)


# --- a study's slots as Slurm jobs (launcher=slurm): each a long-lived worker, refilled as a trial ends ----------

SMALL = ("study_name: small\nn_trials: {n}\nsampler: random\nsampler_seed: 5\npruner: median\n"
         "pruner_options: {{n_startup_trials: 2, n_warmup_steps: 1}}\n"
         "params:\n  lr: {{type: float, low: 0.001, high: 0.3, log: true}}\n")


def slot_study(c, name: str, n: int, launcher: str, *args: str, study: str = SMALL) -> tuple[list[str], str]:
    """python -m xp -m sweep=small launcher=LAUNCHER (slurm; the scheduler on the login node; its study file, `study`
    with n trials, and SQLite storage in the shared folder, where the test reads them); returns the command line
    and the storage."""
    folder = c.shared / name
    (folder / "sweeps").mkdir(parents=True)
    storage = f"sqlite:///{folder}/optuna.db"
    (folder / "sweeps" / "small.yaml").write_text(study.format(n=n) + f"storage: {storage}\n")
    argv = [sys.executable, "-m", "xp", "-m", "sweep=small", f"launcher={launcher}", f"tracking_uri={c.uri}",
            f"launcher.output_dir={c.shared}", "launcher.poll_s=0.5",
            f"hydra.sweep.dir={folder}/sweep", f"experiment={name}", *args]
    return argv, storage


def study_env(c, name: str) -> dict:
    return {**env(c), "XP_SWEEPS_DIR": str(c.shared / name / "sweeps")}


def worker_jobs(c) -> list[str]:
    """The study worker jobs Slurm knows (any state), as ID NAME STATE NODE lines."""
    return [line for line in c.slurm(["squeue", "-h", "-t", "all", "-o", "%i %j %T %N"]).stdout.splitlines()
            if " xp-slot-" in line]


@conformance("study", "launcher", ["slurm"])
def test_a_study_keeps_one_slurm_job_per_slot_busy_with_trial_after_trial(cluster, launcher):
    """12 trials with pruning on 2 slots: 2 worker jobs (not a job per trial), each taking trials as they free,
    every trial COMPLETE or PRUNED in one study and under one MLflow parent, nothing left in the queue after."""
    import optuna

    c = cluster
    before = set(worker_jobs(c))
    argv, storage = slot_study(c, "slurm-slots", 12, launcher, "sweep.parallel=2", "epochs=6")
    r = subprocess.run(c.on_launcher(argv), cwd=ROOT, env=study_env(c, "slurm-slots"), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, said(r)
    assert "sacct" not in r.stdout + r.stderr  # no batch system bookkeeping on the console
    states = sorted(t.state.name for t in optuna.load_study(study_name="small", storage=storage).trials)
    assert len(states) == 12 and set(states) <= {"COMPLETE", "PRUNED"} and "PRUNED" in states, states
    children = children_of_one_parent(c, "slurm-slots")
    assert len(children) == 12 and {ch.info.status for ch in children} == {"FINISHED"}
    jobs = set(worker_jobs(c)) - before
    assert len(jobs) == 2, jobs  # one long-lived job per slot
    nothing_left(c)


@conformance("population", "launcher", ["slurm"])
def test_a_population_trains_on_two_slot_jobs_each_interval_from_its_sources_exact_weights(cluster, launcher):
    """sweep.search=pbt on 2 slots (a worker job on each node): 4 members, 2 epochs, an interval of 1, the
    commits in the shared folder; each interval on whichever node's slot asked, starting from the bit-equal weights
    its source interval ended with."""
    from test_pbt import POP, check_lineage

    c = cluster
    argv, _ = slot_study(c, "slurm-pbt", 8, launcher, "sweep.parallel=2", "epochs=2",
                         f"checkpoint_dir={c.shared}/slurm-pbt/ckpt", study=POP.replace("{interval}", "1"))
    r = subprocess.run(c.on_launcher(argv), cwd=ROOT, env=study_env(c, "slurm-pbt"), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, said(r)
    ran = check_lineage(f"sqlite:///{c.db}", 2, "slurm-pbt")
    assert len(ran) == 8 and {x.data.tags["xp.host"] for x in ran.values()} == {"h2", "h3"}
    assert "trained no more" not in r.stdout + r.stderr
    nothing_left(c)


@conformance("study", "launcher", ["slurm"])
def test_a_lost_node_loses_only_its_trial_which_is_retried_on_a_new_slot_job(cluster, launcher):
    """The node of the slot's worker job crashes mid-trial (its slurmd and every process of the job killed at
    once): the scheduler retries the trial and submits a job in its place on the other node (the test cluster's
    select/linear gives a job a whole node), and the study ends with all its trials."""
    import optuna

    c = cluster
    argv, storage = slot_study(c, "slurm-lost", 4, launcher, "sweep.parallel=1", "epochs=20", "launcher.time_min=10")
    proc = subprocess.Popen(c.on_launcher(argv), cwd=ROOT, env=study_env(c, "slurm-lost"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    node = None
    try:
        deadline = time.monotonic() + 180
        while node is None:  # the slot's job runs on a node
            running = [line.split()[3] for line in worker_jobs(c) if line.split()[2] == "RUNNING"]
            node = running[0] if running else None
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        wait_for_line(proc, "study: trial ", timeout=300)  # its worker has ended a trial and runs the next
        c.stop_slurmd(node)
        for line in c.processes(c.host(node)):  # the job's processes (slurmstepd's, the worker's) go with it
            try:
                os.kill(int(line.split(" ", 1)[0]), 9)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    try:
        assert proc.returncode == 0, out[-3000:]
        assert "lost its worker (Slurm job" in out and f" on {node} (RUNNING)" in out, out[-3000:]
        trials = optuna.load_study(study_name="small", storage=storage).trials
        done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
        lost = [t for t in trials if t.state.name == "FAIL"]
        assert len(done) == 4 and len(lost) == 1, [t.state.name for t in trials]
        assert any(t.params == lost[0].params and t.system_attrs.get("failed_trial") == lost[0].number for t in done)
        assert not [t for t in trials if t.state.name == "RUNNING"]
        other = ({"h2", "h3"} - {node}).pop()
        assert [line for line in worker_jobs(c) if line.endswith(f" {other}")]  # its replacement ran there
    finally:
        if node is not None:
            c.start_slurmd(node)
    nothing_left(c)


@conformance("study", "launcher", ["slurm"])
def test_ctrl_c_ends_a_slurm_study_and_leaves_the_queue_empty(cluster, launcher):
    import signal

    c = cluster
    from test_scheduler import default_sigint

    argv, storage = slot_study(c, "slurm-stop", 6, launcher, "sweep.parallel=2", "epochs=60")
    proc = subprocess.Popen(c.on_launcher(argv), cwd=ROOT, env=study_env(c, "slurm-stop"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 180
        while running_trial_runs(c, "slurm-stop") < 2:  # both slots' jobs run a trial
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)  # the login node's command: what Ctrl-C sends it
        stopped = time.monotonic()
        queued = lambda: [line for line in worker_jobs(c)  # noqa: E731
                          if line.split()[2] in ("PENDING", "RUNNING", "COMPLETING")]
        while queued() and time.monotonic() < stopped + 30:
            time.sleep(0.2)
        emptied = time.monotonic() - stopped
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130, out[-3000:]
    assert not queued() and emptied < 10, (queued(), emptied)
    assert in_flight(storage) == 0 and "given back to the study" in out, out[-3000:]
    client = mlflow_client(f"sqlite:///{c.db}")
    runs = client.search_runs([client.get_experiment_by_name("slurm-stop").experiment_id])
    assert len(runs) == 3 and {r.info.status for r in runs} == {"KILLED"}  # the parent and the 2 trials' runs
    nothing_left(c)


def running_trial_runs(c, experiment: str) -> int:
    try:
        client = mlflow_client(f"sqlite:///{c.db}")
        runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    except Exception:  # not created yet
        return 0
    return sum(r.info.status == "RUNNING" and "optuna.trial_number" in r.data.tags for r in runs)


def in_flight(storage: str) -> int:
    """The study's RUNNING trials (0 before the study exists)."""
    try:
        return sum(t.state.name == "RUNNING" for t in load_study("small", storage).trials)
    except KeyError:  # not created yet
        return 0
