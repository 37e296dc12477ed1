"""Distributed runs on real engines, all on 127.0.0.1: MXNet's parameter server (ps-lite) and Horovod (gloo).

Exactness: N workers with B/N samples each compute the parameters one process computes with B.
Failure: a dead or stalled worker fails the whole job, names its rank, ends the MLflow run
FAILED and leaves no process behind. Bad setups fail before anything starts, with exit 2.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from conformance import conformance
from conftest import compose_config, metric_by_step, mlflow_runs, run_xp, said, wait_for_line, xp_process
from xp.errors import ConfigError
from xp.run.backend_plan import plan_and_backend
from xp.launching.engine import Spec, free_port
from xp.launching.launcher import Ssh, launcher_for
from xp.run.train import fit

# 198 training images: 6 steps of a global batch of 32
EXACT = ["epochs=1", "dataset.val_fraction=0.89", "lr_schedule=constant"]


def trained(backend: str, *overrides: str) -> tuple[object, list[dict[str, float]]]:
    """One process, trained in this one: the backend and its epochs' metrics."""
    plan, cls = plan_and_backend(compose_config(f"backend={backend}", *overrides))
    b = cls()
    return b, fit(plan, b, [])


def one_process(backend: str, *overrides: str) -> dict[str, np.ndarray]:
    return trained(backend, *overrides)[0].get_params()


def one_process_accuracy(backend: str, *overrides: str) -> float:
    """The last epoch's val_accuracy: an elastic run's reference (workers that average their gradients over the
    same global batch train what one process does)."""
    return trained(backend, *overrides)[1][-1]["val_accuracy"]


def assert_same_params(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def distributed(tmp_path, store, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / "params.npz"
    r = run_xp(tmp_path, store, *args, f"save_params={out}", timeout=240)
    assert r.returncode == 0, said(r)
    return dict(np.load(out)), r


def the_run(store):
    _, runs = mlflow_runs(store)
    assert len(runs) == 1, [r.info.run_name for r in runs]  # the launcher's run; no worker opened another
    return runs[0]


@pytest.mark.slow
@conformance("exact", "launcher, backend, kvstore", [("local", "gluon", "dist_sync"), ("local", "module", "dist_sync"),
                                                     ("local", "gluon", "dist_device_sync")])
def test_parameter_server_workers_compute_what_one_process_computes(tmp_path, store, launcher, backend, kvstore):
    want = one_process(backend, *EXACT, "batch=32")
    got, r = distributed(tmp_path, store, f"launcher={launcher}", f"backend={backend}", *EXACT, "batch=16",
                         "workers=2", f"kvstore={kvstore}")
    assert_same_params(got, want)
    run = the_run(store)
    assert run.info.status == "FINISHED"
    m, p = run.data.metrics, run.data.params
    assert p["derived.global_batch"] == "32" and p["derived.workers"] == "2"
    assert p["derived.effective_lr"] == p["lr"]  # lr_ref_batch 32 = the global batch: no scaling
    # throughput is the total across workers, each worker's own figure logged beside it
    assert m["worker0_throughput_samples_per_s"] > 0 and m["worker1_throughput_samples_per_s"] > 0
    assert m["throughput_samples_per_s"] == pytest.approx(m["worker0_throughput_samples_per_s"] + m["worker1_throughput_samples_per_s"])
    assert "| 2 " in r.stdout.split("| lenet |")[1][:20]  # the table's devices column counts workers


@pytest.mark.slow
@conformance("exact", "launcher, api", [("local", "gluon"), ("local", "module")])
def test_horovod_workers_compute_what_one_process_computes(tmp_path, store, launcher, api):
    reference = "gluon" if api == "gluon" else "module"
    want = one_process(reference, *EXACT, "batch=32")
    got, r = distributed(tmp_path, store, f"launcher={launcher}", "backend=horovod", f"backend.api={api}", *EXACT,
                         "batch=16", "workers=2")
    assert_same_params(got, want)
    run = the_run(store)
    assert run.info.status == "FINISHED" and run.data.tags["xp.engine"] == "horovod"
    assert run.data.params["version.horovod"] == "0.28.1"
    m = run.data.metrics
    assert m["throughput_samples_per_s"] == pytest.approx(m["worker0_throughput_samples_per_s"] + m["worker1_throughput_samples_per_s"])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gluon", "module"])
def test_dist_async_updates_on_the_servers_with_the_schedule(tmp_path, store, backend):
    """Servers run the optimizer: from epoch 3 the schedule's lr is ~0, and without momentum nothing moves.

    (Epoch 3's first pulls may still bring epoch 2's last updates: asynchronous workers evaluate weights
    that lag the servers' by the updates in flight. Epochs 3 and 4 see the same frozen weights.)
    """
    r = run_xp(tmp_path, store, f"backend={backend}", "kvstore=dist_async", "workers=2", "batch=16", "epochs=4",
               "lr_schedule=step", "lr_steps=[2]", "lr_decay=1e-9", "momentum=0", "lr=0.1", timeout=240)
    assert r.returncode == 0, said(r)
    run = the_run(store)
    client = mlflow_runs(store)[0]
    loss = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "val_loss"), key=lambda m: m.step)]
    acc = client.get_metric_history(run.info.run_id, "val_accuracy")
    assert len(loss) == 4 and max(m.value for m in acc) > 0.85
    assert abs(loss[1] - loss[0]) > 1e-2  # trained in epoch 2
    assert abs(loss[3] - loss[2]) < 1e-5  # lr 5e-11 from epoch 3: the servers applied xp's schedule
    m = run.data.metrics
    assert m["throughput_samples_per_s"] == pytest.approx(m["worker0_throughput_samples_per_s"] + m["worker1_throughput_samples_per_s"])
    assert run.data.params["derived.effective_lr"] == "0.05"  # 0.1 x 16/32: an update sees one worker's batch


