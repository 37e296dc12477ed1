"""Multi-objective pruning, measured: the hypervolume of a two-objective study (validation accuracy and samples/s,
`sweeps/accuracy_throughput.yaml`'s question on the default experiment) over the compute it spent, with xp's
Pareto rule (`pruner: pareto`, xp.studies.pruning) against the same study unpruned, on the same seeds.

Each study runs on one slot (`parallel: 1`). Its compute is the training's: the sum of the epochs' times
(`epoch_time_s`) of every epoch any of its trials trained, from MLflow (a trial's set-up, the same for a pruned one,
is left out: on digits it is as long as the training, which no search would be run for). The hypervolume is
of the complete trials' final (accuracy, samples/s), throughput divided by the largest any study measured, from a
reference point of the worst accuracy and throughput any study measured (shared by both arms of a seed). Two
hypervolumes: of the throughput each trial measured, and of its batch's median throughput over every trial of the
benchmark ("by batch": LeNet's samples/s on digits is a function of the batch, which lr does not change, and a
trial's own figure varies by +-20% with what else the machine does: the measured one compares the machine's
moments as much as the searches).

    .venv/bin/python benchmarks/pareto_pruning.py [--seeds 5] [--trials 24] [--epochs 4] [--rules 2,1]

Goal (issue 83): the pruned study reaches 0.95 of the unpruned study's final hypervolume in at most 60% of the
unpruned study's compute.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import run_study

STUDY = """\
study_name: {name}
n_trials: {trials}
parallel: 1
sampler: tpe
sampler_seed: {seed}
pruner: {pruner}
pruner_options: {options}
objectives:
  - {{metric: val_accuracy, direction: maximize}}
  - {{metric: throughput, direction: maximize}}
params:
  lr: {{type: float, low: 0.005, high: 0.1, log: true}}
  batch: {{type: categorical, choices: [8, 16, 32, 64, 128]}}
"""


def study(work: Path, name: str, seed: int, trials: int, epochs: int, dominators: int | None) -> list[tuple]:
    """Run one study (unless the work folder has it); its trials, in the order they ended, as
    [(training s, state, values, batch)]."""
    pruner, options = ("none", "{}") if dominators is None else \
        ("pareto", f"{{n_startup_trials: 4, n_warmup_steps: 1, min_dominators: {dominators}}}")
    (work / "sweeps" / f"{name}.yaml").write_text(STUDY.format(name=name, trials=trials, seed=seed, pruner=pruner,
                                                              options=options))
    import mlflow
    import optuna

    if not (work / f"sweep-{name}").exists():
        run_study(work, name, f"epochs={epochs}", timeout=1800)

    trials_of = optuna.load_study(study_name=name, storage=f"sqlite:///{work}/optuna.db").trials
    client = mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
    done = [t for t in trials_of if t.datetime_complete is not None]
    return [(sum(m.value for m in client.get_metric_history(t.user_attrs["mlflow_run_id"], "epoch_time_s")),
             t.state.name, t.values, t.params["batch"]) for t in sorted(done, key=lambda t: t.datetime_complete)]


def hypervolume(points: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """The area (both maximised) dominated by `points` above `ref`."""
    area, best_y = 0.0, ref[1]
    for x, y in sorted(points, reverse=True):  # by accuracy, best first: each adds its strip of new throughput
        if y > best_y and x > ref[0]:
            area += (x - ref[0]) * (y - best_y)
            best_y = y
    return area


def curve(trials: list[tuple], ref: tuple[float, float], scale: float,
          by_batch: dict[int, float] | None = None) -> list[tuple[float, float]]:
    """(compute so far, hypervolume so far) after each trial; `by_batch`: a batch's throughput for the trial's."""
    out, spent, points = [], 0.0, []
    for seconds, state, values, batch in trials:
        spent += seconds
        if state == "COMPLETE":
            points.append((values[0], (by_batch[batch] if by_batch else values[1]) / scale))
        out.append((spent, hypervolume(points, ref)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rules", default="2,1", help="min_dominators of the pruned arms")
    ap.add_argument("--work", help="an earlier run's work folder: its studies are read, not run again")
    args = ap.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="xp-bench-pareto-"))
    (work / "sweeps").mkdir(exist_ok=True)
    rules = [int(r) for r in args.rules.split(",")]
    arms: dict[int, dict[str, list[tuple]]] = {}
    for seed in range(args.seeds):
        arms[seed] = {"none": study(work, f"none{seed}", seed, args.trials, args.epochs, None)}
        for r in rules:
            arms[seed][f"pareto{r}"] = study(work, f"pareto{r}_{seed}", seed, args.trials, args.epochs, r)
        print(f"seed {seed}: " + ", ".join(f"{k}: {sum(t[1] == 'PRUNED' for t in v)} pruned, "
                                           f"{sum(t[0] for t in v):.0f} s" for k, v in arms[seed].items()),
              flush=True)
    complete = [t for a in arms.values() for trials in a.values() for t in trials if t[1] == "COMPLETE"]
    batches = {b: statistics.median(t[2][1] for t in complete if t[3] == b) for b in {t[3] for t in complete}}
    print(f"\n{args.trials} trials a study, {args.epochs} epochs a trial, {args.seeds} seeds; work folder {work}")
    print("median samples/s by batch: " + ", ".join(f"{b}: {v:.0f}" for b, v in sorted(batches.items())))
    for label, by_batch in (("measured", None), ("by batch", batches)):
        throughput = [by_batch[t[3]] if by_batch else t[2][1] for t in complete]
        scale = max(throughput)
        ref = (min(t[2][0] for t in complete), min(throughput) / scale)
        print(f"\nhypervolume of the throughput {label}:\n")
        say(arms, rules, ref, scale, by_batch, args.trials)


def say(arms: dict, rules: list[int], ref: tuple[float, float], scale: float, by_batch: dict | None,
        trials: int) -> None:
    print("| pruner | trials pruned (median) | compute, of the unpruned study's (median) | final hypervolume, of "
          "the unpruned's (median, min) | compute to 0.95 of the unpruned's final hypervolume, of its compute "
          "(median; seeds that reached it) | goal (0.95 in <= 60%) |")
    print("|---|---|---|---|---|---|")
    for arm in ["none", *(f"pareto{r}" for r in rules)]:
        pruned, spent, final, reach = [], [], [], []
        for seed, a in arms.items():
            base = curve(a["none"], ref, scale, by_batch)
            mine = curve(a[arm], ref, scale, by_batch)
            total, goal = base[-1][0], 0.95 * base[-1][1]
            pruned.append(sum(t[1] == "PRUNED" for t in a[arm]))
            spent.append(mine[-1][0] / total)
            final.append(mine[-1][1] / base[-1][1])
            at = next((s for s, hv in mine if hv >= goal), None)
            if at is not None:
                reach.append(at / total)
        met = len(reach) == len(arms) and statistics.median(reach) <= 0.6
        name = "none" if arm == "none" else f"pareto, min_dominators {arm[6:]}"
        print(f"| {name} | {statistics.median(pruned):.0f} of {trials} | {statistics.median(spent):.2f} | "
              f"{statistics.median(final):.3f}, {min(final):.3f} | "
              f"{statistics.median(reach) if reach else float('nan'):.2f} ({len(reach)} of {len(arms)}) | "
              f"{'met' if met else 'not met'} |")


if __name__ == "__main__":
    main()
