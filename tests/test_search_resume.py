"""A search that resumes exactly: a seeded study on one slot, its command or a worker killed (SIGKILL) at several
moments and the same command run again, proposes the same parameter sets in the same order as the same study
never interrupted (xp.studies.trial.proposal_number: the sampler's state is the storage's)."""

from __future__ import annotations

import os
import random
import time

import psutil
import pytest

from conftest import run_xp, said, wait_for_line, xp_process
from test_scheduler import workers_of

N = 13  # past TPE's 10 random start-up trials: the last proposals are its model's
SEED = int(os.environ.get("XP_KILL_SEED", random.randrange(1 << 30)))  # the kills' moments; said with a failure
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
            and "interrupted_from" not in t.user_attrs  # (xp's: a trial given back, queued again)
            and "xp.void" not in t.user_attrs]  # (killed while its parameters were drawn: no proposal)


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
    args, rng = ("-m", "sweep=cut", "epochs=1"), random.Random(SEED)
    for kill, after in (("command", 2), ("command", 3), ("worker", 2)):  # (the last command goes on to the end)
        with xp_process(tmp_path, store, *args, env=env) as proc:
            wait_for_line(proc, f"| {after} done (", timeout=300)  # (the trials this command ended so far)
            time.sleep(rng.uniform(0.0, 0.5))  # a random moment: as the next trial is asked, drawn, run
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
    assert len(cut) == N and cut == proposals(tmp_path, "straight"), f"XP_KILL_SEED={SEED}"


def test_a_trial_killed_while_its_parameters_were_drawn_is_no_proposal(tmp_path):
    """A command killed inside the sampler leaves a RUNNING trial without parameters, marked with its gone
    process: the next command voids it (not run, not counted, not retried) and its next proposal draws what the
    uninterrupted study drew there."""
    import socket

    from xp.studies.search import Sampled
    from xp.studies.study import spec_from
    from xp.studies.summary import counts, counts_line
    from xp.studies.sweeper import retry_orphans
    from xp.studies.trial import SCHEDULER_ATTR, _counts, open_study

    def study(name: str):
        raw = {"study_name": name, "storage": f"sqlite:///{tmp_path}/optuna.db", "n_trials": 4, "sampler": "tpe",
               "sampler_seed": 3, "pruner": "none",
               "params": {"lr": {"type": "float", "low": 0.002, "high": 0.2, "log": True},
                          "momentum": {"type": "float", "low": 0.5, "high": 0.95}}}
        spec = spec_from(raw, name)
        s = open_study(spec)
        return s, spec, Sampled(s, spec)

    straight, _, search = study("straight")
    first = search.ask()
    assert set(first.params) == {"lr", "momentum"}

    cut, spec, search = study("cut")
    dead = cut.ask()  # created, marked, no parameter drawn yet: as a SIGKILL inside the sampler leaves it
    cut._storage.set_trial_user_attr(dead._trial_id, SCHEDULER_ATTR, f"{socket.gethostname()}:4194303:1.00")
    # and one killed a moment earlier: created by Optuna, before the sampler's first call marks it
    cut._storage.create_new_trial(cut._study_id)
    assert _counts(cut) == (0, 2)
    lines = retry_orphans(cut, spec, search)
    assert len(lines) == 2 and all("killed while its parameters were drawn" in line for line in lines), lines
    assert "its asker was killed as it asked (it has no mark)" in lines[1]
    assert _counts(cut) == (0, 0) and search.remaining() == 4  # not run, not in the budget
    assert "2 cut short while their parameters were drawn" in counts_line(counts(cut))
    again = search.ask()
    assert again.number == 2 and again.params == first.params  # the proposal the uninterrupted study made