def test_the_learning_rate_follows_the_global_batch():
    cfg = compose_config("batch=16", "workers=4", "kvstore=dist_sync", "lr=0.1", "lr_ref_batch=32")
    plan, _ = plan_and_backend(cfg)
    assert (plan.worker_batch, plan.global_batch) == (16, 64)
    assert plan.effective_lr == pytest.approx(0.2)  # 0.1 x 64/32, not x 16/32
    hv, _ = plan_and_backend(compose_config("batch=16", "workers=4", "backend=horovod", "lr=0.1", "lr_ref_batch=32"))
    assert hv.effective_lr == pytest.approx(0.2)


# --- failures ---------------------------------------------------------------------------------
def _ranks_until(proc: subprocess.Popen, needle: str, n: int, timeout: float = 120) -> dict[int, str]:
    """Read the job's output until `needle`, collecting the workers' "worker rank R is pid P" lines."""
    ranks: dict[int, str] = {}
    lines: list[str] = []  # all of them, for a job that fails first: its workers' errors are among them
    while True:
        try:
            line = wait_for_line(proc, "", timeout=timeout)  # any line
        except AssertionError as e:
            raise AssertionError(f"{e}\nthe job's output before:\n{''.join(lines)[-6000:]}") from None
        lines.append(line)
        for m in re.finditer(r"xp: worker rank (\d+) is pid (\d+)", line):
            ranks[int(m.group(2))] = m.group(1)
        if needle in line:
            assert len(ranks) == n, ranks
            return ranks


def _fail_one_worker(tmp_path, store, how: signal.Signals, *args: str) -> tuple[str, str, float, list]:
    with xp_process(tmp_path, store, "epochs=400", "batch=16", "workers=2", *args) as proc:
        ranks = _ranks_until(proc, "epoch   1/400", 2)
        launcher = psutil.Process(proc.pid)
        victim, rank = sorted(ranks.items())[1]
        started = [launcher, *launcher.children(recursive=True)]
        listening = [c.laddr.ip for p in started for c in _connections(p) if c.status == psutil.CONN_LISTEN]
        assert listening and set(listening) == {"127.0.0.1"}, listening  # every server xp started: loopback only
        os.kill(victim, how)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    assert proc.returncode == 1, err
    return rank, err, took, started


