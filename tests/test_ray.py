"""launcher=ray on a real Ray cluster of namespace hosts (tests/hosts.py): a head on h1, the launching machine
(no CPUs: only the drivers of xp's processes run there), and a node of 2 CPUs on each of h2 and h3, each in its own
process namespace (a `ray stop` anywhere stops every Ray process of a machine; SIGKILL of a node's first process
is a clean host crash). Every Ray process is given its host's address (never this machine's interfaces). An
MLflow server on h1 serves every node.

Token authentication: the module's cluster asks for a token (its own file), and every process here runs with a
home folder of the test's own (empty: Ray's ~/.ray/auth_token of the machine plays no part), RAY_AUTH_MODE pinned.
xp's own cluster runs with and without a token file in its home, and a cluster without tokens is asked with one.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conformance import assert_killed_line, conformance, kill_one_worker, study_trials, wait_for
from conftest import ROOT, metric_by_step, mlflow_runs, said, wait_for_line
from test_distributed import EXACT, assert_same_params, one_process
from test_multihost import ENGINES, runs
from test_multihost import env as host_env

pytestmark = [pytest.mark.slow, pytest.mark.multihost]
PORT = 6380
RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import hosts

    why = hosts.requirements()
    if why:
        pytest.fail(why)  # CI runs as root with the packages ./dev.sh installs: a missing piece is a failure
    before = listening_off_loopback()
    with hosts.Cluster(3) as c:
        # seen at the same path on every host (a worker host's /tmp is its own): an empty home folder (no
        # ~/.ray/auth_token: the tokens here are the tests' own) and the cluster's token file
        c.home = c.shared / "home"
        c.home.mkdir()
        c.token = c.shared / "auth_token"
        c.token.write_text(secrets.token_hex(32))
        global CLUSTER
        CLUSTER = c
        c.db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
        c.uri = c.mlflow_server(c.db)
        c.ray_address = f"{c.launcher.address}:{PORT}"
        for h, role in ((c.launcher, ["--head", f"--port={PORT}", "--num-cpus=0", "--include-dashboard=false",
                                     f"--temp-dir={c.dir / 'ray'}"]),
                        (c.host("h2"), [f"--address={c.ray_address}", "--num-cpus=2"]),
                        (c.host("h3"), [f"--address={c.ray_address}", "--num-cpus=2"])):
            start_node(c, h, role)
            if h is c.launcher:
                wait_nodes(c, 1)
        wait_nodes(c, 3)
        assert listening_off_loopback() <= before, "Ray listens on the machine's own network"
        yield c
        # (every test of the module, xp's own clusters among them, ran Ray only inside namespaces)
        assert listening_off_loopback() <= before, "a test left a socket on the machine's own network"


def listening_off_loopback() -> set[tuple[str, int]]:
    """Ray's sockets listening in the machine's own network namespace (this process's) on an address other than
    loopback: Ray 2.60 listens on every interface of the namespace it runs in, so it may run only inside namespaces
    the tests create (the project's rule); none may appear while the module's cluster runs."""
    import ipaddress

    import psutil

    def ray(pid: int | None) -> bool:  # (other modules' tests run beside this one: torchrun's store, say)
        try:
            return pid is not None and "ray" in " ".join(psutil.Process(pid).cmdline()).lower()
        except psutil.Error:
            return False

    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and not ipaddress.ip_address(c.laddr.ip).is_loopback
            and ray(c.pid)}


CLUSTER = None  # the module's cluster (its token, its home folder), for env()


def env(token: bool = True, home: Path | None = None) -> dict:
    """The environment of every process here: the module's cluster's token (RAY_AUTH_MODE=token and its file; or
    RAY_AUTH_MODE unset and no token), a home folder of the test's own."""
    e = dict(host_env(), HOME=str(home or CLUSTER.home))
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        e.pop(k, None)
    if token:
        e.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(CLUSTER.token))
    return e


def refused(c, address: str) -> bool:
    """Nothing listens at address (HOST:PORT on the launcher's network) yet."""
    host, port = address.rsplit(":", 1)
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()"
    return subprocess.run(c.on_launcher([sys.executable, "-c", probe]), capture_output=True, timeout=30).returncode != 0


def start_node(c, h, role: list[str]) -> None:
    log = open(c.dir / f"ray-{h.name}.out", "a")
    h.daemons.append(subprocess.Popen(
        [*h.enter(), "unshare", "--pid", "--fork", "--mount-proc", RAY, "start", "--block",
         f"--node-ip-address={h.address}", "--object-store-memory=80000000", "--disable-usage-stats", *role],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env()))


def wait_nodes(c, n: int, timeout: float = 90) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(c.on_launcher([sys.executable, "-m", "xp.launching.ray_actors", "nodes", c.ray_address]),
                           capture_output=True, text=True, timeout=120, env=env())
        found = json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 else []
        if len(found) == n:
            return found
        assert time.monotonic() < deadline, (r.returncode, r.stdout[-1000:], r.stderr[-2000:],
                                             (c.dir / "ray-h1.out").read_text()[-2000:])
        time.sleep(1)


def xp_on_ray(c, tmp_path: Path, *args: str, experiment: str) -> list[str]:
    return c.on_launcher(["env", sys.executable, "-m", "xp", "launcher=ray", f"launcher.address={c.ray_address}",
                          f"host_ip={c.launcher.address}", "network_interface=eth0", f"tracking_uri={c.uri}",
                          f"experiment={experiment}", *args, f"hydra.run.dir={tmp_path}/run",
                          f"hydra.sweep.dir={tmp_path}/sweep"])


def xp_processes(c) -> dict[str, list[str]]:
    """Every process of xp's on the hosts: the Ray nodes' own (raylet, idle workers) are not, what an actor
    started is (a job's workers, a study's, their `remote run`), and so is an actor still holding one."""
    left = {}
    for h in c.hosts:
        mine = []
        for pid in sorted(h.pids()):
            cmd = command_line(pid).strip()
            if (" -m xp" in cmd or "xp.launching" in cmd or cmd.startswith("ray::Process")) \
                    and "ray_actors nodes" not in cmd and "mlflow" not in cmd \
                    and "xp.trackingd" not in cmd:  # (the user's tracking service outlives commands)
                mine.append(f"{pid} {cmd[:160]}")
        left[h.name] = mine
    return left


def nothing_left(c) -> None:
    deadline = time.monotonic() + 20
    while any((left := xp_processes(c)).values()):
        assert time.monotonic() < deadline, left
        time.sleep(0.5)


# --- jobs --------------------------------------------------------------------------------------------------
@conformance("exact", "launcher, engine", [("ray", "torchrun"), ("ray", "ps-lite")])
def test_a_job_on_two_ray_nodes_computes_what_one_process_computes(cluster, tmp_path, launcher, engine):
    c = cluster
    backend = ENGINES[engine][0].split("=")[1]
    want = one_process(backend, *EXACT, "batch=48")
    out = c.shared / f"ray-{engine}.npz"
    experiment = f"ray-exact-{engine}"
    # 2 CPUs a process: each node (2 CPUs) takes one
    r = subprocess.run(xp_on_ray(c, tmp_path, *ENGINES[engine], *EXACT, "workers=2", "batch=24",
                                 "launcher.cpus_per_process=2",
                                 f"save_params={out}", "dist_timeout_s=120", experiment=experiment),
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert_same_params(dict(np.load(out)), want)
    client, found = runs(c, experiment)
    assert len(found) == 1 and found[0].info.status == "FINISHED"
    nodes = {c.host("h2").address, c.host("h3").address}
    assert set(found[0].data.tags["xp.hosts"].split(",")) == nodes  # one process on each node
    assert found[0].info.run_id in ray_log(c, found[0].data.tags["xp.ray.log"])  # rank 0's actor's log names it
    assert len(metric_by_step(client, found[0].info.run_id, "val_accuracy")) == 1
    nothing_left(c)


@conformance("killed", "launcher", ["ray"])
def test_a_killed_worker_on_a_ray_node_fails_the_job_naming_rank_and_node(cluster, tmp_path, launcher):
    c = cluster
    experiment = "ray-killed"
    proc = subprocess.Popen(xp_on_ray(c, tmp_path, "backend=gluon", "kvstore=dist_sync", "workers=2", "batch=8",
                                      "launcher.cpus_per_process=2",
                                      "epochs=30", "dist_timeout_s=60", experiment=experiment),
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "  train_loss", timeout=180)  # training: every worker is in
        held = [g for g in placement_groups(c) if g["state"] == "CREATED"]  # the job's: a bundle on each node
        assert len(held) == 1 and held[0]["name"].startswith("xp-job-") and len(set(held[0]["nodes"])) == 2, held
        h3 = c.host("h3")
        kill_one_worker(h3.pids)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    assert_killed_line(out + err, h3.address)
    _, found = runs(c, experiment)
    assert [x.info.status for x in found] == ["FAILED"]
    nothing_left(c)
    assert [g for g in placement_groups(c) if g["state"] != "REMOVED"] == []  # let go with the job


def placement_groups(c) -> list[dict]:
    """The cluster's placement groups: name, state, the nodes of their bundles."""
    code = ("import json, ray; ray.init(address=%r, namespace='xp', logging_level='ERROR'); print(json.dumps(["
            "{'name': g['name'], 'state': g['state'], 'nodes': list(g['bundles_to_node_id'].values())} "
            "for g in ray.util.placement_group_table().values()]))") % c.ray_address
    r = subprocess.run(c.on_launcher([sys.executable, "-c", code]), capture_output=True, text=True, timeout=120,
                       env=env())
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_bad_ray_settings_are_one_line_before_anything_starts(cluster, tmp_path):
    c = cluster
    cases = [(["launcher.address=" + f"{c.launcher.address}:1"], "no Ray cluster answers there"),
             (["launcher.cpus_per_process=3"], "has 3 CPUs for a process"),
             (["launcher.gpus_per_process=1"], "has 1 GPUs for a process"),
             (["launcher.cpu_per_process=1"], "did you mean launcher.cpus_per_process?")]
    for args, said in cases:
        r = subprocess.run(xp_on_ray(c, tmp_path, "backend=torch", "workers=2", *args, experiment="ray-bad"),
                           cwd=ROOT, env=env(), capture_output=True, text=True, timeout=180)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    studies = [([f"tracking_uri=sqlite:///{tmp_path}/mlflow.db"], "a file on this machine, which the workers on"),
               (["gpus=1"], "has 1 GPUs for a process")]  # a trial's GPUs on a cluster of CPUs
    for args, said in studies:
        r = subprocess.run(xp_on_ray(c, tmp_path, "-m", "sweep=lr_batch", *args, experiment="ray-bad"), cwd=ROOT,
                           env=dict(env(), XP_OPTUNA_STORAGE=f"sqlite:///{tmp_path}/optuna.db"), capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert runs(c, "ray-bad")[1] == []
    assert not (tmp_path / "mlflow.db").exists()


def test_a_cluster_that_asks_for_a_token_xp_was_not_given_is_one_line(cluster, tmp_path):
    """The module's cluster asks for a token: without one (RAY_AUTH_MODE unset, an empty home folder), or with
    another, the command says so in one line, naming what to set, before anything starts."""
    c = cluster
    wrong = tmp_path / "wrong_token"
    wrong.write_text(secrets.token_hex(32))
    for extra, said in (({}, "asks for a token (token authentication) and xp was given none"),
                        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(wrong)}, f"refused the token of {wrong}")):
        r = subprocess.run(xp_on_ray(c, tmp_path, "backend=torch", "workers=2", "launcher.connect_timeout_s=5",
                                     experiment="ray-token"),
                           cwd=ROOT, env={**env(token=False), **extra}, capture_output=True, text=True, timeout=180)
        assert r.returncode == 2 and said in r.stderr and "RAY_AUTH_TOKEN" in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert runs(c, "ray-token")[1] == []


def test_the_token_in_the_users_home_folder_reaches_a_cluster_that_asks_for_it_and_no_other(cluster, tmp_path):
    """A user whose home folder holds Ray's token file (as any local ray.init() leaves it) and who set no
    RAY_AUTH_MODE: a 1-trial study runs on the module's cluster, which asks for that token (xp asks again in token
    mode), and on a cluster started without tokens (a second head on h1, 2 CPUs), which xp asks without one (a
    driver in token mode cannot run actors there)."""
    from test_scheduler import TINY

    c = cluster
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(c.token.read_text())
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "tiny.yaml").write_text(TINY.format(n=1))

    def study(address: str, name: str) -> None:
        storage = f"sqlite:///{tmp_path}/{name}.db"
        # the example package's network and data (examples/xp-example): importable on the nodes, the same venv
        argv = xp_on_ray(c, tmp_path / name, "-m", "sweep=tiny", "epochs=1", "model=tinynet", "dataset=shapes",
                         experiment=f"ray-{name}")
        argv[argv.index(f"launcher.address={c.ray_address}")] = f"launcher.address={address}"
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=dict(env(token=False, home=home), XP_SWEEPS_DIR=str(sweeps), XP_OPTUNA_STORAGE=storage))
        assert r.returncode == 0, said(r)
        assert [t.state.name for t in study_trials(storage)] == ["COMPLETE"]
        trial = next(x for x in runs(c, f"ray-{name}")[1] if "optuna.trial_number" in x.data.tags)
        assert trial.data.params["model.name"] == "tinynet" and trial.data.tags["xp.dataset"] == "shapes"

    study(c.ray_address, "token")
    port = PORT + 1
    log = open(tmp_path / "ray-open.out", "w")
    head = subprocess.Popen([*c.launcher.enter(), "unshare", "--pid", "--fork", "--mount-proc", RAY, "start",
                             "--block", "--head", f"--port={port}", f"--node-ip-address={c.launcher.address}",
                             "--num-cpus=2", "--include-dashboard=false", "--object-store-memory=80000000",
                             "--disable-usage-stats", f"--temp-dir={c.dir / 'ray-open'}",  # (a short path: sockets)
                             "--dashboard-agent-listen-port=52400", "--metrics-export-port=52401"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**env(token=False, home=home), "RAY_AUTH_MODE": "disabled"})
    try:
        address = f"{c.launcher.address}:{port}"
        deadline = time.monotonic() + 90
        while refused(c, address):  # the head is up
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "ray-open.out").read_text()[-2000:]
            time.sleep(0.5)
        study(address, "open")
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # its pid namespace: the head's every process
        head.wait(timeout=30)


