"""The same experiment on every backend, side by side: xp's logged throughput for gluon, module and torch.

One fixed random batch in memory (dataset=synthetic), the same model, batch and optimizer, one CPU
device; each candidate is a full `xp.run.experiment.run` (tracking included), interleaved A B C A B C.
No target: a measurement, reported as torch / gluon and module / gluon. Then `xp.report` builds
its "Backends side by side" section from the runs, as a user would.

    .venv/bin/python benchmarks/backends_side_by_side.py [--model resnet18] [--size 32] [--batch 32] [--reps 3]
"""

from __future__ import annotations

from common import ROOT, interleave, logged_throughput, report, synthetic_args, synthetic_overrides, temp_store


def main() -> int:
    ap = synthetic_args(__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["gluon", "module", "torch"])
    args = ap.parse_args()
    uri = temp_store()

    from mlflow.tracking import MlflowClient

    from xp.report import build as xp_report

    overrides = synthetic_overrides(args)
    client = MlflowClient(uri)

    def xp(backend: str):
        return lambda: logged_throughput(f"backend={backend}", *overrides)

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
