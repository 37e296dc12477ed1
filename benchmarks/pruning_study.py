"""Pruning must save compute: a grid sweep over lr x batch against a TPE + median-pruner study
over the same values, on digits. Target: the study's best validation accuracy within 0.5
points of the grid's best, with at most half of the grid's total epochs. The study runs twice:
from its file (sweeps/tpe_lr_batch.yaml), and with its search space given on the command line
in Hydra's sweep syntax (lr=0.005,...,0.1 batch=16,32,64 replacing the file's).

    .venv/bin/python benchmarks/pruning_study.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


CLI_SPACE = ["lr=0.005,0.01,0.02,0.05,0.1", "batch=16,32,64"]


def run_study(name: str, seed: int, *extra: str, label: str | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"xp-bench-{name}-"))
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{work}/mlflow.db",
               XP_OPTUNA_STORAGE=f"sqlite:///{work}/optuna.db")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xp", "-m", f"sweep={name}", f"seed={seed}", *extra,
                           f"hydra.sweep.dir={work}/sweep"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed: {proc.stderr[-2000:]}")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("xp").experiment_id])
    trials = [r for r in runs if "optuna.trial_state" in r.data.tags]
    complete = [r for r in trials if r.data.tags["optuna.trial_state"] == "COMPLETE"]
    return {"study": label or name, "trials": len(trials), "pruned": len(trials) - len(complete),
            "epochs": int(sum(int(r.data.params["summary.epochs_completed"]) for r in trials)),
            "best_val_accuracy": max(r.data.metrics["val_accuracy"] for r in complete),
            "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="run seeds (weights and data order)")
    args = ap.parse_args()
    rows, ok = [], True
    for seed in args.seeds:
        grid = run_study("grid_lr_batch", seed)
        print(f"seed {seed}  {grid['study']:<18} {grid['trials']:>3} trials ({grid['pruned']:>2} pruned)  "
              f"{grid['epochs']:>4} epochs  best val_accuracy {grid['best_val_accuracy']:.4f}  {grid['seconds']:.0f}s")
        for tpe in (run_study("tpe_lr_batch", seed),
                    run_study("tpe_lr_batch", seed, *CLI_SPACE, label="tpe, space on CLI")):
            gap = (grid["best_val_accuracy"] - tpe["best_val_accuracy"]) * 100
            share = tpe["epochs"] / grid["epochs"]
            met = gap <= 0.5 and share <= 0.5
            ok &= met
            rows.append({"seed": seed, "grid": grid, "tpe": tpe, "gap_points": gap, "epoch_share": share, "met": met})
            print(f"seed {seed}  {tpe['study']:<18} {tpe['trials']:>3} trials ({tpe['pruned']:>2} pruned)  "
                  f"{tpe['epochs']:>4} epochs  best val_accuracy {tpe['best_val_accuracy']:.4f}  {tpe['seconds']:.0f}s"
                  f"  -> {gap:+.2f} points behind the grid's best with {share:.0%} of its epochs "
                  f"(target: <= 0.5 points, <= 50%): {'met' if met else 'NOT met'}")
    out = ROOT / "benchmarks" / "results" / "pruning_study.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
