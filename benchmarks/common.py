"""Helpers shared by the benchmarks: interleaved repetitions, a temporary MLflow store, and studies run in a work
folder of their own."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' image-folder generators


def compose(*overrides: str) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3", job_name="bench"):
        return OmegaConf.to_container(hydra_compose("config", overrides=list(overrides)), resolve=True)


def synthetic_args(description: str) -> Any:
    """Arguments of the benchmarks that train on one random batch in memory (dataset=synthetic)."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="resnet18", help="conf/model option")
    ap.add_argument("--size", type=int, default=32, help="image height and width")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per measurement; the median counts")
    ap.add_argument("--reps", type=int, default=3)
    return ap


def synthetic_overrides(args: Any, classes: int = 10, warmup: int = 2) -> list[str]:
    """The experiment of synthetic_args: the model on one random in-memory batch, a constant lr."""
    return [f"model={args.model}", "dataset=synthetic", f"dataset.image_shape=[3,{args.size},{args.size}]",
            f"dataset.num_classes={classes}", f"dataset.train_size={args.batch * args.steps}",
            f"dataset.val_size={args.batch}", f"batch={args.batch}", f"epochs={args.epochs}",
            f"timing_warmup_batches={warmup}", "lr_schedule=constant"]


def temp_store() -> str:
    """Benchmarks log to a throw-away MLflow store, not the user's."""
    uri = f"sqlite:///{tempfile.mkdtemp(prefix='xp-bench-')}/mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def logged_throughput(*overrides: str) -> float:
    """Run the experiment through xp (tracking included) and return the throughput it logged (median of its epochs)."""
    from mlflow.tracking import MlflowClient

    from xp.run.experiment import run

    run(compose(*overrides))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    last = client.search_runs([client.get_experiment_by_name("xp").experiment_id],
                              order_by=["attributes.start_time DESC"], max_results=1)[0]
    return float(last.data.params["summary.throughput_samples_per_s"])


def process_throughput(*overrides: str) -> float:
    """As logged_throughput, in a process of its own (`python -m xp`, as a user runs it: its frameworks start
    their threads afresh, not in a process where another framework ran before)."""
    import subprocess

    from mlflow.tracking import MlflowClient

    out = tempfile.mkdtemp(prefix="xp-bench-run-")
    subprocess.run([sys.executable, "-m", "xp", *overrides, f"hydra.run.dir={out}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, timeout=1800)
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    last = client.search_runs([client.get_experiment_by_name("xp").experiment_id],
                              order_by=["attributes.start_time DESC"], max_results=1)[0]
    return float(last.data.params["summary.throughput_samples_per_s"])


def interleave(candidates: dict, reps: int) -> dict[str, list[float]]:
    """Run each candidate once per round, rounds repeated `reps` times (A B A B ...), so slow
    drifts of a noisy machine hit all candidates alike. Each returns samples/s."""
    import gc

    results: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(reps):
        for name, fn in candidates.items():
            gc.collect()  # the previous candidate's readers and their threads are gone before we time
            results[name].append(fn())
            print(f"  round {r + 1}/{reps}  {name:<28} {results[name][-1]:10.1f} samples/s", flush=True)
    return results


def report(title: str, results: dict[str, list[float]], pairs: list[tuple[str, str, float]], out: str) -> bool:
    """Print medians and ratios (xp / reference) against their targets; save JSON; True if all met."""
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n{title}")
    for name, values in results.items():
        print(f"  {name:<28} median {med[name]:10.1f} samples/s   (runs: {', '.join(f'{v:.1f}' for v in values)})")
    ok = True
    rows = []
    for xp_name, ref_name, target in pairs:
        ratio = med[xp_name] / med[ref_name]
        met = ratio >= target
        ok &= met
        rows.append({"xp": xp_name, "reference": ref_name, "ratio": ratio, "target": target, "met": met})
        print(f"  ratio {xp_name} / {ref_name} = {ratio:.3f}  (target >= {target}: {'met' if met else 'NOT met'})")
    path = ROOT / "benchmarks" / "results" / out
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"title": title, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                                "runs": results, "median": med, "ratios": rows}, indent=1))
    print(f"  saved {path.relative_to(ROOT)}")
    return ok


# --- a benchmark's studies: `python -m xp -m sweep=NAME` in a work folder (its study files in work/sweeps, its Optuna
# storage and MLflow store there), this checkout's xp whichever the environment has
def study_env(work: Path) -> dict[str, str]:
    return dict(os.environ, XP_SWEEPS_DIR=str(work / "sweeps"), XP_OPTUNA_STORAGE=f"sqlite:///{work}/optuna.db",
                PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))


def study_command(work: Path, name: str, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "xp", "-m", f"sweep={name}", *overrides, f"tracking_uri=sqlite:///{work}/mlflow.db",
            f"hydra.sweep.dir={work}/sweep-{name}"]


def run_study(work: Path, name: str, *overrides: str, timeout: float = 3600) -> None:
    """Run the study `name` (its file work/sweeps/NAME.yaml) to its end; its error's tail on a failure."""
    proc = subprocess.run(study_command(work, name, *overrides), cwd=work, env=study_env(work), capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"study {name}: exit {proc.returncode}: {proc.stderr[-3000:]}")
