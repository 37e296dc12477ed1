"""The same experiment on every backend, side by side: xp's logged throughput for gluon, module and torch.

One fixed random batch in memory (dataset=synthetic), the same model, batch and optimizer, one CPU
device; each candidate is a full `python -m xp` in a process of its own (tracking included), interleaved A B C A
B C.
No target: a measurement, reported as torch / gluon and module / gluon. Then `xp.report` builds
its "Backends side by side" section from the runs, as a user would.

--loaded adds each backend beside a CPU-bound process of one core (a busy loop started for the measurement and
ended after it), in the same rounds: target, each backend loaded at least half its quiet speed (torch fitted its
threads to the cores left: backend.fit_threads; --loaded-fixed adds torch with its own thread count throughout).

    .venv/bin/python benchmarks/backends_side_by_side.py [--model resnet18] [--size 32] [--batch 32] [--reps 3]
    .venv/bin/python benchmarks/backends_side_by_side.py --model lenet --size 8 --backends gluon torch --loaded
"""

from __future__ import annotations

import subprocess
import sys

from common import ROOT, interleave, process_throughput, report, synthetic_args, synthetic_overrides, temp_store


def main() -> int:
    ap = synthetic_args(__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["gluon", "module", "torch"])
    ap.add_argument("--loaded", action="store_true", help="also beside a CPU-bound process of one core")
    ap.add_argument("--loaded-fixed", action="store_true", help="and torch loaded with fit_threads=false")
    args = ap.parse_args()
    uri = temp_store()

    from mlflow.tracking import MlflowClient

    from xp.report import build as xp_report

    overrides = synthetic_overrides(args)
    client = MlflowClient(uri)

    def xp(backend: str, *more: str, load: bool = False):
        def measure() -> float:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load else None
            try:
                return process_throughput(f"backend={backend}", *overrides, *more)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
        return measure

    candidates = {b: xp(b) for b in args.backends}
    pairs = [(b, args.backends[0], 0.0) for b in args.backends[1:]]
    if args.loaded:
        candidates.update({f"{b} loaded": xp(b, load=True) for b in args.backends})
        pairs += [(f"{b} loaded", b, 0.5) for b in args.backends]
    if args.loaded_fixed and "torch" in args.backends:
        candidates["torch loaded, fit_threads=false"] = xp("torch", "backend.fit_threads=false", load=True)
        pairs += [("torch loaded, fit_threads=false", "torch", 0.0)]
    results = interleave(candidates, args.reps)
    report(f"backends side by side: {args.model}, {args.batch}x3x{args.size}x{args.size}, one CPU device"
           + (", quiet and beside a CPU-bound process of one core" if args.loaded else ""),
           results, pairs, f"backends_{args.model}{'_loaded' if args.loaded else ''}.json")
    runs = client.search_runs([client.get_experiment_by_name("xp").experiment_id])
    md = xp_report.build_report(runs, ROOT / "benchmarks" / "results" / f"backends_{args.model}",
                                "Backends side by side")
    print(md.read_text().split("## Backends side by side")[1].split("![")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
