"""Communication overhead per step: MXNet's parameter server (dist_sync) and Horovod (gloo) against
one process, side by side on this machine, everything on 127.0.0.1.

Every candidate trains the same small model on the same global batch of in-memory random
data (dataset=synthetic) through `python -m xp`, and reports xp's logged throughput (the
total across workers, warm-up batches excluded). Per-step time = global batch / throughput;
the overhead of a candidate is its step time minus the single process's. Candidates run
interleaved (A B C A B C ...) so the machine's drift hits all alike.

    .venv/bin/python benchmarks/comm_overhead.py [--model lenet] [--size 32] [--batch 64] [--reps 3]

On a 2-core machine two workers share the cores that one process uses alone, so the
2-worker rows show what the engines cost when nothing is gained from more hardware: the
overhead, not a speed-up. The 1-worker parameter-server row isolates the push/pull round
trip through a server with the single process's compute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import ROOT, temp_store


def throughput(uri: str, overrides: list[str], out: str) -> float:
    """Run `python -m xp` and return the median over epochs of the run's logged throughput."""
    from mlflow.tracking import MlflowClient

    name = f"bench-{time.monotonic_ns()}"
    r = subprocess.run([sys.executable, "-m", "xp", *overrides, f"run_name={name}", f"tracking_uri={uri}",
                        f"hydra.run.dir={out}/{name}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(overrides)} failed:\n{r.stderr[-3000:]}")
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("xp").experiment_id],
                             filter_string=f"attributes.run_name = '{name}'")[0]
    return statistics.median(m.value for m in client.get_metric_history(run.info.run_id, "throughput_samples_per_s"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet", help="conf/model option")
    ap.add_argument("--size", type=int, default=32, help="image height and width")
    ap.add_argument("--batch", type=int, default=64, help="global batch (2 workers: half each)")
    ap.add_argument("--steps", type=int, default=40, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    uri = temp_store()
    out = os.path.dirname(uri[len("sqlite:///"):])
    common = [f"model={args.model}", "dataset=synthetic", f"dataset.image_shape=[3,{args.size},{args.size}]",
              "dataset.num_classes=10", f"dataset.train_size={args.batch * args.steps}", "dataset.val_size=64",
              f"epochs={args.epochs}", "lr_schedule=constant"]
    half = args.batch // 2
    candidates = {
        "single process": ["kvstore=local", f"batch={args.batch}"],
        "dist_sync 1 worker": ["kvstore=dist_sync", "workers=1", f"batch={args.batch}"],
        "dist_sync 2 workers": ["kvstore=dist_sync", "workers=2", f"batch={half}"],
        "horovod 2 workers": ["backend=horovod", "workers=2", f"batch={half}"],
    }
    runs: dict[str, list[float]] = {k: [] for k in candidates}
    for rep in range(args.reps):
        for name, extra in candidates.items():
            runs[name].append(throughput(uri, [*common, *extra], out))
            print(f"  round {rep + 1}/{args.reps}  {name:<22} {runs[name][-1]:10.1f} samples/s", flush=True)

    med = {k: statistics.median(v) for k, v in runs.items()}
    step_ms = {k: 1000 * args.batch / v for k, v in med.items()}
    base = step_ms["single process"]
    print(f"\nper-step time, {args.model} {args.size}x{args.size}, global batch {args.batch}, {os.cpu_count()} CPUs")
    rows = []
    for name in candidates:
        over = step_ms[name] - base
        rows.append({"candidate": name, "samples_per_s": med[name], "step_ms": step_ms[name], "overhead_ms": over,
                     "relative": step_ms[name] / base})
        print(f"  {name:<22} {med[name]:9.1f} samples/s  {step_ms[name]:7.2f} ms/step  "
              f"overhead {over:+7.2f} ms ({step_ms[name] / base:.2f}x)")
    path = ROOT / "benchmarks" / "results" / f"comm_overhead_{args.model}_{args.size}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                                "args": vars(args), "runs": runs, "rows": rows}, indent=1))
    print(f"  saved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
