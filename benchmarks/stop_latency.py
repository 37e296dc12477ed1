"""Ctrl-C on a 2-slot study at random moments: how long the command takes to exit, and what it leaves.

The same study command is started again and again on one store, each time interrupted (SIGINT to its process
group, as a terminal sends it) at a random moment: after 0 to 3 of its trial lines plus 0 to 1.5 s, which lands
in a worker starting, a trial starting, training, evaluating, a run's end or a model being written. After each:
the exit's latency, and nothing RUNNING in the Optuna study or the MLflow store. At the end the same command runs
uninterrupted and must finish the study's budget. Target: every exit within 2 s (issue 56: 5 of 14 took 10.5 s).

    .venv/bin/python benchmarks/stop_latency.py [--stops 20] [--trials 60] [--epochs 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-s", type=float, default=2.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    folder = tempfile.mkdtemp(prefix="xp-bench-stop-")
    atexit.register(tidy, folder)
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{folder}/mlflow.db", PYTHONUNBUFFERED="1",
               XP_OPTUNA_STORAGE=f"sqlite:///{folder}/optuna.db", XP_STATE_DIR=f"{folder}/state")
    command = [sys.executable, "-m", "xp", "-m", "sweep=lr_batch", f"sweep.n_trials={args.trials}",
               f"epochs={args.epochs}", "sweep.parallel=2", f"hydra.sweep.dir={folder}/sweep"]
    took, left = [], []
    for i in range(args.stops):
        lines, extra = rng.randint(0, 3), rng.random() * 1.5
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        seen = 0
        while seen < lines:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line.startswith("study: trial ")
        time.sleep(extra)
        t0, now = time.monotonic(), time.time()
        sent = time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(now)) + f"{int(now % 1 * 1000):03d}"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        took.append(time.monotonic() - t0)
        if took[-1] > args.target_s or proc.returncode not in (0, 130, -signal.SIGINT):  # what a slow stop (or
            # one that ended otherwise than a Ctrl-C's 130) printed, to see where it waited
            slow = ROOT / "benchmarks" / "results" / f"stop_latency_slow_{i + 1}.txt"
            slow.parent.mkdir(parents=True, exist_ok=True)
            slow.write_text(f"[{sent}] (Ctrl-C sent; the command's lines below carry their own times)\n{out}")
            print(f"  (its output: {slow})")
        running = still_running(env)
        left.append(running)
        print(f"  stop {i + 1:2}/{args.stops}: after {seen} trial lines + {extra:.2f} s: exit {proc.returncode} in "
              f"{took[-1]:.2f} s; RUNNING after: {running or 'none'}", flush=True)
    final = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="lr_batch", storage=env["XP_OPTUNA_STORAGE"])
    from xp.studies.trial import _counts

    finished, _ = _counts(study)  # (as the study's budget counts them: a trial that diverged is done, one a stop
    # interrupted and queued again is not)
    met = max(took) <= args.target_s and not any(left) and final.returncode == 0 and finished >= args.trials
    print(f"\n{args.stops} stops: exit latency median {statistics.median(took):.2f} s, max {max(took):.2f} s "
          f"(target <= {args.target_s} s); stops that left anything RUNNING: {sum(bool(x) for x in left)}; "
          f"the same command then: exit {final.returncode}, {finished} of {args.trials} trials finished: "
          f"{'met' if met else 'NOT met'}")
    out = ROOT / "benchmarks" / "results" / "stop_latency.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "took_s": took,
                               "left_running": left, "final_rc": final.returncode, "finished": finished,
                               "met": met}, indent=1))
    return 0 if met else 1


def tidy(folder: str) -> None:
    """The tracking service the commands started ended (it would idle 30 minutes), and the folder removed."""
    from xp.tracking.services import stop

    stop(Path(folder) / "state")
    shutil.rmtree(folder, ignore_errors=True)


def still_running(env: dict[str, str]) -> list[str]:
    """What the store and the study hold as RUNNING: the runs' names and the trials' numbers."""
    import optuna
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("xp")
    runs = [r.info.run_name for r in client.search_runs([exp.experiment_id])
            if r.info.status == "RUNNING"] if exp else []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        trials = optuna.load_study(study_name="lr_batch", storage=env["XP_OPTUNA_STORAGE"]).trials
    except KeyError:  # stopped before the study was created
        trials = []
    return runs + [f"trial {t.number}" for t in trials if t.state.name == "RUNNING"]


if __name__ == "__main__":
    raise SystemExit(main())
