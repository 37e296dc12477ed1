"""A study on Slurm two ways, side by side on one cluster: xp's slots (launcher=slurm: one long-lived worker job per
slot, refilled the moment a trial ends) and Hydra's submitit launcher (hydra/launcher=submitit_slurm: each trial
its own job, in blocking batches of sweep.parallel).

    sudo .venv/bin/python benchmarks/slurm_study.py [--trials 12] [--parallel 2] [--epochs 6] [--reps 1]

The cluster is the tests' (tests/slurm.py: slurmctld on a login namespace, one slurmd on each of 2 node
namespaces, root needed); both ways run the same study (random sampler, seed 5, median pruner) of LeNet on the
digits, with an MLflow server and a PostgreSQL study storage on the login node. For each way it prints:

- wall: the command's time, from start to exit;
- busy: the allocations' busy fraction, the time the trials' MLflow runs lasted over the time Slurm held the
  jobs that ran them (StartTime to EndTime of each job, 1 s resolution);
- cover: the trials' run time over parallel x the span from the first run's start to the last run's end (what a
  slot did while the study ran);
- jobs: how many Slurm jobs the study used.

All the namespaces share this machine's cores: a trial's start-up (importing MXNet and MLflow) is the same CPU
work in both ways, and with 2 cores the two slots' trials compete with the scheduler and the server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

STUDY = ("study_name: {name}\nn_trials: {n}\nsampler: random\nsampler_seed: 5\npruner: median\n"
         "pruner_options: {{n_startup_trials: 2, n_warmup_steps: 1}}\nstorage: {storage}\n"
         "params:\n  lr: {{type: float, low: 0.001, high: 0.3, log: true}}\n")


def jobs(c) -> dict[str, tuple[float, float, str]]:
    """Every job Slurm still shows: id -> (start, end, node), times in seconds since the epoch (ended jobs only)."""
    out = {}
    for line in c.slurm(["squeue", "-h", "-t", "all", "-o", "%i %S %e %T %N"]).stdout.splitlines():
        job, start, end, state, node = (line.split() + [""])[:5]
        if state in ("PENDING", "RUNNING", "COMPLETING") or start in ("N/A", "Unknown"):
            continue
        t = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").timestamp()  # noqa: E731
        out[job] = (t(start), t(end), node)
    return out


def trial_runs(db: Path, experiment: str) -> list[tuple[float, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return [(r.info.start_time / 1000, r.info.end_time / 1000, r.data.tags.get("xp.host", "")) for r in runs
            if "optuna.trial_number" in r.data.tags and r.info.end_time]


def one(c, way: str, rep: int, args: argparse.Namespace) -> dict[str, float]:
    name = f"bench-{way}-{rep}"
    folder = c.shared / name
    (folder / "sweeps").mkdir(parents=True)
    (folder / "sweeps" / "bench.yaml").write_text(STUDY.format(name=name, n=args.trials, storage=c.storage))
    argv = [sys.executable, "-m", "xp", "-m", "sweep=bench", f"sweep.parallel={args.parallel}",
            f"epochs={args.epochs}", f"tracking_uri={c.uri}", f"experiment={name}", f"hydra.sweep.dir={folder}/sweep"]
    if way == "slots":
        argv += ["launcher=slurm", f"launcher.output_dir={c.shared}", "launcher.poll_s=0.5"]
    else:  # the README's way before: every trial a submitit job, batches of `parallel`
        argv += ["hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=10", "sweep.scheduler=hydra"]
    env = {**os.environ, **c.env, "PYTHONUNBUFFERED": "1", "XP_SWEEPS_DIR": str(folder / "sweeps")}
    for k in ("MLFLOW_TRACKING_URI", "XP_PARENT_RUN_ID", "XP_COMMAND"):
        env.pop(k, None)
    before = set(jobs(c))
    t0 = time.monotonic()
    r = subprocess.run(c.on_launcher(argv), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{way}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    time.sleep(1)
    held = {j: se for j, se in jobs(c).items() if j not in before}
    runs = trial_runs(c.db, name)
    busy = sum(e - s for s, e, _ in runs)
    allocated = sum(max(1.0, e - s) for s, e, _ in held.values())
    span = max(e for _, e, _ in runs) - min(s for s, _, _ in runs)
    if args.verbose:  # where each job's allocation went: before its node's first trial, and after its last
        for job, (s, e, node) in sorted(held.items()):
            mine = [(rs, re) for rs, re, host in runs if host == node and s - 1 <= rs <= e + 1]
            if mine:
                print(f"    job {job} on {node}: {e - s:.0f} s allocated, {sum(b - a for a, b in mine):.1f} s of "
                      f"{len(mine)} trials, first after {min(a for a, _ in mine) - s:.1f} s, "
                      f"end {e - max(b for _, b in mine):.1f} s after the last")
    return {"wall": wall, "busy": busy / allocated, "cover": busy / (args.parallel * span), "jobs": len(held),
            "trials": len(runs), "sacct_lines": (r.stdout + r.stderr).count("sacct")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--verbose", action="store_true", help="where each job's allocation went")
    args = ap.parse_args()
    import pg
    import slurm

    with slurm.SlurmCluster(3) as c:
        c.db = c.dir / "mlflow.db"
        c.uri = c.mlflow_server(c.db)
        # the study's storage on the login node's address: submitit's trials report to it from the nodes (xp's slot
        # jobs report to the scheduler, its only writer: a SQLite file would do; the same storage keeps it even)
        server = pg.Server("bench-pw", host=c.launcher.address, enter=tuple(c.launcher.enter())).start()
        c.storage = server.url("optuna")
        print(f"{args.trials} trials of up to {args.epochs} epochs (median pruner), {args.parallel} at a time, "
              f"on a 2-node Slurm 22.05 cluster of namespaces")
        print(f"{'way':<10} {'rep':>3} {'wall s':>7} {'busy':>6} {'cover':>6} {'jobs':>5} {'trials':>6} {'sacct lines':>11}")
        for rep in range(args.reps):
            for way in ("slots", "submitit"):  # interleaved: the machine's drift hits both
                m = one(c, way, rep, args)
                print(f"{way:<10} {rep:>3} {m['wall']:>7.1f} {m['busy']:>6.3f} {m['cover']:>6.3f} {m['jobs']:>5} "
                      f"{m['trials']:>6} {m['sacct_lines']:>11}", flush=True)
        server.stop()


if __name__ == "__main__":
    main()