def _connections(p: psutil.Process) -> list:
    try:
        return p.net_connections(kind="inet")
    except psutil.Error:
        return []


def _nothing_left(started: list[psutil.Process]) -> None:
    time.sleep(0.5)
    # (the user's tracking service, xp.trackingd, outlives the command that started it by design: the first
    # test of a session to log starts it)
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
             and "xp.trackingd" not in p.cmdline()]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


@pytest.mark.slow
@conformance("killed", "launcher, engine", [("local", "kvstore=dist_sync"), ("local", "backend=horovod"),
                                            ("local", "backend=torch")])
def test_a_killed_worker_fails_the_job_naming_its_rank(tmp_path, store, launcher, engine):
    rank, err, took, started = _fail_one_worker(tmp_path, store, signal.SIGKILL, engine, f"launcher={launcher}")
    last = err.strip().splitlines()[-1]
    assert last == (f"xp: error: worker rank {rank} was killed by signal 9; the other processes were stopped "
                    "(its error is in the log above)")
    assert took < 45  # (the default dist_timeout_s is 300)
    assert the_run(store).info.status == "FAILED"
    _nothing_left(started)


@pytest.mark.slow
def test_a_worker_that_aborts_says_where_its_python_was(tmp_path, store):
    # a C++ library's abort (gloo's uncaught error, a failed CHECK) leaves no Python traceback of its own
    rank, err, took, started = _fail_one_worker(tmp_path, store, signal.SIGABRT, "kvstore=dist_sync")
    assert err.strip().splitlines()[-1].startswith(f"xp: error: worker rank {rank} was killed by signal 6;")
    assert "Fatal Python error: Aborted" in err and 'File "' in err, err[-3000:]
    _nothing_left(started)


@pytest.mark.slow
def test_a_stalled_worker_fails_the_job_after_dist_timeout(tmp_path, store):
    rank, err, took, started = _fail_one_worker(tmp_path, store, signal.SIGSTOP, "kvstore=dist_sync",
                                                "dist_timeout_s=20")  # (also the workers' start: 8 s was
    assert f"xp: error: worker rank {rank} made no progress for" in err  # short of it beside other tests)
    assert 20 <= took < 80  # its dist_timeout_s, not the default 300
    assert the_run(store).info.status == "FAILED"
    _nothing_left(started)


