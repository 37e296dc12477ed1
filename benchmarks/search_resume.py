"""A search that resumes exactly, measured: one seeded study on one slot (TPE, `sweeps/lr_batch.yaml`'s lr and
momentum on the default experiment, one epoch a trial) run uninterrupted, and the same study hit by random kills
(SIGKILL of the study's command, then the same command again; some after a SIGKILL of the worker running a
trial, which the study retries), then run to its budget. Reported: the kills by kind, and whether the sampler's
proposals, in order, equal the uninterrupted study's (xp.studies.trial.proposal_number).

    .venv/bin/python benchmarks/search_resume.py [--kills 10] [--trials 40] [--seed 0]

Goal (issue 83): after 10 random kills, the sequence of proposals equals the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from common import run_study, study_command, study_env

STUDY = """\
study_name: {name}
n_trials: {n}
parallel: 1
sampler: tpe
sampler_seed: {seed}
pruner: none
params:
  lr: {{type: float, low: 0.002, high: 0.2, log: true}}
  momentum: {{type: float, low: 0.5, high: 0.95}}
"""


def proposals(work: Path, name: str) -> tuple[list[dict], int]:
    """The sampler's proposals in order (less Optuna's retries and xp's trials given back), and the complete."""
    import optuna

    try:
        trials = optuna.load_study(study_name=name, storage=f"sqlite:///{work}/optuna.db").get_trials()
    except KeyError:  # (not made yet)
        return [], 0
    return ([t.params for t in trials if "failed_trial" not in t.system_attrs and "interrupted_from" not in
             t.user_attrs and "xp.void" not in t.user_attrs], sum(t.state.name == "COMPLETE" for t in trials))


def trial_workers(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children(recursive=True) if "xp.launching.trialworker" in c.cmdline()]


def hit(work: Path, name: str, rng: random.Random, kind: str) -> bool:
    """Run the study's command; once it has ended 1-2 trials, a random moment later, kill the worker running a
    trial (kind "worker": the study retries it and goes on) and, 1-2 trials later, the command itself (SIGKILL:
    its workers die with it); whether the kills landed (the study had not ended first)."""
    proc = subprocess.Popen(study_command(work, name, "epochs=1"), cwd=work, env=study_env(work),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = iter(proc.stdout)

    def ended(n: int) -> None:
        seen = 0
        for line in lines:
            seen += line.startswith("study: trial ") and " done (" in line
            if seen >= n:
                break
        time.sleep(rng.uniform(0.0, 0.6))

    ended(rng.randint(1, 2))
    if kind != "command" and proc.poll() is None:
        workers = [w for w in trial_workers(proc.pid) if "zygote" not in w.cmdline()]
        if workers:
            workers[0].kill()
        ended(rng.randint(1, 2))
    landed = proc.poll() is None
    if landed:
        workers = trial_workers(proc.pid)
        proc.kill()
        psutil.wait_procs(workers, timeout=30)
    proc.stdout.read()
    proc.wait(timeout=600)
    return landed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xp-bench-resume-"))
    (work / "sweeps").mkdir()
    for name in ("straight", "cut"):
        (work / "sweeps" / f"{name}.yaml").write_text(STUDY.format(name=name, n=args.trials, seed=args.seed))
    run_study(work, "straight", "epochs=1", timeout=900)
    rng = random.Random(args.seed)
    kinds: dict[str, int] = {"command": 0, "worker then command": 0}
    t0 = time.perf_counter()
    while sum(kinds.values()) < args.kills:
        if proposals(work, "cut")[1] >= args.trials:  # (done before the kills were: the study starts again)
            raise SystemExit(f"the study ended after {kinds} kills: raise --trials")
        kind = rng.choice(("command", "worker then command"))
        kinds[kind] += hit(work, "cut", rng, kind)
    run_study(work, "cut", "epochs=1", timeout=900)
    straight, _ = proposals(work, "straight")
    cut, complete = proposals(work, "cut")
    same = cut == straight
    first = next((i for i, (a, b) in enumerate(zip(cut, straight)) if a != b), None)
    print("| kills (command / a worker, then the command) | trials | proposals equal to the uninterrupted run's "
          "| wall s |")
    print("|---|---|---|---|")
    print(f"| {kinds['command']} / {kinds['worker then command']} | {complete} complete, {len(cut)} proposals | "
          f"{'yes' if same else f'no (first differs at proposal {first})'} | {time.perf_counter() - t0:.0f} |")
    print(f"(seed {args.seed}; work folder {work})")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
