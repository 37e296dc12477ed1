"""Across hosts for real: ps-lite, Horovod and torchrun jobs launched over ssh on network-namespace hosts.

The hosts (tests/hosts.py): h1 is the launching machine (the launcher runs in its network namespace),
h2..h4 are worker hosts with their own sshd, hostname and private /tmp. An MLflow tracking server on h1's
address serves every host; the tests read its SQLite file directly. Every test lists each host's processes
at the end: nothing the job started may be left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nsenter_launcher
from conformance import conformance, retried, study_trials, wait_for
from conftest import ROOT, metric_by_step, mlflow_client, said, unless_given, wait_for_line
from test_distributed import EXACT, assert_same_params, one_process, one_process_accuracy

pytestmark = [pytest.mark.slow, pytest.mark.multihost]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import hosts

    why = hosts.requirements()
    if why:
        pytest.fail(why)  # CI runs as root with the packages ./dev.sh installs: a missing piece is a failure
    with hosts.Cluster(4) as c:
        c.db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
        c.uri = c.mlflow_server(c.db)
        # where every host sees it: a launched worker composes its command line, launcher=nsenter included
        c.nsenter_env = nsenter_launcher.install(c.shared / "nsenter", c)
        yield c


def xp_on_launcher(c, tmp_path: Path, *args: str, experiment: str) -> list[str]:
    """python -m xp on h1 with the cluster's launch settings (an argument with the same key replaces one;
    launcher=nsenter: the fixture launcher, its variables set on the command)."""
    ssh = [f"launcher.config={c.ssh_config}"] if "launcher=nsenter" not in args else []  # (its own settings)
    settings = unless_given(("launcher=ssh", f"host_ip={c.launcher.address}", "network_interface=eth0", *ssh,
                             f"tracking_uri={c.uri}"), args)
    variables = [f"{k}={v}" for k, v in c.nsenter_env.items()] if "launcher=nsenter" in args else []
    return c.on_launcher(["env", *variables, sys.executable, "-m", "xp", *settings, f"experiment={experiment}", *args,
                          f"hydra.run.dir={tmp_path}/run"])


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    for k in ("MLFLOW_TRACKING_URI", "XP_PARENT_RUN_ID"):
        e.pop(k, None)
    return e


def runs(c, experiment: str):
    client = mlflow_client(f"sqlite:///{c.db}")
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


def nothing_left(c) -> None:
    """No process of any job on any worker host, and none on the launcher but its MLflow server."""
    deadline = time.monotonic() + 15
    while True:
        left = {h.name: c.processes(h) for h in c.workers}
        left["h1"] = c.processes(c.launcher)
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), left


# --- the same experiment on three engines, across 2 and 3 hosts ------------------------------------------
ENGINES = {
    "ps-lite": ["backend=gluon", "kvstore=dist_sync"],
    "horovod": ["backend=horovod"],
    "torchrun": ["backend=torch"],
}


@conformance("exact", "launcher, engine, n_hosts", [
    ("ssh", "ps-lite", 2), ("ssh", "ps-lite", 3), ("ssh", "horovod", 2), ("ssh", "horovod", 3), ("ssh", "torchrun", 2),
    ("ssh", "torchrun", 3), ("nsenter", "ps-lite", 2), ("nsenter", "horovod", 2), ("nsenter", "torchrun", 2)])
def test_workers_on_other_hosts_compute_what_one_process_computes(cluster, tmp_path, launcher, engine, n_hosts):
    c = cluster
    backend = ENGINES[engine][0].split("=")[1]
    reference = {"horovod": "gluon"}.get(backend, backend)
    global_batch = 48
    want = one_process(reference, *EXACT, f"batch={global_batch}")
    names = [h.name for h in c.workers[:n_hosts]]
    hosts_file = c.hosts_file(tmp_path / "hosts", names)
    out = c.shared / f"{launcher}-{engine}-{n_hosts}.npz"
    experiment = f"exact-{launcher}-{engine}-{n_hosts}"
    r = subprocess.run(xp_on_launcher(c, tmp_path, f"launcher={launcher}", *ENGINES[engine], *EXACT,
                                      f"launcher.hosts_file={hosts_file}",
                                      f"workers={n_hosts}", f"batch={global_batch // n_hosts}", f"save_params={out}",
                                      "dist_timeout_s=120", experiment=experiment),
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert_same_params(dict(np.load(out)), want)
    client, found = runs(c, experiment)
    assert len(found) == 1, [x.info.run_name for x in found]  # the launcher's run; no worker opened another
    run = found[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["derived.global_batch"] == str(global_batch)
    assert run.data.tags["xp.hosts"] == ",".join(c.host(n).address for n in names)
    assert len(metric_by_step(client, run.info.run_id, "val_accuracy")) == 1  # per-epoch metrics from rank 0
    # rank 0's log reached the launcher, marked with its host (horovodrun marks its rank)
    marks = [f"[{c.host(n).address}] " for n in names] if engine != "horovod" else ["[0]<stdout>:"]
    assert any(line.startswith(tuple(marks)) for line in r.stdout.splitlines() if "epoch 1/1 " in line), \
        r.stdout[-2000:]
    nothing_left(c)


# --- failures ------------------------------------------------------------------------------------------
def _remote_workers(c, host) -> list[int]:
    """pids of the xp worker processes on a host (python -m xp with the job's id)."""
    found = []
    for line in c.processes(host):
        pid, cmd = line.split(" ", 1)
        if " -m xp " in cmd + " " and "xp.launching.remote" not in cmd:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if b"DMLC_ROLE=worker" in environ:
                found.append(int(pid))
    return found


@conformance("killed", "launcher, how", [pytest.param("ssh", signal.SIGKILL, id="ssh-killed"),
                                         pytest.param("ssh", signal.SIGSTOP, id="ssh-stopped"),
                                         pytest.param("nsenter", signal.SIGKILL, id="nsenter-killed")])
def test_a_remote_worker_that_dies_or_stalls_fails_the_job_naming_rank_and_host(cluster, tmp_path, launcher, how):
    c = cluster
    hosts_file = c.hosts_file(tmp_path / "hosts", ["h2", "h3"])
    experiment = f"fail-{launcher}-{how.name}"
    timeout_s = 20
    proc = subprocess.Popen(xp_on_launcher(c, tmp_path, f"launcher={launcher}", "kvstore=dist_sync", "workers=2",
                                           "batch=16", "epochs=400",
                                           f"launcher.hosts_file={hosts_file}", f"dist_timeout_s={timeout_s}",
                                           experiment=experiment),
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "epoch   2/400", timeout=120)
        victim = c.host("h3")
        pids = _remote_workers(c, victim)
        assert len(pids) == 1, c.processes(victim)
        os.kill(pids[0], how)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("xp: error: worker rank ") and f"on host {victim.address}" in line, err[-2000:]
    assert ("was killed by signal 9" if how == signal.SIGKILL else "made no progress") in line
    assert took < timeout_s + 30, took  # within dist_timeout_s and the ending, not conf's 300 s
    _, found = runs(c, experiment)
    assert [x.info.status for x in found] == ["FAILED"]
    nothing_left(c)


def test_the_hosts_end_the_job_when_the_launcher_dies(cluster, tmp_path):
    """SIGKILL the launching process: its ssh sessions close, and every host ends what the job started there;
    its local roles (the scheduler) end with it."""
    c = cluster
    hosts_file = c.hosts_file(tmp_path / "hosts", ["h2", "h3"])
    proc = subprocess.Popen(xp_on_launcher(c, tmp_path, "kvstore=dist_sync", "workers=2", "batch=16", "epochs=400",
                                           f"launcher.hosts_file={hosts_file}", experiment="launcher-killed"),
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "epoch   2/400", timeout=120)
        assert all(_remote_workers(c, c.host(n)) for n in ("h2", "h3"))
        proc.kill()  # ip netns exec runs python in its place: this is the launcher
        proc.wait(timeout=30)
        nothing_left(c)  # the hosts' processes and the scheduler here (the kernel ends it with its launcher)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# --- bad input: one line, exit 2, nothing started, no run left RUNNING -------------------------------------
@pytest.mark.parametrize("case", ["unreachable", "wrong key", "no checkout", "foreign address", "local store",
                                  "no interface"])
def test_bad_multihost_setups_fail_before_anything_starts(cluster, tmp_path, case):
    c = cluster
    hosts_file = c.hosts_file(tmp_path / "hosts", ["h2", "h3"])
    args = ["kvstore=dist_sync", "workers=2", f"launcher.hosts_file={hosts_file}"]
    experiment, want = f"bad-{case.replace(' ', '-')}", ""
    if case == "unreachable":
        (tmp_path / "hosts").write_text(f"{c.host('h2').address}:1\n{c.subnet}.99:1\n")  # nothing there
        args += ["launcher.connect_timeout_s=2"]
        want = f"host {c.subnet}.99: ssh failed"
    elif case == "wrong key":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
        cfg = tmp_path / "ssh_config"
        cfg.write_text(c.ssh_config.read_text().replace(str(c.key), str(tmp_path / "other")))
        args += [f"launcher.config={cfg}"]
        want = "Permission denied"
    elif case == "no checkout":
        (tmp_path / "hosts").write_text(f"{c.host('h2').address}:1\n{c.host('h4').address}:1\n")
        args += []
        want = f"host {c.host('h4').address}: no xp checkout at {ROOT}"
    elif case == "foreign address":
        args += [f"host_ip={c.subnet}.77"]
        want = f"host_ip={c.subnet}.77: not an address of this machine"
    elif case == "local store":
        args += [f"tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
        want = "a file on this machine, which the workers on"
    elif case == "no interface":
        args += ["network_interface=ib0"]
        want = "network_interface=ib0:"
    cmd = xp_on_launcher(c, tmp_path, *args, experiment=experiment)
    if case == "no checkout":
        c.hide_checkout(c.host("h4"))
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    finally:
        if case == "no checkout":
            c.show_checkout(c.host("h4"))
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xp: error: ") and want in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    _, found = runs(c, experiment)
    assert found == []  # refused before the run was created
    nothing_left(c)


# --- a study across hosts ------------------------------------------------------------------------------
@conformance("study", "launcher", ["ssh", "nsenter"])
def test_a_study_fills_every_hosts_slots_loses_only_a_killed_workers_trial_and_stops_clean(cluster, tmp_path,
                                                                                          launcher):
    """-m sweep=NAME on the hosts file's slots (h2:2, h3:1), each a worker started by the launcher (ssh; the
    fixture launcher with its own config group): the trials report into one study (SQLite on the launcher: only
    its scheduler writes it; the values travel over the workers' channels) and one MLflow parent. A worker killed
    mid-trial loses that trial, which is retried while its slot gets a new worker; Ctrl-C then ends the study
    within seconds with no process on any host, no RUNNING trial or run; the same command finishes its budget on
    every host. (launcher=ssh: a store the hosts cannot reach is one line first.)"""
    from test_scheduler import TINY, default_sigint

    c = cluster
    (tmp_path / "hosts").write_text(f"{c.host('h2').address}:2\n{c.host('h3').address}:1\n")
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "tiny.yaml").write_text(TINY.format(n=6))  # only on the launcher: the workers get the config
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study_env = dict(env(), XP_SWEEPS_DIR=str(sweeps), XP_OPTUNA_STORAGE=storage)
    experiment = f"study-{launcher}"
    args = ["-m", "sweep=tiny", f"launcher={launcher}", f"launcher.hosts_file={tmp_path / 'hosts'}",
            f"hydra.sweep.dir={tmp_path}/sweep"]
    if launcher == "ssh":
        bad = subprocess.run(xp_on_launcher(c, tmp_path, *args, "epochs=1", f"tracking_uri=sqlite:///{tmp_path}/m.db",
                                            experiment="study-bad"), cwd=ROOT, env=study_env, capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 2 and "a file on this machine, which the workers on" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "m.db").exists()

    def trials():
        return study_trials(storage)

    def until(what, check):
        wait_for(what, check, proc, out)

    out = tmp_path / "out.txt"
    with out.open("w") as sink:  # epochs=40: trials long enough to kill and stop in the middle
        proc = subprocess.Popen(xp_on_launcher(c, tmp_path, *args, "epochs=40", experiment=experiment), cwd=ROOT,
                                env=study_env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=default_sigint)
    try:
        until("3 trials in flight", lambda: sum(t.state.name == "RUNNING" for t in trials()) == 3)
        secrets, stranger = slot_secrets(c), c.host("h2")  # a stranger on a host calls the scheduler back too
        address = secrets[0][1]
        knock = ("import json, socket, sys\nhost, port = sys.argv[1].rsplit(':', 1)\n"
                 "s = socket.create_connection((host, int(port)), timeout=10)\ns.settimeout(120)\n"
                 "s.sendall(json.dumps({'op': 'hello', 'token': 'guess'}).encode() + b'\\n')\n"
                 "try: print(s.recv(100) == b'')\n"
                 "except ConnectionResetError: print(True)")  # closed; or reset: under load, its line unread
        knocked = subprocess.Popen([*stranger.enter(), sys.executable, "-c", knock, address], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        h3 = c.host("h3")
        victim = [int(p.split()[0]) for p in c.processes(h3) if "xp.launching.trialworker" in p]
        assert len(victim) == 1, c.processes(h3)
        seen_commands = [p for h in [c.launcher, *c.workers] for p in c.processes(h)]
        os.kill(victim[0], signal.SIGKILL)
        until("the lost trial retried", lambda: retried(trials()))
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    said = out.read_text()
    assert proc.returncode == 130 and took < 15, (took, said[-3000:])
    assert "Traceback" not in said and "lost its worker" in said, said[-3000:]
    # the stranger was dropped when the replacement called back, and the study went on
    assert knocked.communicate(timeout=30)[0].strip() == "True" and "without a slot's secret was refused" in said
    nothing_left(c)
    lost = [t for t in trials() if t.state.name == "FAIL" and not t.user_attrs.get("xp.interrupted")]
    assert len(lost) == 1, [(t.number, t.state.name, t.user_attrs) for t in trials()]
    assert "RUNNING" not in {t.state.name for t in trials()}, ([(t.number, t.state.name, t.user_attrs,
                                                                 t.system_attrs) for t in trials()], said[-4000:])
    _, found = runs(c, experiment)
    assert "RUNNING" not in {x.info.status for x in found}, ([(x.info.run_name, x.info.status) for x in found],
                                                             said[-5000:])

    r = subprocess.run(xp_on_launcher(c, tmp_path, *args, "epochs=1", "sweep.continue_changed=true",  # (1 epoch:
                                      experiment=experiment), cwd=ROOT,  # on the user's word)
                       env=study_env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    h2, text = c.host("h2").address, r.stdout + r.stderr
    left = int(re.search(r"(\d+) to run", text).group(1))  # (how many the first command finished: its timing)
    assert f"study: {min(3, left)} slots" in text and f"on {h2}" in text, text  # every host's slots it needs
    done = [t for t in trials() if t.state.name == "COMPLETE"]
    assert len(done) == 6 and not [t for t in trials() if t.state.name in ("RUNNING", "WAITING")]
    assert any(t.params == lost[0].params for t in done)  # the lost trial's parameters ran after all
    _, found = runs(c, experiment)
    parents = [x for x in found if x.data.tags.get("xp.sweep") == "true"]
    children = {x.info.run_id: x for x in found if "optuna.trial_number" in x.data.tags}
    ran = [children[t.user_attrs["mlflow_run_id"]] for t in done]
    assert all(x.info.status == "FINISHED" for x in ran)
    assert {x.data.tags["mlflow.parentRunId"] for x in ran} <= {p.info.run_id for p in parents}
    assert {x.data.tags["xp.slot.host"] for x in children.values()} == {h2, h3.address}  # every host ran trials
    assert {x.data.tags["xp.host"] for x in children.values()} == {"h2", "h3"}  # in its own namespace
    nothing_left(c)
    # a slot's secret is in its worker's environment only: no command line, console line or MLflow record has it
    recorded = " ".join(str(x.data.tags) + str(x.data.params) for x in found)
    for secret, _ in secrets:
        assert secret not in said + r.stdout + r.stderr + recorded + " ".join(seen_commands)


@conformance("population", "launcher", ["ssh", "nsenter"])
def test_a_population_trains_across_hosts_each_interval_from_its_sources_exact_weights(cluster, tmp_path, launcher):
    """sweep.search=pbt on the hosts file's slots (h2:1, h3:1), each a worker the launcher started (ssh; the
    fixture launcher): 4 members, 2 epochs, an interval of 1; the members' commits in a folder every host reaches;
    each interval on whichever host's slot asked, starting from the bit-equal weights its source interval ended
    with."""
    from test_pbt import POP, check_lineage

    c = cluster
    (tmp_path / "hosts").write_text(f"{c.host('h2').address}:1\n{c.host('h3').address}:1\n")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "pop.yaml").write_text(POP.format(interval=1, n=8))
    study_env = dict(env(), XP_SWEEPS_DIR=str(tmp_path / "sweeps"), XP_OPTUNA_STORAGE=f"sqlite:///{tmp_path}/o.db")
    r = subprocess.run(xp_on_launcher(c, tmp_path, "-m", "sweep=pop", f"launcher={launcher}", "epochs=2",
                                      f"launcher.hosts_file={tmp_path / 'hosts'}",
                                      f"checkpoint_dir={c.shared}/pbt-{launcher}", f"hydra.sweep.dir={tmp_path}/sweep",
                                      experiment=f"pbt-{launcher}"),
                       cwd=ROOT, env=study_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, said(r)
    ran = check_lineage(f"sqlite:///{c.db}", 2, f"pbt-{launcher}")
    assert len(ran) == 8 and {x.data.tags["xp.host"] for x in ran.values()} == {"h2", "h3"}
    assert "trained no more" not in r.stdout + r.stderr
    nothing_left(c)


def test_a_population_whose_commits_each_host_keeps_to_itself_stops_at_the_first_move_with_one_line(cluster, tmp_path):
    """checkpoint_dir in /tmp, each host's own: the first interval on another host than its source's finds no
    commit there; the study stops then (exit 2) with one line naming the folder, not training on with members
    dropped one by one; no trial or run left RUNNING, nothing left on any host."""
    import optuna

    from test_pbt import POP

    c = cluster
    (tmp_path / "hosts").write_text(f"{c.host('h2').address}:1\n{c.host('h3').address}:1\n")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "pop.yaml").write_text(POP.format(interval=1, n=16))
    storage = f"sqlite:///{tmp_path}/o.db"
    study_env = dict(env(), XP_SWEEPS_DIR=str(tmp_path / "sweeps"), XP_OPTUNA_STORAGE=storage)
    r = subprocess.run(xp_on_launcher(c, tmp_path, "-m", "sweep=pop", "launcher=ssh", "epochs=4",
                                      f"launcher.hosts_file={tmp_path / 'hosts'}", "checkpoint_dir=/tmp/pbt-private",
                                      f"hydra.sweep.dir={tmp_path}/sweep", experiment="pbt-private"),
                       cwd=ROOT, env=study_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, said(r)
    assert "Traceback" not in r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("xp: error: checkpoint_dir=/tmp/pbt-private: member ") and "do not share" in last, last
    trials = optuna.load_study(study_name="pop", storage=storage).trials
    assert "RUNNING" not in {t.state.name for t in trials}
    assert len([t for t in trials if t.state.name == "FAIL" and "xp.interrupted" not in t.user_attrs]) == 1
    _, found = runs(c, "pbt-private")
    assert found and "RUNNING" not in {x.info.status for x in found}, [(x.info.run_name, x.info.status) for x in found]
    nothing_left(c)


def slot_secrets(c) -> list[tuple[str, str]]:
    """(secret, HOST:PORT to call back) of every study worker on the hosts, from their processes' environments."""
    found = []
    for h in c.workers:
        for line in c.processes(h):
            if "xp.launching.trialworker" not in line:
                continue
            env = dict(v.split("=", 1) for v in Path(f"/proc/{line.split()[0]}/environ").read_bytes().decode()
                       .split("\0") if "=" in v)
            found.append((env["XP_SLOT_TOKEN"], env["XP_SLOT_CONNECT"]))
    assert found
    return found


def test_the_examples_own_network_and_data_train_across_two_hosts_as_one_process(cluster, tmp_path):
    """A package's network and data set (examples/xp-example, installed in the hosts' environment) in a DDP job of
    torchrun processes on two namespace hosts over ssh: the parameters one process trains."""
    c = cluster
    own = ["model=tinynet", "dataset=shapes", "epochs=1", "lr_schedule=constant"]
    want = one_process("torch", *own, "batch=32")
    hosts_file = c.hosts_file(tmp_path / "hosts", [h.name for h in c.workers[:2]])
    out = c.shared / "own-torchrun.npz"
    r = subprocess.run(xp_on_launcher(c, tmp_path, "launcher=ssh", "backend=torch", *own,
                                      f"launcher.hosts_file={hosts_file}", "workers=2", "batch=16",
                                      f"save_params={out}", "dist_timeout_s=120", experiment="own"),
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert_same_params(dict(np.load(out)), want)
    run = runs(c, "own")[1][0]
    assert run.info.status == "FINISHED" and run.data.params["model.name"] == "tinynet"
    nothing_left(c)


# --- elastic across hosts (last: it crashes h3 for good) ---------------------------------------------------
ELASTIC = ["kvstore=dist_sync", "batch=3", "workers=2", "epochs=10", "lr=0.01", "lr_ref_batch=12",
           "dist_timeout_s=60"]
ONE_PROCESS = ["batch=6", "lr=0.01", "lr_ref_batch=12"]  # the elastic runs' reference: their global batch of 6


def test_hosts_join_and_leave_as_a_spot_trace_says(cluster, tmp_path):
    """Dynamic Training across hosts: a spot trace offers 2 hosts, then 3, then 2 again; the elastic job starts on
    h2+h3 (the first two of its pool), h4 joins, then leaves, the global batch fixed, every worker billed at the
    trace's price of its moment. The trace is a live feed the test appends to as it sees the job train. A trace
    offering more hosts than the pool has is one line before anything."""
    c = cluster
    pool = c.hosts_file(tmp_path / "pool", ["h2", "h3", "h4"])
    trace = tmp_path / "trace.csv"
    trace.write_text("t_s,hosts,spot_price_per_hour\n0,4,0.9\n")
    common = ["elastic.enabled=true", f"elastic.discovery={pool}", "elastic.poll_s=0.2", "hardware=p3.2xlarge",
              f"checkpoint_dir={c.shared}/trace"]
    r = subprocess.run(xp_on_launcher(c, tmp_path, *ELASTIC, *common, f"elastic.trace={trace}", "elastic.max_workers=4",
                                      experiment="trace"), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "offers up to 4 hosts, but elastic.discovery=" in r.stderr, r.stderr
    assert runs(c, "trace")[1] == []  # nothing started

    # the trace as a live feed: rows appended when the test has seen the job train on what the trace offered,
    # at a t_s the job has certainly passed (counted from its first round's line, which comes after its zero)
    trace.write_text("t_s,hosts,spot_price_per_hour\n0,2,0.90\n")
    proc = subprocess.Popen(xp_on_launcher(c, tmp_path, *ELASTIC, "epochs=8", *common, f"elastic.trace={trace}",
                                           "elastic.max_workers=3", experiment="trace"),
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "on 2 workers", timeout=120)
        started = time.monotonic()
        wait_for_line(proc, "  train_loss", timeout=120)
        with trace.open("a") as f:
            f.write(f"{time.monotonic() - started:.2f},3,1.00\n")  # a third host is offered
        wait_for_line(proc, "on 3 workers", timeout=120)
        wait_for_line(proc, "  train_loss", timeout=120)
        with trace.open("a") as f:
            f.write(f"{time.monotonic() - started:.2f},2,1.20\n")  # and taken back
        wait_for_line(proc, "on 2 workers", timeout=120)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    client, found = runs(c, "trace")
    run = found[0]
    assert run.info.status == "FINISHED" and run.data.params["derived.global_batch"] == "6"
    launched = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "elastic.launch_workers"),
                                        key=lambda m: m.timestamp)]
    assert launched == [2, 3, 2], launched
    workers = metric_by_step(client, run.info.run_id, "workers")
    assert len(workers) == 8 and workers[0] == 2 and 3 in workers and workers[-1] == 2, workers
    prices = set(metric_by_step(client, run.info.run_id, "spot_price_per_hour"))
    assert prices == {0.9, 1.0, 1.2}, prices  # each round bills at the trace as it was when it started
    assert 0 < run.data.metrics["cost_usd"] < 3 * 1.2 * run.data.metrics["elapsed_s"] / 3600
    nothing_left(c)


def test_hosts_join_leave_and_crash_with_the_global_batch_fixed(cluster, tmp_path):
    """Start on h2+h3; h4 joins (3 workers), h2 leaves (h3+h4), h3 crashes mid-epoch (its namespace's
    processes killed, sshd too): rolled back to the last commit, finished on h4 alone. Global batch 6 (3, 2 and
    6 per worker; 239 steps an epoch, so the crash lands inside one); the accuracy is one process's within a point."""
    c = cluster
    fixed_acc = one_process_accuracy("gluon", *ONE_PROCESS, "epochs=10")

    discovery = tmp_path / "discovery"
    c.hosts_file(discovery, ["h2", "h3"])
    args = [*ELASTIC, "elastic.enabled=true", f"elastic.discovery={discovery}", "elastic.poll_s=0.2",
            "elastic.max_workers=3", f"checkpoint_dir={c.shared}/elastic"]
    proc = subprocess.Popen(xp_on_launcher(c, tmp_path, *args, experiment="elastic"), cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "1/10  train_loss", timeout=120)
        c.hosts_file(discovery, ["h2", "h3", "h4"])  # a third host joins
        wait_for_line(proc, "on 3 workers", timeout=120)
        wait_for_line(proc, "  train_loss", timeout=120)
        c.hosts_file(discovery, ["h3", "h4"])  # one leaves
        wait_for_line(proc, "on 2 workers", timeout=120)
        wait_for_line(proc, "  train_loss", timeout=120)
        c.kill_host(c.host("h3"))  # one crashes, in the middle of the next epoch
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert f"going on without the lost host {c.host('h3').address}" in out, out[-3000:]
    client, found = runs(c, "elastic")
    run = found[0]
    assert run.info.status == "FINISHED" and run.data.metrics["elastic.restarts"] == 1
    assert run.data.params["derived.global_batch"] == "6"
    workers = metric_by_step(client, run.info.run_id, "workers")
    assert len(workers) == 10 and workers[0] == 2 and 3 in workers and workers[-1] == 1, workers
    assert metric_by_step(client, run.info.run_id, "elastic.launch_workers") == [2, 3, 2, 1]
    acc = metric_by_step(client, run.info.run_id, "val_accuracy")
    assert abs(acc[-1] - fixed_acc) <= 0.01, (acc, fixed_acc)
    nothing_left(c)


def test_torchruns_elastic_agent_goes_on_when_a_host_leaves_the_discovery_list(cluster, tmp_path):
    """backend=torch elastic on h2+h4; h4 leaves the discovery list after the group of 2 trained an epoch: xp ends
    h4's agent (and what it started there), h2's agent restarts its workers alone from the last commit, the global
    batch stays 12, and nothing is left on h4. (After the crash test: h3 is gone.)"""
    c = cluster
    discovery = c.hosts_file(tmp_path / "discovery", ["h2", "h4"])
    h2, h4 = c.host("h2").address, c.host("h4").address
    args = ["backend=torch", "batch=6", "workers=2", "epochs=6", "lr=0.01", "lr_ref_batch=12", "dist_timeout_s=60",
            "elastic.enabled=true", f"elastic.discovery={discovery}", "elastic.poll_s=0.2", "elastic.max_workers=2",
            f"checkpoint_dir={c.shared}/torch-leave"]
    proc = subprocess.Popen(xp_on_launcher(c, tmp_path, *args, experiment="torch-leave"), cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "(2 workers)", timeout=120)
        wait_for_line(proc, "  train_loss", timeout=120)
        c.hosts_file(discovery, ["h2"])  # h4 leaves
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert f"xp: elastic: host {h4} leaves" in out and f"torchrun agents on {h2} (global batch 12)" in out, out[-3000:]
    client, found = runs(c, "torch-leave")
    run = found[0]
    assert run.info.status == "FINISHED" and "elastic.restarts" not in run.data.metrics
    launched = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "elastic.launch_workers"),
                                        key=lambda m: m.timestamp)]
    assert launched == [2, 1], launched
    workers = metric_by_step(client, run.info.run_id, "workers")
    assert len(workers) == 6 and workers[0] == 2 and workers[-1] == 1, workers
    nothing_left(c)