@pytest.mark.slow
def test_a_horovod_worker_that_lags_past_gloos_own_30_s_but_within_dist_timeout_does_not_fail_the_job(tmp_path,
                                                                                                     store):
    # CI once lost a Horovod job across hosts on a loaded machine: gloo gave up on a peer after its default 30 s,
    # though the job allowed 120 (dist_timeout_s). A paused worker lags as long as the test says.
    with xp_process(tmp_path, store, "backend=horovod", "epochs=2", "batch=16", "workers=2",
                    "dist_timeout_s=120") as proc:
        ranks = _ranks_until(proc, "epoch 1/2", 2)
        victim = sorted(ranks)[1]
        os.kill(victim, signal.SIGSTOP)
        try:
            time.sleep(35)  # the lag: past gloo's default (30 s), well within dist_timeout_s
        finally:
            os.kill(victim, signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    assert the_run(store).info.status == "FINISHED"


@pytest.mark.slow
def test_a_port_in_use_is_refused_before_anything_starts(tmp_path, store):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_xp(tmp_path, store, "kvstore=dist_sync", "workers=2", f"port={port}", timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"xp: error: port={port}: 127.0.0.1:{port} is not free (Address already in use); "
                                "choose another port or leave port=null for a free one")
    assert mlflow_runs(store)[1] == []


@pytest.mark.slow
def test_an_unreachable_scheduler_is_a_clear_error(tmp_path, store):
    port = free_port()  # nothing listens there
    env = {"XP_DIST_WORKER": "1", "DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
           "XP_CONNECT_TIMEOUT_S": "2"}
    r = run_xp(tmp_path, store, "kvstore=dist_sync", "workers=2", env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"xp: error: cannot reach the parameter-server scheduler at 127.0.0.1:{port} within 2 s "
        "(DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT); is it running and reachable?")
    assert "Traceback" not in r.stderr
    assert all(run.info.status != "RUNNING" for run in mlflow_runs(store)[1])


@pytest.mark.slow
def test_a_missing_horovod_build_is_a_clear_error(tmp_path, store):
    fake = tmp_path / "site" / "horovod"  # a horovod without its MXNet extension, first on the path
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    r = run_xp(tmp_path, store, "backend=horovod", "workers=2", timeout=120,
               env={"PYTHONPATH": str(fake.parent)})
    assert r.returncode == 2
    assert r.stderr.strip().startswith("xp: error: backend=horovod: Horovod with MXNet support is not installed "
                                       "(ModuleNotFoundError: No module named 'horovod.mxnet')")
    assert len(r.stderr.strip().splitlines()) == 1
    assert mlflow_runs(store)[1] == []


# --- plans and cluster commands (no remote process starts) --------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["workers=2"], "workers=2: several worker processes need a distributed kvstore"),
    (["backend=horovod", "cpu_devices=2"], "backend=horovod: one device per worker process (2 asked); use workers=2"),
    (["backend=horovod", "kvstore=dist_sync"], "kvstore=dist_sync: backend=horovod allreduces gradients itself"),
    (["backend=horovod", "backend.api=symbol"], "backend.api='symbol': must be one of gluon, module"),
    (["kvstore=dist_sync", "port=80"], "port=80: must be an integer from 1024 to 65535"),
    (["kvstore=dist_sync", "dist_timeout_s=0"], "dist_timeout_s=0"),
])
def test_distributed_settings_are_validated(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launcher_for(plan_and_backend(compose_config(*overrides))[0])


def test_hosts_files_and_placement():
    from xp.launching.hosts import HostSlots, parse_hosts

    hosts = parse_hosts("10.0.0.1\n# a comment\n10.0.0.2:2\nnode3 slots=3\n\n10.0.0.1:1\n", "launcher.hosts_file=f")
    assert hosts == [HostSlots("10.0.0.1", 2), HostSlots("10.0.0.2", 2), HostSlots("node3", 3)]
    spec = Spec(["kvstore=dist_sync"], workers=5, servers=2, launcher=Ssh(), hosts=hosts, host_ip="10.0.0.9")
    assert spec.placement() == [("10.0.0.1", 2), ("10.0.0.2", 2), ("node3", 1)]  # slots filled in order
    with pytest.raises(ConfigError, match=r"workers: 8 processes need 8 slots; the hosts list 7"):
        Spec([], workers=8, launcher=Ssh(), hosts=hosts).placement()
    with pytest.raises(ConfigError, match=r"'10.0.0.4:x' is not HOST, HOST:SLOTS"):
        parse_hosts("10.0.0.4:x\n", "launcher.hosts_file=f")


def test_the_parameter_server_roles_across_hosts():
    """The scheduler here on host_ip; servers round robin over the hosts; workers fill the hosts' slots."""
    from xp.launching.hosts import HostSlots
    from xp.launching.job import Job
    from xp.mx.pslite import PsLite

    hosts = [HostSlots("10.0.0.1", 1), HostSlots("10.0.0.2", 2)]
    spec = Spec(["kvstore=dist_sync", "workers=3"], workers=3, servers=2, launcher=Ssh(), hosts=hosts,
                host_ip="127.0.0.1", interface="eth0", port=9000)
    engine = PsLite(spec)
    roles = engine.roles(Job(engine))
    assert [(r.name, r.host) for r in roles] == [("scheduler", None), ("server 0", "10.0.0.1"),
                                                 ("server 1", "10.0.0.2"), ("worker 0", "10.0.0.1"),
                                                 ("worker 1", "10.0.0.2"), ("worker 2", "10.0.0.2")]
    assert roles[0].env["DMLC_NODE_HOST"] == "127.0.0.1" and roles[0].env["DMLC_PS_ROOT_PORT"] == "9000"
    assert all(r.env["DMLC_PS_ROOT_URI"] == "127.0.0.1" and r.env["DMLC_INTERFACE"] == "eth0" for r in roles[1:])
    assert roles[3].argv[-2:] == ["kvstore=dist_sync", "workers=3"] and roles[3].worker
    assert not roles[1].worker and engine.hosts() == ["10.0.0.1", "10.0.0.2"]


def test_every_ssh_xp_makes_takes_the_ssh_settings(tmp_path):
    from xp.launching.hosts import SSH

    ssh = SSH(config=str(tmp_path / "cfg"), identity=None, connect_timeout_s=3)
    argv = ssh.argv("10.0.0.2", "true")
    assert argv[:3] == ["ssh", "-F", str(tmp_path / "cfg")] and "ConnectTimeout=3" in argv and "BatchMode=yes" in argv
    assert argv[-2:] == ["10.0.0.2", "true"]


# --- elastic: workers join and leave, the global batch stays fixed -----------------------------------
def _epoch_values(store, name: str) -> list[float]:
    client, runs = mlflow_runs(store)
    assert len(runs) == 1
    return metric_by_step(client, runs[0].info.run_id, name)


def _elastic_args(discovery: Path, *more: str) -> list[str]:
    # global batch 48: 24 per worker with 2 workers, 16 with 3
    return ["kvstore=dist_sync", "batch=24", "workers=2", "elastic.enabled=true", f"elastic.discovery={discovery}",
            "elastic.poll_s=0.2", "elastic.max_workers=3", "dist_timeout_s=120", *more]


@pytest.mark.slow
def test_workers_join_and_leave_at_epoch_boundaries_with_the_same_accuracy(tmp_path, store):
    fixed_acc = one_process_accuracy("gluon", "batch=48", "epochs=6")  # the elastic run's global batch

    discovery = tmp_path / "hosts"
    discovery.write_text("127.0.0.1:2\n")
    with xp_process(tmp_path, store, *_elastic_args(discovery), "epochs=6") as proc:
        wait_for_line(proc, "epoch 1/6", timeout=120)
        discovery.write_text("127.0.0.1:2\n127.0.0.1:1\n")  # a third worker joins
        wait_for_line(proc, "epoch 3/6", timeout=120)
        discovery.write_text("127.0.0.1:2\n")  # and leaves again
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    workers = _epoch_values(store, "workers")
    assert len(workers) == 6 and workers[0] == 2 and 3 in workers and workers[-1] == 2, workers
    assert workers.index(3) >= 1
    client, runs = mlflow_runs(store)
    run = runs[0]
    assert run.info.status == "FINISHED"
    m = run.data.metrics
    assert m["worker_hours"] > 0 and "cost_usd" not in m  # hardware=local has no price: no cost, not $0
    acc = _epoch_values(store, "val_accuracy")
    assert abs(acc[-1] - fixed_acc) <= 0.01, (acc, fixed_acc)
    assert run.data.params["derived.global_batch"] == "48"
    assert _epoch_values(store, "elastic.launch_workers") == [2, 3, 2]  # three jobs: 2, then 3, then 2 workers
    # the report shows the worker count over time
    from xp.report.build import main as report_main

    assert report_main(["--tracking-uri", store, "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Elastic runs" in md and " ".join(f"{w:g}" for w in workers) in md
    assert (tmp_path / "report" / "workers.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_worker_lost_mid_epoch_rolls_back_and_training_goes_on(tmp_path, store):
    discovery = tmp_path / "hosts"
    discovery.write_text("127.0.0.1:3\n")
    with xp_process(tmp_path, store, *_elastic_args(discovery), "epochs=40") as proc:
        wait_for_line(proc, "epoch  2/40", timeout=120)
        launcher = psutil.Process(proc.pid)
        victims = [c for c in launcher.children(recursive=True)
                   if "xp" in c.cmdline() and c.environ().get("DMLC_ROLE") == "worker"]
        assert len(victims) == 3
        os.kill(victims[-1].pid, signal.SIGKILL)
        started = [launcher, *launcher.children(recursive=True)]
        out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    assert "rolling back to epoch" in out and "going on without the lost worker" in out
    workers = _epoch_values(store, "workers")
    assert len(workers) == 40 and workers[0] == 3 and workers[-1] == 2, workers  # 48 = 2 x 24
    run = mlflow_runs(store)[1][0]
    assert run.info.status == "FINISHED" and run.data.metrics["elastic.restarts"] == 1
    assert _epoch_values(store, "val_accuracy")[-1] > 0.9
    _nothing_left(started)


def test_discovery_and_worker_counts():
    from xp.launching.elastic import usable

    assert usable(3, 1, 8, 48, 1) == 3
    assert usable(5, 1, 8, 48, 1) == 4  # 5 does not divide 48: one waits as a spare
    assert usable(3, 1, 2, 48, 1) == 2  # max_workers
    assert usable(1, 2, 8, 48, 1) is None  # below min_workers
    assert usable(3, 1, 8, 48, 2) == 3 and usable(5, 1, 8, 48, 2) == 4  # 2 devices each: 48 / (n x 2)


def test_discovery_sources(tmp_path):
    from xp.launching.elastic import read_slots

    f = tmp_path / "hosts"
    f.write_text("127.0.0.1:2\n# a comment\nlocalhost\n\n")
    assert read_slots(str(f)) == 3
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1:4\n")
    script.chmod(0o755)
    assert read_slots(str(script)) == 4
    f.write_text("10.1.2.3:8\n")
    with pytest.raises(ConfigError, match="is not this machine"):
        read_slots(str(f))
    with pytest.raises(ConfigError, match="cannot read it"):
        read_slots(str(tmp_path / "missing"))


def test_torchruns_summary_keeps_every_failure_root_cause_first():
    """torchrun lists the failures it saw, then the first one (its "root cause"): a peer that exited because
    the killed rank went may come first there; the job reads them all and names a killed one before it."""
    from xp.pt.torchrun import Torchrun

    summary = ["Failures:", "[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 42)",
               "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
               "  exitcode  : 1 (pid: 41)"]
    exits, state = {}, {}
    for line in summary:
        Torchrun.failed(None, line, exits, state)
    assert list(exits.items()) == [(0, 1), (1, -9)]


def test_horovodruns_own_kills_after_a_failure_are_not_failures():
    """horovodrun reports each process's exit as it sees it, and once one failed it kills the rest (137): a rank
    that raised names itself, not the peer horovodrun killed (lines as horovodrun 0.28 printed them)."""
    from xp.mx.horovodrun import Horovod

    lines = ["[1]<stderr>:xp: error: training failed: MXNetError: Horovod has been shut down.",
             "Process 1 exit with status code 1.", "Terminating remaining workers after failure of Process 1.",
             "Process 0 exit with status code 137."]
    exits, state = {}, {}
    for line in lines:
        Horovod.failed(None, line, exits, state)
    assert exits == {1: 1}
    killed_first = ["Process 1 exit with status code 137.", "Process 0 exit with status code 1.",
                    "Terminating remaining workers after failure of Process 0."]  # a rank killed by the system
    exits, state = {}, {}
    for line in killed_first:
        Horovod.failed(None, line, exits, state)
    assert exits == {1: 137, 0: 1}  # the job's failure names the killed one first (LaunchedJob._failure)
