"""Which search finds good settings soonest for the training it spends: xp's searches against Ray Tune's and a
bare Optuna loop's, on the same training (xp's run of LeNet: its model, data, optimizer and epochs), 5 seeds each.

Searches (lr in [0.001, 0.5] log, momentum in [0.5, 0.99]; constant lr; a trial at most EPOCHS epochs; batch 32):
  xp-tpe-median   xp's study: TPE, median pruner (xp's defaults: 3 start-up trials, 2 warm-up epochs)
  xp-hyperband    xp's study: TPE, Hyperband pruner (successive halving in brackets, min resource 1 epoch)
  xp-random       xp's study: random search, no pruner
  xp-pbt          xp's population: 4 members, an exploit every 2 epochs (sweeps/pbt_lr.yaml's rules)
  xp-warm         xp's study warm-started (sweep.warm_start) from an earlier study of a cheaper question on the
                  same data (half the epochs, 8 trials, not counted in the budget: said beside it), TPE + median
  optuna-bare     a bare Optuna loop (TPE seeded, MedianPruner with the same settings), 2 processes on one storage
  ray-asha        Ray Tune 2.60: random search with ASHA (grace 1 epoch, reduction 3, max EPOCHS)
  ray-pbt         Ray Tune's PopulationBasedTraining: 4 members, every 2 epochs, the same explore factors
The peers' trials run xp's training in their own processes (a Ray worker, an Optuna process) through xp's
experiment runner, told each epoch's accuracy as xp's own trials are (xp.studies.trial.StudyTrial); the whole
benchmark runs in a network namespace of its own (Ray listens on every interface: study_scale.own_network).

Compute is counted in epochs trained (every epoch of every trial, a PBT member's included; each epoch the same
work: batch 32 over the same images), in the order they ended, from the runs' MLflow records: a search's budget
is BUDGET epochs (16 full trials), what it trains beyond is not counted. Figures per search and task, over seeds:
the epochs trained when the best validation accuracy so far first reached the task's target (median; "never" when
a seed did not within the budget), and the best validation accuracy at the budget (median, and min-max).

Tasks: `digits` (the default experiment) and `noisy` (`dataset.noise=1.0`: Gaussian noise of one pixel standard
deviation on every image, fixed per image: its best accuracy is about 0.76, and a learning rate off by 3x loses
10 points, so searches can be told apart; the clean digits' best is about 0.98, reached by most settings).

    .venv/bin/python benchmarks/search_quality.py [--seeds 5] [--searches ...] [--tasks digits,noisy]
Figures: stdout, benchmarks/results/search_quality.json, and the plot docs/images/search-quality.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # (this checkout's xp; common, study_scale)

from common import compose, run_study  # noqa: E402

EPOCHS, BUDGET, INTERVAL, POPULATION = 6, 96, 2, 4
TASKS = {"digits": [], "noisy": ["dataset.noise=1.0"]}
TARGET = {"digits": 0.975, "noisy": 0.74}
COMMON = ["lr_schedule=constant", "model.log=none"]  # (the same for every search; no model files to write)
SEARCHES = ["xp-tpe-median", "xp-hyperband", "xp-random", "xp-pbt", "xp-warm", "optuna-bare", "ray-asha", "ray-pbt"]
SPACE = "  lr: {type: float, low: 0.001, high: 0.5, log: true}\n  momentum: {type: float, low: 0.5, high: 0.99}\n"


# --- xp's searches: a study file and `python -m xp -m sweep=...` -----------------------------------------------
def xp_study(search: str, name: str, seed: int) -> tuple[str, int]:
    """The study file of an xp search, and the member epochs (a PBT's: it trains longer members)."""
    head = f"study_name: {name}\nsampler_seed: {seed}\nparallel: 2\nobjectives: [{{metric: val_accuracy, " \
           f"direction: maximize}}]\nparams:\n{SPACE}"
    if search == "xp-pbt":
        return head + (f"search: pbt\nn_trials: {BUDGET // INTERVAL}\npbt:\n  population: {POPULATION}\n"
                       f"  interval: {INTERVAL}\n  quantile: 0.25\n  explore:\n"
                       "    lr: {factors: [0.8, 1.2], resample: 0.25}\n"
                       "    momentum: {factors: [0.8, 1.2], resample: 0.25}\n"), BUDGET // POPULATION
    pruner = {"xp-hyperband": "hyperband", "xp-random": "none"}.get(search, "median")
    sampler = "random" if search == "xp-random" else "tpe"
    # a pruned search's trials are shorter: enough of them to spend the budget (Hyperband stops most after 1-2)
    trials = BUDGET // EPOCHS * {"none": 1, "median": 2, "hyperband": 3}[pruner]
    warm = f"warm_start: {name}-source\n" if search == "xp-warm" else ""
    return head + f"sampler: {sampler}\npruner: {pruner}\nn_trials: {trials}\n{warm}", EPOCHS


def run_xp_search(work: Path, search: str, task: str, seed: int) -> str:
    """Run it; returns the MLflow experiment its runs are in."""
    name = f"{search}-{task}-{seed}"
    sweeps = work / "sweeps"
    if search == "xp-warm":  # the earlier, cheaper question: half the epochs, 8 trials
        (sweeps / f"{name}-source.yaml").write_text(
            f"study_name: {name}-source\nsampler_seed: {seed}\nparallel: 2\nsampler: tpe\npruner: none\nn_trials: 8\n"
            f"params:\n{SPACE}")
        run_study(work, f"{name}-source", *COMMON, *TASKS[task], f"epochs={EPOCHS // 2}", "experiment=source",
                  f"checkpoint_dir={work}/ckpt/{name}-source")
    body, epochs = xp_study(search, name, seed)
    (sweeps / f"{name}.yaml").write_text(body)
    run_study(work, name, *COMMON, *TASKS[task], f"epochs={epochs}", f"experiment={name}",
              f"checkpoint_dir={work}/ckpt/{name}")
    return name


# --- the peers' trials: xp's training in the peer's process ------------------------------------------------------
class PeerTrial:
    """What xp's run uses of a study's trial (xp.studies.trial.StudyTrial: its `optuna` and its `pruner`), for a
    trial a peer runs: each epoch's accuracy goes to `on_epoch`, which says whether to stop (a reason) or not."""

    def __init__(self, number: int, params: dict, study: str, on_epoch):
        import types

        self.number, self.params, self.on_epoch = number, params, on_epoch
        self.study = types.SimpleNamespace(study_name=study)
        self.last: tuple[int, float] = (0, 0.0)

    def set_user_attr(self, key: str, value) -> None:
        pass

    def report(self, values: list[float], epoch: int) -> None:
        self.last = (epoch, values[0])

    def should_prune(self) -> str | None:
        return self.on_epoch(*self.last)


def train(work: Path, experiment: str, number: int, params: dict, task: str, epochs: int, on_epoch,
          resume: str | None = None, checkpoint_dir: str | None = None) -> float:
    """One trial of xp's training with `params` (lr, momentum) in this process, logged to the benchmark's MLflow
    store as xp's trials are; returns its last validation accuracy."""
    from xp.run.experiment import JobInfo, run
    from xp.studies.study import spec_from
    from xp.studies.trial import StudyTrial

    overrides = [*COMMON, *TASKS[task], f"epochs={epochs}", f"experiment={experiment}",
                 f"tracking_uri=sqlite:///{work}/mlflow.db", *(f"{k}={v}" for k, v in params.items()),
                 *([f"resume={resume}"] if resume else []), *([f"checkpoint_dir={checkpoint_dir}"] if checkpoint_dir
                                                             else [])]
    config = compose(*overrides)
    spec = spec_from({"objectives": [{"metric": "val_accuracy", "direction": "maximize"}]}, experiment, search=False)
    trial = PeerTrial(number, params, experiment, on_epoch)
    outcome = run(config, JobInfo(cwd=work, trial=StudyTrial(trial, spec, trial)))
    return outcome.values[0] if outcome.values else float("nan")


def run_bare(work: Path, task: str, seed: int) -> str:
    """A bare Optuna loop: TPE (seeded) and MedianPruner(3, 2), trials of xp's training, two processes on one
    SQLite storage, stopped once the budget's epochs are trained."""
    name = f"optuna-bare-{task}-{seed}"
    argv = [sys.executable, __file__, "--bare-child", str(work), name, task, str(seed)]
    procs = [subprocess.Popen([*argv, str(i)], env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)),
                              stdout=subprocess.DEVNULL, stderr=open(work / f"{name}-{i}.log", "w"))
             for i in range(2)]
    for p in procs:
        if p.wait(timeout=3600) != 0:
            raise SystemExit(f"{name}: a process ended {p.returncode}: see {work}/{name}-*.log")
    return name


