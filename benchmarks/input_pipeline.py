"""The input-pipeline recipe's speed figures, on a quiet machine (the test checks the recipe's report against its
runs; how much the decode threads buy is a speed figure, measured here). Runs `python -m xp -m
sweep=input_pipeline` in a fresh store --reps times and prints, per thread count, the median throughput and each
run's verdict, the knee (the fewest threads within 5% of the best), and the targets: the best thread count at
least 1.5x the throughput at 1 thread, input-bound at 1 thread, not input-bound at the knee (exit 1 when missed).

    .venv/bin/python benchmarks/input_pipeline.py [--reps 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def once() -> tuple[dict[int, float], dict[int, str]]:
    from mlflow import MlflowClient

    work = Path(tempfile.mkdtemp(prefix="xp-bench-input-"))
    uri = f"sqlite:///{work}/mlflow.db"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, XP_OPTUNA_STORAGE=f"sqlite:///{work}/optuna.db")
    p = subprocess.run([sys.executable, "-m", "xp", "-m", "sweep=input_pipeline", f"hydra.sweep.dir={work}/sweep"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"the recipe failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    client = MlflowClient(uri)
    runs = [r for r in client.search_runs([client.get_experiment_by_name("xp").experiment_id])
            if r.data.tags.get("xp.recipe") == "input_pipeline"]
    thr = {int(r.data.params["data_nthreads"]): float(r.data.params["summary.throughput_samples_per_s"]) for r in runs}
    return thr, {int(r.data.params["data_nthreads"]): r.data.tags["xp.diagnosis"] for r in runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    results = [once() for _ in range(args.reps)]
    threads = sorted(results[0][0])
    thr = {t: statistics.median(r[0][t] for r in results) for t in threads}
    verdicts = {t: [r[1][t] for r in results] for t in threads}
    best = max(thr, key=thr.get)
    knee = min(t for t in threads if thr[t] >= 0.95 * thr[best])
    print("| decode threads | samples/s (median) | vs 1 thread | verdicts |")
    print("|---|---|---|---|")
    for t in threads:
        print(f"| {t}{' (knee)' if t == knee else ''} | {thr[t]:.0f} | {thr[t] / thr[threads[0]]:.2f}x | "
              f"{', '.join(verdicts[t])} |")
    ratio = thr[best] / thr[threads[0]]
    checks = {f"best / 1 thread = {ratio:.2f} >= 1.5": ratio >= 1.5,
              "input-bound at 1 thread": all(v == "input-bound" for v in verdicts[threads[0]]),
              f"not input-bound at the knee ({knee})": all(v != "input-bound" for v in verdicts[knee])}
    for what, ok in checks.items():
        print(f"{'met' if ok else 'MISSED'}: {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