def test_without_an_address_a_command_runs_on_a_ray_cluster_of_its_machine_which_ends_with_it(cluster, tmp_path):
    """No launcher.address, no $RAY_ADDRESS: the command starts a Ray cluster of its machine (h1) for itself, runs
    a study's trials there (a file store is fine: the nodes are this machine) and ends the cluster with it; with
    Ray's token file in the home folder (whose presence turns tokens on at `ray start --head`: the cluster has a
    token of its own, as it has without the file, the case the module's other clusters start as)."""
    from test_scheduler import TINY

    c = cluster
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "tiny.yaml").write_text(TINY.format(n=3))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    before = c.launcher.pids()
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    r = subprocess.run(c.on_launcher(["env", sys.executable, "-m", "xp", "-m", "sweep=tiny", "launcher=ray",
                                      "sweep.parallel=2", "epochs=1", f"tracking_uri=sqlite:///{tmp_path}/mlflow.db",
                                      "experiment=ray-local", f"hydra.sweep.dir={tmp_path}/sweep"]),
                       cwd=ROOT, env=dict(env(token=False, home=home), XP_SWEEPS_DIR=str(sweeps),
                                          XP_OPTUNA_STORAGE=storage),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert "xp: launcher=ray: a Ray cluster of this machine for this command at 127.0.0.1:" in r.stdout, r.stdout
    assert [t.state.name for t in study_trials(storage)] == ["COMPLETE"] * 3
    _, found = mlflow_runs(f"sqlite:///{tmp_path}/mlflow.db", "ray-local")
    assert {x.info.status for x in found} == {"FINISHED"} and len(found) == 4  # the parent and its 3 trials

    def its_processes() -> list[str]:  # the cluster's (ray start, gcs_server, raylet, ray::IDLE workers, ...)
        return [cmd for pid in c.launcher.pids() - before if "ray" in (cmd := command_line(pid)).lower()
                and "xp.trackingd" not in cmd]

    deadline = time.monotonic() + 20  # (its idle workers end once their raylet has)
    while its_processes():
        assert time.monotonic() < deadline, its_processes()
        time.sleep(0.5)
    nothing_left(c)


def ray_log(c, tag: str) -> str:
    """The file a run's tag xp.ray.log names (NODE:PATH), read on that node (each host has its own /tmp)."""
    node, path = tag.split(":", 1)
    host = next(h for h in c.hosts if h.address == node)
    return subprocess.run([*host.enter(), "cat", path], capture_output=True, text=True, timeout=30).stdout


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# --- a study -----------------------------------------------------------------------------------------------
@conformance("population", "launcher", ["ray"])
def test_a_population_on_ray_trains_each_interval_from_its_sources_exact_weights(cluster, tmp_path, launcher):
    """sweep.search=pbt on 2 actor slots: 4 members, 2 epochs, an interval of 1, the commits in a folder every
    node reaches; each interval starts from the bit-equal weights its source interval ended with."""
    from test_pbt import POP, check_lineage

    c = cluster
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "pop.yaml").write_text(POP.format(interval=1, n=8))
    study_env = dict(env(), XP_SWEEPS_DIR=str(sweeps), XP_OPTUNA_STORAGE=f"sqlite:///{tmp_path}/optuna.db")
    r = subprocess.run(xp_on_ray(c, tmp_path, "-m", "sweep=pop", f"launcher={launcher}", "sweep.parallel=2",
                                 "epochs=2", f"checkpoint_dir={c.shared}/ray-pbt", experiment="ray-pbt"),
                       cwd=ROOT, env=study_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, said(r)
    ran = check_lineage(f"sqlite:///{c.db}", 2, "ray-pbt")
    assert len(ran) == 8 and {x.data.tags["xp.host"] for x in ran.values()} <= {"h2", "h3"}  # on the Ray nodes
    assert "trained no more" not in r.stdout + r.stderr
    nothing_left(c)


@conformance("study", "launcher", ["ray"])
def test_a_study_on_ray_runs_on_both_nodes_follows_a_lost_and_a_joining_node_and_stops_clean(cluster, tmp_path,
                                                                                           launcher):
    """-m sweep=NAME launcher=ray with no sweep.parallel: a slot per CPU of each node (4 actors of 1 CPU), the
    trials reporting into one study and one MLflow parent from both nodes, each process with the runtime
    environment's variables. h3's node crashes mid-trial (its process namespace killed, Ray's processes and the
    trials' with it): its trials are lost and retried, its slots dropped (h2 has no room); a node joins on h3
    again: the study's slots grow onto it (slot 4 on). Ctrl-C then ends the study with no process left and
    nothing RUNNING; the same command finishes its budget."""
    from test_scheduler import TINY, default_sigint

    c = cluster
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "tiny.yaml").write_text(TINY.format(n=24))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study_env = dict(env(), XP_SWEEPS_DIR=str(sweeps), XP_OPTUNA_STORAGE=storage)
    args = ["-m", "sweep=tiny", "launcher.grow_every_s=1", "launcher.runtime_env={env_vars:{XP_RAY_TEST:given}}"]
    experiment = "ray-study"

    def trials():
        return study_trials(storage)

    def until(what, check):
        wait_for(what, check, proc, out)

    def on_h3(slots=("0", "1", "2", "3")):
        return [x for x in runs(c, experiment)[1] if x.data.tags.get("xp.host") == "h3"
                and x.data.tags.get("xp.slot") in slots]

    out = tmp_path / "out.txt"
    with out.open("w") as sink:  # epochs=40: trials long enough to lose a node and stop in the middle
        proc = subprocess.Popen(xp_on_ray(c, tmp_path, *args, "epochs=40", experiment=experiment), cwd=ROOT,
                                env=study_env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=default_sigint)
    h3 = c.host("h3")
    try:
        until("h3's trials' runs", lambda: len(on_h3()) >= 2)
        workers = [int(p.split()[0]) for p in xp_processes(c)["h3"] if "xp.launching.trialworker" in p]
        assert workers, xp_processes(c)
        assert b"XP_RAY_TEST=given" in Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
        node = next(p for p in h3.daemons if "--num-cpus=2" in " ".join(p.args))
        os.killpg(node.pid, signal.SIGKILL)  # the node crashes: its pid namespace, the trials' workers with it
        h3.daemons.remove(node)
        node.wait(timeout=30)
        until("h3's slots dropped", lambda: out.read_text().count("dropped;") == 2)
        start_node(c, h3, [f"--address={c.ray_address}", "--num-cpus=2"])  # a node joins (h3 again)
        until("a trial on a new slot on h3", lambda: on_h3(slots=("4", "5")))
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    said = out.read_text()
    # (21.1 and 21.4 s in full runs of the suite on 2 cores, three test processes and two clusters beside it)
    assert proc.returncode == 130 and took < 30, (took, said[-3000:])
    assert "Traceback" not in said and "lost its worker" in said and "(the site grew)" in said, said[-3000:]
    nothing_left(c)
    lost = [t for t in trials() if t.state.name == "FAIL" and not t.user_attrs.get("xp.interrupted")]
    assert len(lost) == 2, [(t.number, t.state.name, t.user_attrs) for t in trials()]
    assert "RUNNING" not in {t.state.name for t in trials()}
    _, found = runs(c, experiment)
    assert "RUNNING" not in {x.info.status for x in found}, [(x.info.run_name, x.info.status) for x in found]

    r = subprocess.run(xp_on_ray(c, tmp_path, *args, "epochs=1", "sweep.continue_changed=true",  # (1 epoch: on
                                 experiment=experiment), cwd=ROOT, env=study_env,  # the user's word)
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    done = [t for t in trials() if t.state.name == "COMPLETE"]
    assert len(done) == 24 and all(any(t.params == x.params for t in done) for x in lost)
    _, found = runs(c, experiment)
    parents = {x.info.run_id for x in found if x.data.tags.get("xp.sweep") == "true"}
    children = [x for x in found if "optuna.trial_number" in x.data.tags]
    assert {x.data.tags["mlflow.parentRunId"] for x in children} <= parents
    assert {x.data.tags["xp.host"] for x in children} == {"h2", "h3"}  # trials ran on both nodes
    assert all(x.data.tags["xp.ray.log"].startswith(f"{c.subnet}.") for x in children)  # its slot's log, on its node
    nothing_left(c)