def bare_child(work: Path, name: str, task: str, seed: int, index: int) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{work}/bare.db"
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed * 2 + index),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2))

    def trained(s) -> int:  # epochs every trial of the study has trained so far
        return sum(len(t.intermediate_values) for t in s.get_trials(deepcopy=False))

    def objective(trial) -> float:
        params = {"lr": trial.suggest_float("lr", 0.001, 0.5, log=True),
                  "momentum": trial.suggest_float("momentum", 0.5, 0.99)}

        def on_epoch(epoch: int, accuracy: float) -> str | None:
            trial.report(accuracy, epoch)
            return "median pruner" if trial.should_prune() else None

        return train(work, name, trial.number, params, task, EPOCHS, on_epoch)

    def budget(s, _t) -> None:
        if trained(s) >= BUDGET:
            s.stop()

    study.optimize(objective, n_trials=BUDGET, callbacks=[budget], catch=(Exception,))


def run_ray(work: Path, search: str, task: str, seed: int) -> str:
    """Ray Tune on the benchmark's Ray cluster (2 CPUs): ASHA over random search, or its PBT; stopped once the
    budget's epochs are trained."""
    from ray import tune

    name = f"{search}-{task}-{seed}"
    pbt = search == "ray-pbt"
    epochs = BUDGET // POPULATION if pbt else EPOCHS

    def trainable(config: dict) -> None:
        from ray import tune as t

        params = {"lr": config["lr"], "momentum": config["momentum"]}
        ckpt = str(work / "ckpt" / name / t.get_context().get_trial_id())
        number = int(t.get_context().get_trial_id().split("_")[-1])
        commits = f"{ckpt}/trial-{number}"  # (a trial's run commits in its own folder: xp.run.experiment)
        resume = None
        if (given := t.get_checkpoint()) is not None:  # PBT: the donor's commit (or this member's own)
            resume = given.to_directory()

        def on_epoch(epoch: int, accuracy: float) -> str | None:
            if pbt and epoch % INTERVAL == 0:
                t.report({"val_accuracy": accuracy, "epoch": epoch}, checkpoint=t.Checkpoint.from_directory(commits))
            else:
                t.report({"val_accuracy": accuracy, "epoch": epoch})
            return None

        train(work, name, number, params, task, epochs, on_epoch, resume=resume, checkpoint_dir=ckpt)

    space = {"lr": tune.loguniform(0.001, 0.5), "momentum": tune.uniform(0.5, 0.99)}
    if pbt:
        from ray.tune.schedulers import PopulationBasedTraining

        scheduler = PopulationBasedTraining(time_attr="epoch", perturbation_interval=INTERVAL, quantile_fraction=0.25,
                                            resample_probability=0.25, hyperparam_mutations=dict(space),
                                            perturbation_factors=(1.2, 0.8), synch=False)
        samples = POPULATION
    else:
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(time_attr="epoch", max_t=EPOCHS, grace_period=1, reduction_factor=3)
        samples = BUDGET  # (more than the budget allows: the stopper below ends the search at the budget)

    class Budget(tune.Stopper):
        def __init__(self):
            self.epochs = 0

        def __call__(self, trial_id, result) -> bool:
            self.epochs += 1
            return False

        def stop_all(self) -> bool:
            return self.epochs >= BUDGET

    import random as _random
    import numpy as _np

    _random.seed(seed)
    _np.random.seed(seed)
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space=space,
                       tune_config=tune.TuneConfig(num_samples=samples, max_concurrent_trials=2, metric="val_accuracy",
                                                   mode="max", scheduler=scheduler,
                                                   search_alg=tune.search.BasicVariantGenerator(random_state=seed)),
                       run_config=tune.RunConfig(storage_path=str(work / "tune"), name=name, stop=Budget(), verbose=0))
    import contextlib
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)
    with open(work / f"{name}.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        tuner.fit()  # (its progress tables and warnings into the search's log)
    return name


# --- the figures: every epoch any trial of a search trained, from MLflow ------------------------------------------
def epochs_of(work: Path, experiment: str) -> list[tuple[int, float]]:
    """(end time ms, validation accuracy) of every epoch the search's runs trained, in the order they ended."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    points = []
    for run in client.search_runs([exp.experiment_id], max_results=5000):
        if run.data.tags.get("xp.sweep") == "true":
            continue  # (a study's parent run)
        points += [(m.timestamp, m.value) for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
    return sorted(points)


def figures(points: list[tuple[int, float]], target: float) -> dict:
    """Within the budget: the epochs trained when the best so far first reached `target`, the best at the end."""
    best, reached = 0.0, None
    for i, (_, acc) in enumerate(points[:BUDGET], 1):
        best = max(best, acc)
        if reached is None and best >= target:
            reached = i
    curve, b = [], 0.0
    for _, acc in points[:BUDGET]:
        b = max(b, acc)
        curve.append(b)
    return {"epochs_to_target": reached, "best_at_budget": best, "trained": min(len(points), BUDGET),
            "curve": curve}


def start_ray() -> subprocess.Popen:
    """A Ray head of 2 CPUs on the namespace's loopback, this process connected; returns the head (its process
    group is ended at the end: `ray stop` would end every Ray cluster of the machine)."""
    import ray

    from xp.launching.engine import free_port

    port = free_port()
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
                             "--disable-usage-stats", f"--temp-dir={tempfile.mkdtemp(prefix='ray-')}",
                             f"--dashboard-agent-listen-port={free_port()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1",  # (its workers import common, xp)
                                     PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}"))
    deadline = time.monotonic() + 120
    while True:
        try:
            ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)
            return head
        except Exception:
            if head.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(1)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in results["runs"]})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for search in results["searches"]:
            curves = [r["curve"] for r in results["runs"] if r["task"] == task and r["search"] == search]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            median = [statistics.median(c[i] for c in curves) for i in range(n)]
            ax.plot(range(1, n + 1), median, label=search, lw=1.6,
                    ls="-" if search.startswith("xp") else "--")
        ax.axhline(TARGET[task], color="grey", lw=0.8, ls=":")
        seeds = len({r["seed"] for r in results["runs"] if r["task"] == task})
        ax.set_title(f"{task}: best validation accuracy so far (median of {seeds} seeds)")
        ax.set_xlabel("epochs trained (the compute spent)")
        ax.set_ylabel("best val_accuracy so far")
        lows = [r["curve"][min(len(r["curve"]) - 1, 20)] for r in results["runs"] if r["task"] == task and r["curve"]]
        tops = [r["best_at_budget"] for r in results["runs"] if r["task"] == task]
        ax.set_ylim(max(0.0, min(lows, default=0.0) - 0.02), min(1.0, max(tops, default=1.0) + 0.01))
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: dict) -> None:
    print("| task (target) | search | epochs to the target (median; seeds that reached it) | best at "
          f"{BUDGET} epochs (median; min-max) | epochs it trained (fewest of its seeds) | wall s (median) |")
    print("|---|---|---|---|---|---|")
    for task in sorted({r["task"] for r in results["runs"]}):
        for search in results["searches"]:
            rs = [r for r in results["runs"] if r["task"] == task and r["search"] == search]
            if not rs:
                continue
            reach = sorted(r["epochs_to_target"] for r in rs if r["epochs_to_target"] is not None)
            # the median over every seed, a seed that never reached it counting as past the budget
            every = sorted(r["epochs_to_target"] if r["epochs_to_target"] is not None else float("inf") for r in rs)
            med = statistics.median(every)
            bests = [r["best_at_budget"] for r in rs]
            print(f"| {task} ({TARGET[task]}) | {search} | {'never' if med == float('inf') else f'{med:.0f}'} "
                  f"({len(reach)} of {len(rs)}) | {statistics.median(bests):.4f} ({min(bests):.4f}-{max(bests):.4f}) | "
                  f"{min(r['trained'] for r in rs)} | {statistics.median(r['wall_s'] for r in rs):.0f} |")


def main() -> None:
    global BUDGET
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--searches", default=",".join(SEARCHES))
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--work", default=None)
    ap.add_argument("--budget", type=int, default=BUDGET, help="epochs a search may train (a quick look: less)")
    ap.add_argument("--table", action="store_true", help="the table and plot of the last run's results again")
    ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare-child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_child:
        w, name, task, seed, index = args.bare_child
        bare_child(Path(w), name, task, int(seed), int(index))
        return
    BUDGET = args.budget
    out = ROOT / "benchmarks" / "results" / "search_quality.json"
    if args.table:
        results = json.loads(out.read_text())
        BUDGET = results["budget_epochs"]
        plot(results, ROOT / "docs" / "images" / "search-quality.png")
        table(results)
        return
    searches = args.searches.split(",")
    if any(s.startswith("ray") for s in searches) and not args.in_namespace:
        from study_scale import own_network

        work = Path(tempfile.mkdtemp(prefix="xp-bench-quality-"))
        env = {**os.environ, "HOME": str(work), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(k, None)
        argv = own_network([sys.executable, __file__, *sys.argv[1:], "--in-namespace", "--work", str(work)])
        os.execvpe(argv[0], argv, env)
    work = Path(args.work or tempfile.mkdtemp(prefix="xp-bench-quality-"))
    (work / "sweeps").mkdir(exist_ok=True)
    head = start_ray() if any(s.startswith("ray") for s in searches) else None
    try:
        measure(args, work, searches)
    finally:
        if head is not None:
            import ray
            import signal

            ray.shutdown()
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
            time.sleep(2)  # (its group's daemons end after the head)
            try:
                os.killpg(head.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def measure(args: argparse.Namespace, work: Path, searches: list[str]) -> None:
    out = ROOT / "benchmarks" / "results" / "search_quality.json"
    results: dict = {"seeds": args.seeds, "searches": searches, "budget_epochs": BUDGET, "epochs": EPOCHS,
                     "targets": TARGET, "runs": []}
    for seed in range(args.seeds):  # (seed by seed: an interrupted run still has every task and search of its seeds)
        for task in args.tasks.split(","):
            for search in searches:
                t0 = time.perf_counter()
                if search.startswith("xp"):
                    experiment = run_xp_search(work, search, task, seed)
                elif search == "optuna-bare":
                    experiment = run_bare(work, task, seed)
                else:
                    experiment = run_ray(work, search, task, seed)
                got = figures(epochs_of(work, experiment), TARGET[task])
                results["runs"].append({"task": task, "seed": seed, "search": search, **got,
                                        "wall_s": time.perf_counter() - t0})
                print(f"{task} seed {seed} {search}: best {got['best_at_budget']:.4f} after {got['trained']} epochs, "
                      f"target at {got['epochs_to_target']} ({time.perf_counter() - t0:.0f} s)", flush=True)
                out.write_text(json.dumps(results, indent=1))
    plot(results, ROOT / "docs" / "images" / "search-quality.png")
    from xp.tracking.services import stop
    from xp.tracking.spool import state_dir

    stop(state_dir())  # (the tracking service its runs started, in its own HOME: it would idle for 30 minutes)
    print(f"\nwork folder {work}\n")
    table(results)


if __name__ == "__main__":
    main()
