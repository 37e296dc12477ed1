"""Shared helpers: a temporary MLflow store, running `python -m xp` as a user would, composing configs."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

# Several backends train in this one process. Horovod's library bundles its own gloo: loaded before torch's,
# the two clash and importing torch crashes the process. Torch first, as any single-backend process is fine.
import torch  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# xp's state folder (the index of runs' spools waiting for a store, xp.spool): each test process's own (under
# pytest-xdist too, whose workers would otherwise inherit the controller's)
os.environ["XP_STATE_DIR"] = tempfile.mkdtemp(prefix="xp-test-state-")
os.environ["XP_SERVICE_IDLE_S"] = "60"  # a tracking service a test's runs started (xp.tracking.service) ends soon
# nothing from the home folder or the user's environment: the data and weights caches are each test process's own
# (a test that wants one sets its own), and Ray's authentication and address are what a test gives (tests/test_ray.py)
_OWN = tempfile.mkdtemp(prefix="xp-test-home-")
os.environ.update({"XP_CACHE_DIR": os.path.join(_OWN, "cache"), "MXNET_HOME": os.path.join(_OWN, "mxnet"),
                   "TORCH_HOME": os.path.join(_OWN, "torch")})
for _variable in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "XP_UI_URL"):
    os.environ.pop(_variable, None)


# Under pytest-xdist (./dev.sh test: a process per core and one more, --dist loadscope), a module's tests run in one
# process, as its module-scoped fixtures want. The modules whose tests start clusters of processes (emulated hosts,
# Slurm, Ray, local multi-worker jobs: more than a core each) are two groups, each run in one process, one module
# after another, started first: all four in one group took 62 of the suite's 63 minutes (stop 62), in two the
# suite took 52 (the Ray study's stop, 21 s under that load, got a bound of 30 s). The quiet tests (speed
# verdicts) run first, in a group of their own.
# (xdist's own loadgroup marks do not group on pytest 9: its nodeid suffix no longer reaches the scheduler.)
CLUSTERS = {"test_multihost": "clusters-hosts", "test_slurm": "clusters-managers", "test_ray": "clusters-managers",
            "test_distributed": "clusters-managers", "test_kill": "kills", "test_chaos": "chaos"}
# the scopes started first, in this order (the kill rounds next: about 6 minutes of one worker, not the suite's tail;
# then the chaos run: xdist queues the other scopes by their number of tests, which put this one test last, 5 minutes
# of the suite's tail at 40% of the machine: measured, the rest ended 210 s before it)
FIRST = ("quiet", "clusters-managers", "clusters-hosts", "kills", "chaos")


def pytest_xdist_make_scheduler(config, log):
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    quiet = _quiet_tests(Path(__file__).parent)

    class QuietFirst(OrderedDict):
        """The work queue, FIRST at its front: the quiet tests run first, one after another on one worker, while
        the machine's other tests have barely begun (later, each would wait for every running test to end and hold
        every worker idle meanwhile); then the two cluster groups, the suite's longest."""

        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            for first in reversed(FIRST):
                if first in self:
                    self.move_to_end(first, last=False)

    class ByModule(LoadScopeScheduling):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.workqueue = QuietFirst()

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("[", 1)[0] in quiet:
                return "quiet"
            module = nodeid.split("::", 1)[0]
            return CLUSTERS.get(Path(module).stem, module)

    return ByModule(config, log)


