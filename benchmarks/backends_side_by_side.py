"""The same experiment on every backend, side by side: xp's logged throughput for gluon, module and torch.

One fixed random batch in memory (dataset=synthetic), the same model, batch and optimizer, one CPU
device; each candidate is a full `xp.experiment.run` (tracking included), interleaved A B C A B C.
No target: a measurement, reported as torch / gluon and module / gluon. Then `xp.report` builds
its "Backends side by side" section from the runs, as a user would.

    .venv/bin/python benchmarks/backends_side_by_side.py [--model resnet18] [--size 32] [--batch 32] [--reps 3]
"""

from __future__ import annotations

import argparse

from common import ROOT, compose, interleave, report, temp_store


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", help="conf/model option")
    ap.add_argument("--size", type=int, default=32, help="image height and width")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per measurement; the median counts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends", nargs="+", default=["gluon", "module", "torch"])
    args = ap.parse_args()
    uri = temp_store()

    from mlflow.tracking import MlflowClient

    from xp import report as xp_report
    from xp.experiment import run

    overrides = [f"model={args.model}", "dataset=synthetic", f"dataset.image_shape=[3,{args.size},{args.size}]",
                 "dataset.num_classes=10", f"dataset.train_size={args.batch * args.steps}",
                 f"dataset.val_size={args.batch}", f"batch={args.batch}", f"epochs={args.epochs}",
                 "timing_warmup_batches=2", "lr_schedule=constant"]
    client = MlflowClient(uri)

    def xp(backend: str):
        def measure() -> float:
            run(compose(f"backend={backend}", *overrides))
            last = client.search_runs([client.get_experiment_by_name("xp").experiment_id],
                                      order_by=["attributes.start_time DESC"], max_results=1)[0]
            return last.data.metrics["summary.throughput"]  # median over epochs, as xp logs it
        return measure

    results = interleave({b: xp(b) for b in args.backends}, args.reps)
    base = args.backends[0]
    report(f"backends side by side: {args.model}, {args.batch}x3x{args.size}x{args.size}, one CPU device",
           results, [(b, base, 0.0) for b in args.backends[1:]], f"backends_{args.model}.json")
    runs = client.search_runs([client.get_experiment_by_name("xp").experiment_id])
    md = xp_report.build_report(runs, ROOT / "benchmarks" / "results" / f"backends_{args.model}",
                                "Backends side by side")
    print(md.read_text().split("## Backends side by side")[1].split("![")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