def test_torchruns_own_elastic_agent_takes_a_host_joining_and_survives_one_killed(cluster, tmp_path):
    """backend=torch, elastic through torchrun's elastic agent (one per host, --nnodes=1:2): the discovery list
    offers h2, then (once h2 has trained an epoch: the test writes it) h4 too (an agent starts there; the running
    one restarts its workers into a group of 2), then h4 dies, namespace and all (h2's agent restarts its workers
    alone): each change waits for what the job says, not for a time. The global batch stays 6 (6, then 3 per process),
    every restart resumes from xp's last commit, and the accuracy is one process's (batch 6) within a point.
    (After the crash test: h3 is gone.) An elastic torch job with a kvstore is one line, before anything starts."""
    c = cluster
    torch_job = ["backend=torch", "batch=3", "epochs=16", "lr=0.01", "lr_ref_batch=12", "dist_timeout_s=60"]
    r = subprocess.run(xp_on_launcher(c, tmp_path, *torch_job, "workers=2", "kvstore=dist_sync", "elastic.enabled=true",
                                      experiment="torch-elastic"), cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("xp: error: kvstore=dist_sync: backend=torch allreduces"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and runs(c, "torch-elastic")[1] == []

    fixed_acc = one_process_accuracy("torch", *ONE_PROCESS, "epochs=16")

    pool = c.hosts_file(tmp_path / "pool", ["h2"])
    h2, h4 = c.host("h2").address, c.host("h4").address
    args = [*torch_job, "workers=2", "elastic.enabled=true", f"elastic.discovery={pool}", "elastic.poll_s=0.2",
            "elastic.max_workers=2", f"checkpoint_dir={c.shared}/torch"]  # (h2 alone: 1 worker of batch 6)
    proc = subprocess.Popen(xp_on_launcher(c, tmp_path, *args, experiment="torch-elastic"), cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "  train_loss", timeout=120)  # h2 alone has trained an epoch
        c.hosts_file(pool, ["h2", "h4"])  # h4 joins
        wait_for_line(proc, f"torchrun agents on {h2}, {h4}", timeout=120)
        wait_for_line(proc, "(2 workers)", timeout=120)  # the group of 2 formed: its rank 0 says so
        wait_for_line(proc, "  train_loss", timeout=120)
        wait_for_line(proc, "  train_loss", timeout=120)
        c.kill_host(c.host("h4"))  # h4 crashes mid-training
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert f"the agent on host {h4} was lost" in out, out[-3000:]
    client, found = runs(c, "torch-elastic")
    run = found[0]
    assert run.info.status == "FINISHED" and run.data.params["derived.global_batch"] == "6"
    assert run.data.metrics["elastic.restarts"] == 1
    launched = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "elastic.launch_workers"),
                                        key=lambda m: m.timestamp)]
    assert launched == [1, 2, 1], launched
    workers = metric_by_step(client, run.info.run_id, "workers")
    assert len(workers) == 16 and 2 in workers and workers[-1] == 1, workers
    acc = metric_by_step(client, run.info.run_id, "val_accuracy")
    assert len(acc) == 16 and abs(acc[-1] - fixed_acc) <= 0.01, (acc, fixed_acc)
    nothing_left(c)
