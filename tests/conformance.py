"""The launcher conformance suite: what every registered launcher must do, each on its own hosts.

- exact: ps-lite, Horovod and torchrun jobs compute what one process computes, in one FINISHED MLflow run,
  and leave nothing on any host;
- killed: a worker killed mid-training fails the job (exit 1) with a line naming its rank, and its host when
  the job spans hosts; one FAILED MLflow run; nothing left on any host;
- study: a study's trials land on every host's or allocation's slots into one study and one MLflow parent; a
  worker killed (or its node lost) mid-trial loses exactly that trial, which is retried while its slot is
  refilled; an interrupted study leaves no process, job, RUNNING trial or RUNNING run, and the same command
  finishes its budget;
- population: a population-based study (sweep.search=pbt) trains on the launcher's slots, every interval starting
  from the bit-equal weights its source interval ended with (commits in a folder every slot reaches), each logging
  its schedule, every member reaching the last epoch.

Each site's module runs the checks on the hosts it builds (local: test_distributed.py; ssh and the fixture
launcher nsenter: test_multihost.py; slurm: test_slurm.py; ray: test_ray.py; a local study: test_scheduler.py;
a local population: test_pbt.py)
and marks each such test with `@conformance(CHECK, ...)`. test_launchers.py fails when a registered launcher is missing from a check.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

CHECKS = ("exact", "killed", "study", "population")
MODULES = ("test_distributed", "test_multihost", "test_slurm", "test_scheduler", "test_ray", "test_pbt")  # where the checks run
SUITE: dict[str, set[str]] = {check: set() for check in CHECKS}  # check -> the launchers it runs on


def conformance(check: str, argnames: str, argvalues: list) -> pytest.MarkDecorator:
    """pytest.mark.parametrize(argnames, argvalues), recording which launchers (the `launcher` column) the check
    runs on."""
    names = [n.strip() for n in argnames.split(",")]
    column = names.index("launcher")
    for values in argvalues:
        values = values.values if hasattr(values, "values") else values
        SUITE[check].add(values[column] if len(names) > 1 else values)
    return pytest.mark.parametrize(argnames, argvalues)


def missing(launchers: list[str]) -> dict[str, list[str]]:
    """Check -> the launchers it does not run on (after the MODULES are imported)."""
    import importlib

    for module in MODULES:
        importlib.import_module(module)
    out = {check: sorted(set(launchers) - SUITE[check]) for check in CHECKS}
    return {check: names for check, names in out.items() if names}


def worker_pids(pids: set[int]) -> list[int]:
    """Of these processes, the xp workers of a ps-lite job (DMLC_ROLE=worker in their environment)."""
    found = []
    for pid in sorted(pids):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"DMLC_ROLE=worker" in environ and b"xp" in cmd and b"xp.launching.remote" not in cmd:
            found.append(pid)
    return found


def kill_one_worker(pids_now, timeout: float = 60) -> int:
    """SIGKILL one ps-lite worker among the processes `pids_now()` lists (waiting for one to be there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = worker_pids(pids_now())
        if found:
            os.kill(found[0], signal.SIGKILL)
            return found[0]
        time.sleep(0.5)
    raise AssertionError("no ps-lite worker to kill")


def assert_killed_line(output: str, host: str | None) -> None:
    """The job's failure names the rank (and the host) of the worker that was killed."""
    lines = [line for line in output.splitlines() if "xp: error: worker rank " in line]
    assert lines, output[-3000:]
    assert "was killed by signal 9" in lines[-1], lines[-1]
    if host is not None:
        assert f"on host {host}" in lines[-1], lines[-1]


def study_trials(storage: str, name: str = "tiny") -> list:
    """The study's trials in its storage ([] before it is created)."""
    from conftest import load_study

    try:
        return load_study(name, storage).get_trials()
    except Exception:  # not created yet
        return []


def wait_for(what: str, check, proc, out: Path, timeout: float = 240) -> None:
    """Poll check() until true; fail with the study command's output (`out`) if it ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None and time.monotonic() < deadline, f"{what}: " + out.read_text()[-3000:]
        time.sleep(0.3)


def retried(trials: list) -> bool:
    """A lost trial's retry is running."""
    return any(t.system_attrs.get("failed_trial") is not None and t.state.name == "RUNNING" for t in trials)
