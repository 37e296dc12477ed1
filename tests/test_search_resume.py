"""A search that resumes exactly: a seeded study on one slot, its command or a worker killed (SIGKILL) at several
moments and the same command run again, proposes the same parameter sets in the same order as the same study
never interrupted (xp.studies.trial.proposal_number: the sampler's state is the storage's)."""

from __future__ import annotations

import time

import psutil
import pytest

from conftest import run_xp, said, wait_for_line, xp_process
from test_scheduler import workers_of

N = 13  # past TPE's 10 random start-up trials: the last proposals are its model's
STUDY = """\
study_name: {name}
n_trials: {n}
parallel: 1
sampler: tpe
sampler_seed: 3
pruner: none
params:
  lr: {{type: float, low: 0.002, high: 0.2, log: true}}
  momentum: {{type: float, low: 0.5, high: 0.95}}
"""


def env_for(tmp_path, name: str) -> dict:
    d = tmp_path / "sweeps"
    d.mkdir(exist_ok=True)
    (d / f"{name}.yaml").write_text(STUDY.format(name=name, n=N))
    return {"XP_SWEEPS_DIR": str(d), "XP_OPTUNA_STORAGE": f"sqlite:///{tmp_path}/optuna.db"}


def proposals(tmp_path, name: str) -> list[dict]:
    """The sampler's proposals in order (the study's trials less its replays: retries, trials given back)."""
    import optuna

    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/optuna.db").get_trials()
    assert sum(t.state.name == "COMPLETE" for t in trials) == N and not [t for t in trials if t.state.name == "RUNNING"]
    return [t.params for t in trials if "failed_trial" not in t.system_attrs  # (Optuna's retry of a lost trial)
            and "interrupted_from" not in t.user_attrs]  # (xp's: a trial given back, queued again)


def gone(processes: list[psutil.Process], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_a_seeded_study_killed_and_run_again_proposes_what_it_would_have_uninterrupted(tmp_path, store):
    straight = run_xp(tmp_path, store, "-m", "sweep=straight", "epochs=1", env=env_for(tmp_path, "straight"),
                      timeout=600)
    assert straight.returncode == 0, said(straight)
    env = env_for(tmp_path, "cut")
    args = ("-m", "sweep=cut", "epochs=1")
    for kill, after in (("command", 2), ("command", 3), ("worker", 2)):  # (the last command goes on to the end)
        with xp_process(tmp_path, store, *args, env=env) as proc:
            wait_for_line(proc, f"| {after} done (", timeout=300)  # (the trials this command ended so far)
            if kill == "command":
                workers = workers_of(proc, zygote=True)
                proc.kill()  # SIGKILL: its workers die with it; the next command retries what it ran and held
                proc.wait(timeout=30)
                assert gone(workers)
            else:
                workers_of(proc)[0].kill()  # the trial in flight is lost and retried; the study goes on
                proc.wait(timeout=300)
                assert proc.returncode == 0, proc.stderr.read()[-3000:]
    cut = proposals(tmp_path, "cut")
    assert len(cut) == N and cut == proposals(tmp_path, "straight")
