"""Acceptance: each process of a record's path killed with SIGKILL at a random moment, several times each: the
run's process (delivering through the tracking service, and by itself) and the tracking service (10 rounds each;
XP_KILL_ROUNDS sets another count); the store's process (an MLflow server) is killed among the other faults of the
chaos run (tests/test_chaos.py, benchmarks/chaos.py). After each kill and the next command on the store, every point the run logged
is there once (the points form one unbroken prefix of what it meant to log, and hold every one it said it logged),
every run has ended, and nothing is RUNNING. The random moments come from a seed printed with any failure
(XP_KILL_SEED repeats it)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, mlflow_runs, wait_for_line
from xp.tracking import services
from xp.tracking.tracker import Tracker

pytestmark = pytest.mark.slow

ROUNDS, STEPS = int(os.environ.get("XP_KILL_ROUNDS", 10)), 30
SEED = int(os.environ.get("XP_KILL_SEED", random.randrange(1 << 30)))

WRITER = textwrap.dedent("""
    import sys, time
    from xp.tracking import service
    from xp.tracking.tracker import Tracker
    service.starts = True
    t = Tracker(sys.argv[1], "xp", sys.argv[2], params={"lr": 0.1})
    t.start()
    print("started", t.run_id, flush=True)
    for step in range(int(sys.argv[3])):
        t.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        print("logged", step, flush=True)
        time.sleep(0.01)
    t.end("FINISHED")
    print("ended", flush=True)
""")


@pytest.fixture
def state(tmp_path, monkeypatch):
    folder = tmp_path / "state"
    monkeypatch.setenv("XP_STATE_DIR", str(folder))
    yield folder
    services.stop(folder, every=True)


def _writer(store: str, name: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, store, name, str(STEPS)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)


def _next_command(store: str) -> None:
    """What the next command on the store does first: deliver what gone processes left, end their runs."""
    nxt = Tracker(store, "xp", "next")
    nxt.start()
    nxt.end("FINISHED")


def _check(store: str, said: dict[str, int], rng_state: str) -> None:
    client, runs = mlflow_runs(store)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"], rng_state
    for r in runs:
        if r.info.run_name == "next":
            continue
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "loss")]
        assert steps == list(range(len(steps))), (r.info.run_name, steps, rng_state)  # once each, none missing
        assert len(steps) >= said.get(r.info.run_name, 0), (r.info.run_name, steps, rng_state)
        if len(steps) == STEPS and r.info.status == "FINISHED":
            assert r.data.params == {"lr": "0.1"}, rng_state


def _logged(lines: list[str]) -> int:
    return sum(1 for line in lines if line.startswith("logged"))


def _kill_writer_rounds(store: str, env: dict[str, str]) -> None:
    rng, said = random.Random(SEED), dict[str, int]()
    for i in range(ROUNDS):
        proc = _writer(store, f"run {i}", env)
        time.sleep(rng.uniform(0.0, 2.5))  # from before its start to after its end
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        said[f"run {i}"] = _logged(out.splitlines())
        _next_command(store)
    _check(store, said, f"seed {SEED}")


def test_a_run_killed_at_random_moments_through_the_service(store, state):
    _kill_writer_rounds(store, dict(os.environ, XP_STATE_DIR=str(state)))


def test_a_run_killed_at_random_moments_delivering_by_itself(store, state):
    _kill_writer_rounds(store, dict(os.environ, XP_STATE_DIR=str(state), XP_TRACKING_SERVICE="0"))


def test_the_tracking_service_killed_at_random_moments(store, state):
    """The run goes on, drains its spool itself from where the service got to, and ends FINISHED with every
    point once."""
    rng = random.Random(SEED)
    env = dict(os.environ, XP_STATE_DIR=str(state))
    _next_command(store)  # (a service up before the first round)
    for i in range(ROUNDS):
        proc = _writer(store, f"run {i}", env)
        wait_for_line(proc, "started", 120)
        time.sleep(rng.uniform(0.0, 0.6))  # while it logs, or ends
        for p, _ in services.running(state):
            p.send_signal(signal.SIGKILL)
            p.wait(30)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "ended" in out, (out, f"seed {SEED}")
        client, runs = mlflow_runs(store)
        [run] = [r for r in runs if r.info.run_name == f"run {i}" and r.info.status == "FINISHED"]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(STEPS)), SEED
    _next_command(store)
    _check(store, {}, f"seed {SEED}")
