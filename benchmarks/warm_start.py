"""A warm start against a cold one, with seeds: after a study, the question changes (more epochs; another backend;
a narrower lr range) and a new study asks it, once from nothing (cold) and once warm-started from the earlier
study's trials (`sweep.warm_start=EARLIER`). For each pair and seed S (the training's `seed` and the search's
`sweep.sampler_seed` both S): the earlier study, then the cold and the warm study at the same budget, on
sweeps/lr_batch.yaml's space (lr, batch, momentum) of the default experiment (LeNet on digits).

Reported per pair, from each study's answer (xp.answers) and its trials in their order: how many trials
the warm study needs to reach the cold study's final best (median over seeds, and as a share of the budget), and
the two final bests (mean +- standard error across seeds).

    .venv/bin/python benchmarks/warm_start.py [--seeds 0 1 2 3 4] [--trials 10] [--pairs epochs backend narrower]

Goals (issue 82): the warm study needs at most half the cold one's trials (median), and its final best is never
worse than the cold one's by more than one standard error. Figures: stdout and benchmarks/results/warm_start.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# pair: (the earlier study's settings, the new question's settings)
PAIRS = {
    "epochs": (["epochs=1"], ["epochs=3"]),
    "backend": (["backend=gluon", "epochs=2"], ["backend=torch", "epochs=2"]),
    "narrower": (["epochs=2"], ["epochs=2", "lr=tag(log, interval(0.01, 0.1))"]),
}


def study(name: str, seed: int, trials: int, settings: list[str], work: Path, warm: str | None = None) -> dict:
    """One study: `python -m xp -m sweep=lr_batch ...`; its answer and its trials' values in their order."""
    import optuna

    from xp.studies.summary import kept

    storage = f"sqlite:///{work}/optuna.db"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xp", "-m", "sweep=lr_batch", f"seed={seed}",
                           f"sweep.sampler_seed={seed}", f"sweep.study_name={name}", f"sweep.n_trials={trials}",
                           *([f"sweep.warm_start={warm}"] if warm else []), *settings,
                           f"tracking_uri=sqlite:///{work}/mlflow.db", f"hydra.sweep.dir={work}/sweep-{name}"],
                          cwd=work, env=dict(os.environ, XP_OPTUNA_STORAGE=storage), capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    s = optuna.load_study(study_name=name, storage=storage)
    answer = kept(s)
    values = [t.value if t.state.name == "COMPLETE" else None for t in s.get_trials(deepcopy=False)
              if "duplicate_of" not in t.user_attrs]
    best = answer.first.values["val_accuracy"] if answer is not None and answer.first else float("nan")
    return {"study": name, "best": best, "values": values, "wall_s": time.perf_counter() - t0}


def needed(values: list[float | None], target: float) -> int | None:
    """The trials (in order) a study ran until one reached `target`; None: none did."""
    for n, v in enumerate(values, 1):
        if v is not None and v >= target:
            return n
    return None


def mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--trials", type=int, default=10, help="each study's budget (the earlier one's too)")
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "warm_start.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xp-bench-warm-"))
    rows = []
    for pair in args.pairs:
        before, after = PAIRS[pair]
        for seed in args.seeds:
            tag = f"{pair}-s{seed}"
            earlier = study(f"{tag}-earlier", seed, args.trials, before, work)
            cold = study(f"{tag}-cold", seed, args.trials, after, work)
            warm = study(f"{tag}-warm", seed, args.trials, after, work, warm=earlier["study"])
            rows.append({"pair": pair, "seed": seed, "earlier": earlier, "cold": cold, "warm": warm,
                         "warm_needs": needed(warm["values"], cold["best"]),
                         "cold_needs": needed(cold["values"], cold["best"])})
            print(f"{tag}: cold best {cold['best']:.4f} (trial {rows[-1]['cold_needs']}), warm best "
                  f"{warm['best']:.4f}, warm reaches the cold best at trial {rows[-1]['warm_needs']}", flush=True)
    print(f"\n| pair | trials | warm needs (median, of {args.trials}) | cold needs (median) | cold best | warm best "
          "| warm within 1 SE |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for pair in args.pairs:
        mine = [r for r in rows if r["pair"] == pair]
        warm_needs = [r["warm_needs"] if r["warm_needs"] is not None else args.trials + 1 for r in mine]
        cold_needs = [r["cold_needs"] for r in mine]
        (cm, cse), (wm, wse) = mean_se([r["cold"]["best"] for r in mine]), mean_se([r["warm"]["best"] for r in mine])
        ok = wm >= cm - cse
        summary[pair] = {"warm_needs_median": statistics.median(warm_needs), "cold_needs_median":
                         statistics.median(cold_needs), "cold_best": [cm, cse], "warm_best": [wm, wse],
                         "within_se": ok, "never_reached": sum(r["warm_needs"] is None for r in mine)}
        median = statistics.median(warm_needs)
        print(f"| {pair} | {args.trials} | {median:g} ({median / args.trials:.0%})"
              f" | {statistics.median(cold_needs):g} | {cm:.4f} +- {cse:.4f} | {wm:.4f} +- {wse:.4f} | "
              f"{'yes' if ok else 'no'} |")
    print(f"(seeds {args.seeds}; a warm study that never reached the cold best counts as {args.trials + 1}; "
          f"work folder {work})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
