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

from conftest import ROOT
from test_distributed import EXACT, assert_same_params, one_process

pytestmark = [pytest.mark.slow, pytest.mark.multihost]


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


def submit(c, tmp_path: Path, *args: str, experiment: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """python -m xp launcher=slurm on the login node h1."""
    given = {a.split("=", 1)[0] for a in args}
    settings = [a for a in ("launcher=slurm", "network_interface=eth0", f"tracking_uri={c.uri}",
                            f"slurm.output_dir={c.shared}", "slurm.poll_s=0.5", "dist_timeout_s=120")
                if a.split("=", 1)[0] not in given] + [f"experiment={experiment}", f"hydra.run.dir={tmp_path}/run"]
    env = {**os.environ, **c.env, "PYTHONUNBUFFERED": "1"}
    for k in ("MLFLOW_TRACKING_URI", "XP_PARENT_RUN_ID", "XP_RUN_ID", "XP_COMMAND"):
        env.pop(k, None)
    return subprocess.run(c.on_launcher([sys.executable, "-m", "xp", *settings, *args]), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def the_run(c, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{c.db}")
    exp = client.get_experiment_by_name(experiment)
    found = [] if exp is None else client.search_runs([exp.experiment_id])
    assert len(found) == 1, [r.info.run_name for r in found]  # the submitter's run; no worker opened another
    return found[0]


def nothing_left(c) -> None:
    deadline = time.monotonic() + 20
    while True:
        left = {h.name: [p for p in c.processes(h) if "slurm" not in p and "munged" not in p] for h in c.workers}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), left
    assert "xp-" not in c.slurm(["squeue", "-h", "-o", "%j"]).stdout  # no job of xp's queued or running


@pytest.mark.parametrize("engine, args, reference", [
    ("ps-lite", ["backend=gluon", "kvstore=dist_sync"], "gluon"),
    ("torchrun", ["backend=torch"], "torch"),
    ("horovod", ["backend=horovod"], "gluon"),
])
def test_a_2_node_job_from_the_login_node_computes_what_one_process_computes(cluster, tmp_path, engine, args,
                                                                             reference):
    c, experiment = cluster, f"slurm-{engine}"
    want = one_process(reference, *EXACT, "batch=48")
    out = c.shared / f"{engine}.npz"
    r = submit(c, tmp_path, *args, *EXACT, "workers=2", "slurm.nodes=2", "batch=24", f"save_params={out}",
               experiment=experiment)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "submitted Slurm job" in r.stdout and "epoch 1/1" in r.stdout  # the job's output, relayed
    assert_same_params(dict(np.load(out)), want)
    run = the_run(c, experiment)
    assert run.info.status == "FINISHED" and run.data.tags["xp.slurm.state"] == "COMPLETED"
    assert run.data.tags["xp.launcher"] == "slurm" and run.data.params["derived.global_batch"] == "48"
    nothing_left(c)


def test_a_job_over_its_time_limit_ends_the_run_failed_with_slurms_reason(cluster, tmp_path):
    c = cluster
    r = submit(c, tmp_path, "kvstore=dist_sync", "workers=2", "slurm.nodes=2", "slurm.time_min=1", "epochs=100000",
               experiment="slurm-timeout", timeout=240)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert err and err[-1].startswith("xp: error: Slurm job ") and "ended TIMEOUT" in err[-1], r.stderr[-2000:]
    run = the_run(c, "slurm-timeout")
    assert run.info.status == "FAILED" and run.data.tags["xp.slurm.state"] == "TIMEOUT"
    nothing_left(c)


@pytest.mark.parametrize("args, fragment", [
    (["slurm.partition=gpu"], "slurm.partition=gpu: no such partition; valid: debug"),
    (["workers=3", "slurm.nodes=3"], "slurm.nodes=3: partition debug has 2 nodes"),
    (["workers=3"], "workers=3: launcher=slurm runs slurm.nodes x slurm.tasks_per_node = 2 x 1 = 2 workers"),
    (["tracking_uri=sqlite:///mlruns/mlflow.db"], "a file on this machine, which the workers on the Slurm job's nodes"),
])
def test_bad_slurm_input_is_one_line_and_nothing_is_submitted(cluster, tmp_path, args, fragment):
    c = cluster
    before = c.slurm(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
    r = submit(c, tmp_path, "kvstore=dist_sync", "workers=2", "slurm.nodes=2", *args, experiment="slurm-bad")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xp: error: ") and fragment in lines[0], r.stderr
    assert c.slurm(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split() == before  # nothing submitted