def _quiet_tests(folder: Path) -> set[str]:
    """tests/FILE.py::NAME of every test marked quiet, read from the files: the controlling process schedules
    node ids, it collects no test."""
    import ast

    found = set()
    for path in sorted(folder.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any("mark.quiet" in ast.unparse(d) for d in node.decorator_list):
                found.add(f"{folder.name}/{path.name}::{node.name}")
    return found


@pytest.fixture(autouse=True)
def _machine(request, tmp_path_factory):
    """Tests marked `quiet` (they measure speed: a verdict from rates) have the machine to themselves under
    pytest-xdist: each test holds a shared lock on it, a quiet one an exclusive lock, asked for through a
    turnstile that lets no new test start meanwhile. In one process it costs nothing."""
    import fcntl

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        yield
        return
    folder = tmp_path_factory.getbasetemp().parent  # shared by the session's workers
    quiet = request.node.get_closest_marker("quiet") is not None
    if quiet and _held:  # the quiet test before it on this worker kept the machine: no other test started since
        yield
        return
    _release_held()
    machine, turnstile = open(folder / "machine.lock", "a"), open(folder / "turnstile.lock", "a")
    _lock(turnstile, fcntl.LOCK_EX)
    if quiet:  # held while it waits: no other test starts; kept for the quiet tests after it (their own scope)
        _lock(machine, fcntl.LOCK_EX)
        _held.extend([machine, turnstile])
        yield
        return
    fcntl.flock(turnstile, fcntl.LOCK_UN)
    _lock(machine, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(machine, fcntl.LOCK_UN)
        machine.close()
        turnstile.close()


def pytest_generate_tests(metafunc):
    """A test marked `mlflow_paths` (those of runs, studies and models that a store's records go through) runs twice:
    as it is, and with xp's uses of MLflow's internals turned off (xp.tracking.gate, XP_MLFLOW_PUBLIC=1: the path
    another MLflow 3.x takes), its id ending [public]."""
    if metafunc.definition.get_closest_marker("mlflow_paths"):
        metafunc.parametrize("mlflow_path", ["private", "public"], indirect=True)


@pytest.fixture(autouse=True)
def mlflow_path(request, monkeypatch):
    """private (MLflow's internals where xp's gate lets it use them), or public: this process and every command the
    test starts (their environment is this one's) on MLflow's public API only."""
    path = getattr(request, "param", "private")
    if path == "private":
        yield path
        return
    from xp.tracking import gate, service

    monkeypatch.setenv(gate.PUBLIC_ENV, "1")
    for cached in (gate.private_ok, service.identity):  # (a service of its own: one on the public path)
        cached.cache_clear()
    yield path
    for cached in (gate.private_ok, service.identity):
        cached.cache_clear()


_held: list = []  # this worker's hold on the machine (the locks' files), while its quiet tests run


def _release_held() -> None:
    import fcntl

    for f in _held:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
    _held.clear()


def pytest_sessionfinish(session):
    _release_held()  # the last test was quiet: the others' wait ends with it
    from xp.tracking import services

    services.stop()  # the tracking service this test process's runs started (those of tests' own state folders end
    # when their folders go, or after XP_SERVICE_IDLE_S)


def _lock(f, how: int, timeout_s: float = 1800) -> None:
    import fcntl

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(f, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{f.name}: not had within {timeout_s} s") from None
            time.sleep(0.05)


@pytest.fixture
def store(tmp_path):
    """A fresh SQLite MLflow store; returns its URI."""
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"


def xp_env(store_uri: str, extra: dict | None = None) -> dict:
    env = dict(os.environ, MLFLOW_TRACKING_URI=store_uri, PYTHONUNBUFFERED="1")
    env.pop("XP_PARENT_RUN_ID", None)
    env.update(extra or {})
    return env


def xp_args(tmp_path: Path, *args: str) -> list[str]:
    """Command line for `python -m xp ARGS` with Hydra's output folders under tmp_path."""
    return [sys.executable, "-m", "xp", *args, f"hydra.run.dir={tmp_path}/run",
            f"hydra.sweep.dir={tmp_path}/sweep"]


def unless_given(defaults: tuple[str, ...], args: tuple[str, ...]) -> list[str]:
    """The KEY=VALUE `defaults` whose key no argument in `args` gives (an argument replaces its default)."""
    given = {a.split("=", 1)[0] for a in args}
    return [a for a in defaults if a.split("=", 1)[0] not in given]


def run_xp(tmp_path: Path, store_uri: str, *args: str, timeout: float = 300, env: dict | None = None):
    return subprocess.run(xp_args(tmp_path, *args), cwd=ROOT, env=xp_env(store_uri, env), capture_output=True,
                          text=True, timeout=timeout)


# the lines of a failed command that say why: a worker's own error can sit far above the output's tail
_WHY = re.compile(r"error|exception|terminate called|what\(\)|Fatal Python|Aborted|Traceback|Timed out", re.I)


def said(r: subprocess.CompletedProcess) -> str:
    """What a failed command said: every line that names an error (its first 60), a crashed process's stack as
    Python's faulthandler printed it (a worker's segfault: its where, which the tail had cut off), then the
    output's tail."""
    lines = (r.stdout or "").splitlines() + (r.stderr or "").splitlines()
    why = [line for line in lines if _WHY.search(line)]
    crashed = [i for i, line in enumerate(lines) if "Fatal Python error" in line]
    stacks = ["\n".join(lines[i:i + 40]) for i in crashed[:2]]
    return "\n".join(line[:500] for line in why[:60]) + "".join(f"\n--- a crash ---\n{s}" for s in stacks) + \
        "\n--- the tail ---\n" + (r.stdout or "")[-3000:] + (r.stderr or "")[-3000:]


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    """Read proc's stdout until a line contains `needle`; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return line
    proc.kill()
    proc.wait(timeout=30)
    err = proc.stderr.read()[-3000:] if proc.stderr is not None else ""
    raise AssertionError(f"{needle!r} not seen within {timeout}s; output:\n{''.join(seen)[-3000:]}\nstderr:\n{err}")


def mlflow_client(store_uri: str):
    """An MlflowClient on the store, opened as xp opens one (xp.tracking.stores.open_client: a new SQLite store's
    schema is written under its first-use lock). A test that looks while the command creates the store raced it
    through MLflow's migrations with a bare MlflowClient, and the command found the store half-migrated."""
    from xp.tracking.stores import open_client

    return open_client(store_uri)


def load_study(name: str, storage: str):
    """The Optuna study, its storage opened as xp opens one (under the first-use lock: see mlflow_client)."""
    import optuna

    from xp.storefiles import optuna_schema
    from xp.storefiles import first_use

    with first_use(storage, "sweep.storage", seed=optuna_schema):
        return optuna.load_study(study_name=name, storage=storage)


def mlflow_runs(store_uri: str, experiment: str = "xp"):
    client = mlflow_client(store_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return client, []
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def compose_config(*overrides: str) -> dict:
    """The resolved config for these overrides, through Hydra's compose API (as the CLI does)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from xp.data import plugins

    plugins.offer_options()  # model=NAME for a package's network (the example's), as the CLI offers it
    with initialize_config_dir(str(CONF), version_base="1.3", job_name="test"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def plan_for(config: dict, **kwargs):
    """build_plan with pretrained= weights resolved by the config's backend, as xp.run.backend_plan.plan_and_backend
    does (the plan never looks a backend up itself)."""
    from xp.run.plan import build_plan
    from xp.run.entry_points import Registry

    resolver = Registry().load(config["backend"]["name"]).resolve_pretrained
    return build_plan(config, pretrained_by=resolver, **kwargs)


@contextmanager
def xp_process(tmp_path: Path, store_uri: str, *args: str, env: dict | None = None):
    """`python -m xp ARGS` running in the background (stdout and stderr piped); killed if still
    running when the block ends, so no test leaves it behind."""
    proc = subprocess.Popen(xp_args(tmp_path, *args), cwd=ROOT, env=xp_env(store_uri, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def run_together(commands: list[list[str]], env: dict, timeout: float = 400) -> list[subprocess.CompletedProcess]:
    """Start every command at once (processes racing for the same stores), wait for all; kill what is left."""
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return [subprocess.CompletedProcess(c, p.returncode, out, err) for c, p, (out, err) in zip(commands, procs, outs)]


def metric_by_step(client, run_id: str, key: str) -> list[float]:
    """A metric's value at every step, in step order; a step logged twice (an epoch trained again
    after a rollback) keeps its later value."""
    by_step = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
        by_step[m.step] = m.value
    return [by_step[s] for s in sorted(by_step)]



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With XP_TEST_CPU_LOG=FILE: each test's CPU seconds (this process's and its reaped processes', the module's
    shared fixtures counted with the test that made them) and wall, a JSON line each, to see where the suite's
    CPU goes (it is CPU-bound on 2 cores: docs/development.md)."""
    path = os.environ.get("XP_TEST_CPU_LOG")
    if not path:
        yield
        return
    import json
    import resource

    def cpu() -> float:
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                      resource.getrusage(resource.RUSAGE_CHILDREN)))

    before, start, at = cpu(), time.monotonic(), time.time()
    yield
    with open(path, "a") as f:  # (at, worker: the suite's timeline, where its workers wait on one another)
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - before, 2),
                            "wall_s": round(time.monotonic() - start, 2), "at": round(at, 1),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")
