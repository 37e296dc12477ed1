"""A study at scale: N trials that each last a fixed time and use no CPU, on S slots of this machine.

    .venv/bin/python benchmarks/study_scale.py [--trials 1000] [--slots 16] [--trial-s 1.0] [--epochs 4]
                                               [--storage sqlite] [--tracking sqlite] [--profile]

Every trial is a complete xp run of the sleep backend (benchmarks/sleep_backend.py, registered here as a third
party's backend is): its MLflow child run with parameters, per-epoch metrics and tags, Optuna's ask, a report
and a pruning question per epoch (median pruner), tell. What it measures, from one study command:

- wall: the command, start to exit; ideal: N x trial time / S; overhead: wall / ideal; and, pruned trials being
  shorter, the trials' own time (their MLflow runs' or Optuna trials' start to end) over S, and wall over that;
- the scheduler's CPU per trial: the study command's own process (not its workers), user + system, over N;
- the workers' CPU per trial (all of them together, over N) and how busy the machine's cores were;
- with --profile, where the scheduler's working time goes (py-spy samples of its process, idle waits left out:
  pip install py-spy): the storage's share (optuna.storages, SQLAlchemy, sqlite3), the sampler's, MLflow's;
- the workers: how many at the peak, their memory (USS: what each costs on its own, and RSS), and how long
  the first takes to be ready.
The figures go to stdout and benchmarks/results/study_scale.json.

--ways picks what runs, one after another in the same call: xp, bare (Optuna's own study.optimize(n_jobs=S), no
MLflow), raytune (Ray Tune 2.60's default search and FIFO scheduler, S trials at a time) and raytune-optuna (Ray
Tune with OptunaSearch and its MLflowLoggerCallback): the same sleeping trial, the same S, on the same machine.
Ray Tune's ways run --ray-trials trials (200: at ~1.6 s a trial, 1,000 would take half an hour); their
per-trial figures compare.

--ways xp-pbt,raytune-pbt: population-based training of the same sleeping trial (a member's training lasts
--trial-s over --epochs; --population members, default one per slot; every --interval epochs the worst quarter
takes the weights of the best quarter and explores lr and momentum by x0.8 / x1.2 or a fresh draw one time in
four): xp's `search: pbt` (each interval a trial and an MLflow run resuming a commit) beside Ray Tune's
PopulationBasedTraining (asynchronous, its trials checkpointing every interval), inside a network namespace.
Reported: wall against the ideal (members x trial time / slots), exploits made, and the scheduler's CPU per
interval and per exploit (xp: its study command's process; Ray: every process of its tree).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))  # (xp's tracking service: measured and stopped by the ways that start it)

STUDY = ("study_name: scale\nn_trials: {n}\nsampler: {sampler}\nsampler_seed: 1\npruner: median\n"
         "pruner_options: {{n_startup_trials: 5, n_warmup_steps: 1}}\n"
         "params:\n  lr: {{type: float, low: 0.001, high: 1.0, log: true}}\n"
         "  momentum: {{type: float, low: 0.5, high: 0.99}}\n")


PBT = ("study_name: scale\nsearch: pbt\nn_trials: {n}\nsampler_seed: 1\n"
       "pbt: {{population: {population}, interval: {interval}, quantile: 0.25, explore: {{lr: {{}}, momentum: {{}}}}}}\n"
       "params:\n  lr: {{type: float, low: 0.001, high: 1.0, log: true}}\n"
       "  momentum: {{type: float, low: 0.5, high: 0.99}}\n")


def study_yaml(args: argparse.Namespace, trials: int) -> str:
    if args.pbt:
        return PBT.format(n=trials, population=args.population, interval=args.interval)
    return STUDY.format(n=trials, sampler=args.sampler)


def storage_url(kind: str, work: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{work}/optuna.db"
    if kind == "journal":
        return f"journal:///{work}/optuna.log"
    if kind == "postgresql":
        return PG.url("optuna")
    if kind.startswith(("postgresql://", "sqlite:///", "journal:///")):
        return kind
    raise SystemExit(f"--storage={kind}: sqlite, journal, postgresql (the tests' server), or a URL")


PG = None  # the tests' PostgreSQL server (tests/pg.py), started for --storage=postgresql


def sample(tree: psutil.Process, seen: dict) -> None:
    """The scheduler's CPU, its workers' CPU and memory, as they stand now."""
    try:
        t = tree.cpu_times()
        seen["cpu_s"] = t.user + t.system
        ours = [c for c in tree.children(recursive=True) if "xp.launching." in " ".join(c.cmdline())]
        zygotes = {c.pid for c in ours if c.ppid() == tree.pid and "zygote" in c.cmdline()}
    except psutil.Error:
        return
    seen["peak_workers"] = max(seen.get("peak_workers", 0), len(ours) - len(zygotes))
    for w in ours:  # the zygote's CPU counts with its workers' (their imports are its), its memory apart
        try:
            m, c = w.memory_full_info(), w.cpu_times()
            memory = (("zygote_uss", m.uss), ("zygote_rss", m.rss)) if w.pid in zygotes else (("uss", m.uss),
                                                                                                ("rss", m.rss))
            for key, value in (*memory, ("worker_cpu", c.user + c.system)):
                seen.setdefault(key, {})[w.pid] = max(seen.get(key, {}).get(w.pid, 0), value)
        except psutil.Error:
            pass


def one(args: argparse.Namespace) -> dict:
    """The study through xp: `python -m xp -m sweep=scale ...`."""
    import sleep_backend

    work = Path(tempfile.mkdtemp(prefix="xp-bench-scale-"))
    plugins = sleep_backend.install(work / "site")
    (work / "sweeps").mkdir()
    (work / "sweeps" / "scale.yaml").write_text(study_yaml(args, args.trials))
    tracking = f"sqlite:///{work}/mlflow.db" if args.tracking == "sqlite" else args.tracking
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]),
               XP_SWEEPS_DIR=str(work / "sweeps"), XP_OPTUNA_STORAGE=storage_url(args.storage, work),
               XP_SLEEP_EPOCH_S=str(args.trial_s / args.epochs), XP_STATE_DIR=str(work / "state"))
    profiler = ["-m", "cProfile", "-o", str(work / "scheduler.prof")] if args.cprofile else []
    argv = [sys.executable, *profiler, "-m", "xp", "-m", "sweep=scale", f"sweep.parallel={args.slots}",
            "backend.name=sleep", f"epochs={args.epochs}", "batch=512", f"tracking_uri={tracking}",
            "experiment=scale", f"hydra.sweep.dir={work}/sweep", f"checkpoint_dir={work}/ckpt"]
    seen: dict = {}
    t0, started = time.monotonic(), time.time()
    with open(work / "out.txt", "w") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        tree = psutil.Process(proc.pid)
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(proc.pid),
                                "--rate", "50", "--format", "raw", "--nonblocking", "-o", str(work / "spy.txt")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.profile else None
        cpu0 = psutil.cpu_times()
        while proc.poll() is None:
            sample(tree, seen)
            if "first_ready_s" not in seen and "trial 0 " in (work / "out.txt").read_text()[-100000:]:
                seen["first_ready_s"] = time.monotonic() - t0
            time.sleep(0.5)
    wall = time.monotonic() - t0
    cpu1 = psutil.cpu_times()
    service = served_cpu(work / "state")  # the study's tracking service (its own state folder: started by it)
    if spy is not None:
        spy.wait(timeout=120)
    said = (work / "out.txt").read_text()
    if proc.returncode != 0:
        raise SystemExit(f"the study failed ({proc.returncode}):\n{said[-3000:]}")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    exp = client.get_experiment_by_name("scale").experiment_id
    runs = client.search_runs([exp], filter_string="tags.`optuna.trial_number` != ''", max_results=50000)
    ideal = args.trials * args.trial_s / args.slots / (args.epochs / args.interval if args.pbt else 1)
    first = min(r.info.start_time for r in runs) / 1000
    last = max(r.info.end_time or 0 for r in runs) / 1000
    uss, rss = list(seen.get("uss", {}).values()), list(seen.get("rss", {}).values())
    result = {"way": "xp-pbt" if args.pbt else "xp", "trials": args.trials, "slots": args.slots, "trial_s": args.trial_s, "sampler": args.sampler,
              "storage": args.storage, "wall_s": wall, "ideal_s": ideal, "overhead": wall / ideal, "runs": len(runs),
              "pruned": sum(r.data.tags.get("optuna.trial_state") == "PRUNED" for r in runs),
              "own_ideal_s": sum((r.info.end_time - r.info.start_time) / 1000 for r in runs if r.info.end_time)
              / args.slots,
              "before_trials_s": first - started, "trials_s": last - first, "after_trials_s": started + wall - last,
              "scheduler_cpu_s": seen.get("cpu_s"),
              "scheduler_cpu_ms_per_trial": 1000 * seen.get("cpu_s", 0) / args.trials,
              "peak_workers": seen.get("peak_workers"),
              "worker_uss_mb": statistics.median(uss) / 2**20 if uss else None,
              "zygote_uss_mb": max(seen.get("zygote_uss", {}).values(), default=0) / 2**20,
              "worker_rss_mb": statistics.median(rss) / 2**20 if rss else None, "work": str(work)}
    workers_cpu = sum(seen.get("worker_cpu", {}).values())
    busy = sum(getattr(cpu1, k) - getattr(cpu0, k) for k in ("user", "system", "nice", "irq", "softirq"))
    result.update(workers_cpu_s=workers_cpu, workers_cpu_ms_per_trial=1000 * workers_cpu / args.trials,
                  cores_busy=busy / (wall * psutil.cpu_count()), service_cpu_s=service,
                  service_cpu_ms_per_trial=1000 * service / args.trials)
    if args.pbt:
        result.update(exploits=sum("xp.pbt.donor_member" in r.data.tags for r in runs))
    if args.profile:
        result.update(shares(work / "spy.txt"))
    if args.resume_more and not args.pbt:
        result.update(afterwards(args, argv, env, work, client, exp))
        stop_service(work / "state")  # (the one the resumed study started: not left idling)
    return result


def served_cpu(state: Path) -> float:
    """The CPU s of the tracking service of state folder `state` (xp.tracking.service), which is then stopped."""
    from xp.tracking.services import running

    total = sum(t.user + t.system for t in (p.cpu_times() for p, _ in running(state)))
    stop_service(state)
    return total


def stop_service(state: Path) -> None:
    from xp.tracking.services import stop

    stop(state)


def afterwards(args: argparse.Namespace, argv: list[str], env: dict, work: Path, client, exp: str) -> dict:
    """The finished study resumed (the same command, `--resume-more` more trials): how long until its first new
    trial's run starts; and its report (python -m xp.report --parent), start to exit."""
    (work / "sweeps" / "scale.yaml").write_text(study_yaml(args, args.trials + args.resume_more))
    t0, wall0 = time.time(), time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(work / "resume.txt", "w") as said:  # each line with when it came, s after the start
        for line in proc.stdout:
            said.write(f"{time.monotonic() - wall0:7.2f} {line}")
    resume_wall = time.monotonic() - wall0
    if proc.wait() != 0:
        raise SystemExit(f"the resumed study failed ({proc.returncode}): see {work / 'resume.txt'}")
    new = client.search_runs([exp], f"tags.`optuna.trial_number` = '{args.trials}'")
    parent = next(p for p in client.search_runs([exp], "tags.`xp.sweep` != ''", order_by=["attributes.start_time ASC"]))
    wall0 = time.monotonic()
    report = subprocess.run([sys.executable, "-m", "xp.report", "--experiment", "scale", "--tracking-uri",
                             client.tracking_uri, "--parent", parent.info.run_id, "--out", str(work / "report")],
                            cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    report_s = time.monotonic() - wall0
    if report.returncode != 0:
        raise SystemExit(f"the report failed ({report.returncode}): {report.stderr[-2000:]}")
    return {"resume_more": args.resume_more, "resume_first_trial_s": new[0].info.start_time / 1000 - t0 if new else None,
            "resume_wall_s": resume_wall, "report_s": report_s}


def watched(argv: list[str], work: Path, env: dict | None, what: str, tree: bool) -> tuple[float, float]:
    """Run a way's child process in `work`: (its wall s, its CPU s: its own, or with `tree` every process under it,
    each counted at its largest, as sampled every 0.5 s)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, env=env)
    me, cpu = psutil.Process(proc.pid), {}
    while proc.poll() is None:
        try:
            for p in [me, *(me.children(recursive=True) if tree else [])]:
                t = p.cpu_times()
                cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)
        except psutil.Error:
            pass
        time.sleep(0.5)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode})")
    return time.monotonic() - t0, sum(cpu.values())


def bare(args: argparse.Namespace) -> dict:
    """The floor: Optuna's own study.optimize(n_jobs=S) in one process, the same sleeping objective (its epochs,
    a report and a pruning question each), sampler, pruner and storage; no MLflow, no xp."""
    work = Path(tempfile.mkdtemp(prefix="xp-bench-bare-"))
    argv = [sys.executable, __file__, "--bare-child", str(args.trials), str(args.slots), str(args.trial_s),
            str(args.epochs), storage_url(args.storage, work), args.sampler]
    wall, cpu = watched(argv, work, None, "the bare study", tree=False)
    said = json.loads((work / "bare.json").read_text())
    ideal = args.trials * args.trial_s / args.slots
    return {"way": "bare", "trials": args.trials, "slots": args.slots, "trial_s": args.trial_s, "sampler": args.sampler,
            "storage": args.storage, "wall_s": wall, "ideal_s": ideal, "overhead": wall / ideal, **said,
            "scheduler_cpu_s": cpu, "scheduler_cpu_ms_per_trial": 1000 * cpu / args.trials, "work": str(work)}


def bare_child(trials: int, slots: int, trial_s: float, epochs: int, url: str, sampler: str) -> None:
    import optuna

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sleep_backend import accuracy

    from xp.studies.trial import storage_of  # the same storage as xp's study opens (journal:/// is xp's URL)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="bare", storage=storage_of(url), direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=1, multivariate=True)  # as xp's tpe
                                if sampler == "tpe" else optuna.samplers.RandomSampler(seed=1),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1))

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 0.001, 1.0, log=True)
        momentum = trial.suggest_float("momentum", 0.5, 0.99)
        for epoch in range(1, epochs + 1):
            time.sleep(trial_s / epochs)
            value = accuracy(lr, momentum, epoch)
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    study.optimize(objective, n_trials=trials, n_jobs=slots)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    own = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in study.get_trials(deepcopy=False)
              if t.datetime_complete) / slots
    Path("bare.json").write_text(json.dumps({"runs": len(states), "pruned": states.count("PRUNED"),
                                             "own_ideal_s": own}))


def own_network(argv: list[str]) -> list[str]:
    """`argv` run inside a network namespace of its own, with only its loopback up: Ray 2.60 listens on every
    interface whatever it is told (its GCS, raylet and workers: `*:PORT`), and no benchmark may listen on the
    machine's own network. Creating one needs root: without it, one line and exit."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        raise SystemExit("study_scale.py: the Ray Tune ways run Ray inside a network namespace of their own (Ray "
                         "listens on every interface), which needs root and util-linux's unshare and iproute2's ip; "
                         "run as root, or leave them out (--ways xp,bare)")
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def raytune(args: argparse.Namespace, search: str) -> dict:
    """Ray Tune 2.60 on this machine (a local Ray cluster of S CPUs on the loopback of a network namespace of its
    own, `own_network`; HOME a temporary folder: Ray writes ~/.ray): the same sleeping trial (its epochs, a report each), S trials at a time (max_concurrent_trials),
    FIFO scheduling (Tune's default: no pruning). search=default: Tune's default search (random variants of the
    space); search=optuna: OptunaSearch (TPE, seed 1) with Tune's MLflowLoggerCallback logging every trial to an
    MLflow SQLite store, as xp's trials are. Its CPU: every process of the tree (driver, raylet, GCS, workers)."""
    work = Path(tempfile.mkdtemp(prefix=f"xp-bench-raytune-{search}-"))
    trials = args.population if search == "pbt" else args.ray_trials
    argv = [sys.executable, __file__, "--raytune-child", str(trials), str(args.slots), str(args.trial_s),
            str(args.epochs), search, str(args.interval)]
    env = {**os.environ, "HOME": str(work), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    wall, cpu = watched(own_network(argv), work, env, f"the Ray Tune study ({search})", tree=True)
    said = json.loads((work / "raytune.json").read_text())
    ideal = trials * args.trial_s / args.slots
    intervals = trials * args.epochs / args.interval if search == "pbt" else trials  # (a PBT's: members x intervals)
    return {"way": f"raytune-{search}", "trials": intervals, "slots": args.slots, "trial_s": args.trial_s,
            "sampler": {"default": "random", "optuna": "tpe", "pbt": "pbt"}[search], "storage": "tune's files",
            "wall_s": wall, "ideal_s": ideal, "overhead": wall / ideal, **said, "scheduler_cpu_s": cpu,
            "scheduler_cpu_ms_per_trial": 1000 * cpu / intervals, "work": str(work)}


def raytune_child(trials: int, slots: int, trial_s: float, epochs: int, search: str, interval: int) -> None:
    import ray
    from ray import tune

    from sleep_backend import accuracy
    from xp.launching.engine import free_port

    # a head of S CPUs on the loopback (ray.init's own local cluster binds the machine's interface), its process
    # group ended at the end (`ray stop` would end every Ray cluster of the machine)
    port = free_port()
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", f"--num-cpus={slots}", "--include-dashboard=false",
                             "--disable-usage-stats", f"--temp-dir={Path.cwd() / 'ray'}",
                             f"--dashboard-agent-listen-port={free_port()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)
            break
        except Exception:
            if head.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(1)

    def trainable(config: dict) -> None:
        start = 0
        if (given := tune.get_checkpoint()) is not None:  # (PBT: the donor's, or this member's own paused one)
            with given.as_directory() as folder:
                start = int((Path(folder) / "epoch.txt").read_text())
        for epoch in range(start + 1, epochs + 1):
            time.sleep(trial_s / epochs)
            metrics = {"accuracy": accuracy(config["lr"], config["momentum"], epoch), "epoch": epoch}
            if search != "pbt" or epoch % interval:
                tune.report(metrics)
                continue
            with tempfile.TemporaryDirectory() as folder:  # (a commit at each interval's end, as xp's member's)
                (Path(folder) / "epoch.txt").write_text(str(epoch))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))

    space = {"lr": tune.loguniform(0.001, 1.0), "momentum": tune.uniform(0.5, 0.99)}
    search_alg, callbacks, scheduler = None, [], None
    if search == "pbt":
        from ray.tune.schedulers import PopulationBasedTraining

        scheduler = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=interval,
                                            quantile_fraction=0.25, resample_probability=0.25,
                                            hyperparam_mutations=dict(space))
    if search == "optuna":
        from ray.air.integrations.mlflow import MLflowLoggerCallback
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(metric="accuracy", mode="max", seed=1)
        callbacks = [MLflowLoggerCallback(tracking_uri=f"sqlite:///{Path.cwd()}/mlflow.db", experiment_name="scale")]
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space=space,
                       tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=slots, search_alg=search_alg,
                                                   metric="accuracy", mode="max", scheduler=scheduler),
                       run_config=tune.RunConfig(storage_path=str(Path.cwd() / "tune"), name="scale",
                                                 callbacks=callbacks, verbose=0))
    grid = tuner.fit()
    own = sum(r.metrics.get("time_total_s", 0.0) for r in grid) / slots
    policy = Path.cwd() / "tune" / "scale" / "pbt_global.txt"  # (PBT's own record: a line per exploit)
    Path("raytune.json").write_text(json.dumps({
        "runs": len(grid), "pruned": 0, "own_ideal_s": own, "errors": grid.num_errors,
        "exploits": len(policy.read_text().splitlines()) if policy.exists() else 0,
        "best": max((r.metrics.get("accuracy", 0.0) for r in grid), default=None)}))
    ray.shutdown()
    os.killpg(head.pid, signal.SIGTERM)
    head.wait(timeout=60)


PARTS = {"storage": ("optuna/storages", "sqlalchemy", "sqlite3", "psycopg"), "sampler": ("optuna/samplers",),
         "pruner": ("optuna/pruners",), "mlflow": ("mlflow",), "hydra": ("hydra", "omegaconf")}


def shares(path: Path) -> dict:
    """From py-spy's samples of the scheduler's process (idle waits left out): each part's share of them, a
    sample counted for the first part its stack enters (the innermost frames last in py-spy's raw lines)."""
    counts, total = dict.fromkeys(PARTS, 0), 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        for part, marks in PARTS.items():
            if any(m in stack for m in marks):
                counts[part] += int(n)
                break
    return {"samples": total, **{f"{part}_share": c / total if total else 0.0 for part, c in counts.items()}}


def main() -> None:
    if sys.argv[1:2] == ["--bare-child"]:
        a = sys.argv[2:]
        return bare_child(int(a[0]), int(a[1]), float(a[2]), int(a[3]), a[4], a[5])
    if sys.argv[1:2] == ["--raytune-child"]:
        a = sys.argv[2:]
        return raytune_child(int(a[0]), int(a[1]), float(a[2]), int(a[3]), a[4], int(a[5]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--trial-s", type=float, default=1.0, help="how long each trial sleeps in all")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--storage", default="sqlite",
                    help="sqlite, journal (a file), postgresql (the tests' server, started here), or a storage URL")
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "random"),
                    help="tpe (multivariate, as xp's) or random (its cost does not grow with the study)")
    ap.add_argument("--resume-more", type=int, default=4,
                    help="then resume the finished study with this many more trials (0: not), and report it")
    ap.add_argument("--out", help="where the figures go (default: benchmarks/results/study_scale-N-STORAGE-SAMPLER.json)")
    ap.add_argument("--cprofile", action="store_true",
                    help="the scheduler's process under cProfile (its calls and their CPU: WORK/scheduler.prof)")
    ap.add_argument("--ways", default="xp,bare",
                    help="xp (the study through xp), bare (Optuna's own loop), raytune (Ray Tune's default search), "
                         "raytune-optuna (Ray Tune with OptunaSearch and its MLflow callback)")
    ap.add_argument("--ray-trials", type=int, default=200,
                    help="the Ray Tune ways' trials (fewer: Ray Tune takes ~1.6 s a trial here; per-trial figures compare)")
    ap.add_argument("--population", type=int, help="the PBT ways' members (default: one per slot)")
    ap.add_argument("--interval", type=int, default=1, help="the PBT ways' epochs between two exploit decisions")
    ap.add_argument("--tracking", default="sqlite", help="sqlite (a fresh file), or an MLflow tracking URI")
    ap.add_argument("--profile", action="store_true", help="the scheduler under cProfile: the storage's share")
    args = ap.parse_args()
    args.population, args.pbt = args.population or args.slots, False
    global PG
    if args.storage == "postgresql":
        sys.path.insert(0, str(ROOT / "tests"))
        import pg

        PG = pg.Server("bench").start()
    try:
        ways = {"xp": one, "bare": bare, "raytune": lambda a: raytune(a, "default"),
                "raytune-optuna": lambda a: raytune(a, "optuna"), "xp-pbt": pbt_way(one), "raytune-pbt":
                pbt_way(lambda a: raytune(a, "pbt"))}
        unknown = [w for w in args.ways.split(",") if w not in ways]
        if unknown:
            raise SystemExit(f"--ways: no way {unknown[0]!r}; valid: {', '.join(ways)}")
        results = [ways[way](args) for way in args.ways.split(",")]
    finally:
        if PG is not None:
            PG.stop()
    for r in results:
        say(r)
    out = Path(args.out) if args.out else \
        ROOT / "benchmarks" / "results" / f"study_scale-{args.trials}-{args.storage}-{args.sampler}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


def pbt_way(way):
    """A way run as population-based training: its study file searches by PBT, its trials the intervals."""
    def run(args: argparse.Namespace) -> dict:
        pbt = argparse.Namespace(**{**vars(args), "pbt": True, "sampler": "pbt",
                                    "trials": args.population * -(-args.epochs // args.interval)})
        return way(pbt)
    return run


def say(r: dict) -> None:
    print(f"{r['way']}: {r['trials']} trials of {r['trial_s']:g} s on {r['slots']} slots ({r['storage']}, "
          f"{r['sampler']}): "
          f"wall {r['wall_s']:.1f} s, ideal {r['ideal_s']:.1f} s, {r['overhead']:.2f}x (the trials' own time over the "
          f"slots {r['own_ideal_s']:.1f} s: {r['wall_s'] / r['own_ideal_s']:.2f}x); {r['runs']} trials "
          f"({r['pruned']} pruned); its process's CPU {r['scheduler_cpu_s']:.1f} s: "
          f"{r['scheduler_cpu_ms_per_trial']:.0f} ms a trial")
    if "exploits" in r:
        print(f"  {r['exploits']} exploits: the scheduler's CPU {1000 * r['scheduler_cpu_s'] / max(1, r['exploits']):.0f} "
              f"ms an exploit (its whole CPU over the exploits)")
    if r["way"] not in ("xp", "xp-pbt"):
        if r.get("errors"):
            print(f"  {r['errors']} trials failed")
        return
    print(f"  the command's start to the first trial's run {r['before_trials_s']:.1f} s, the trials' runs "
          f"{r['trials_s']:.1f} s, the last run's end to the command's exit {r['after_trials_s']:.1f} s")
    if r.get("resume_more"):
        print(f"  resumed with {r['resume_more']} more trials: its first new trial started "
              f"{r['resume_first_trial_s']:.1f} s after the command (the command: {r['resume_wall_s']:.1f} s); "
              f"python -m xp.report --parent of the {r['trials']} runs: {r['report_s']:.1f} s")
    print(f"  workers: {r['peak_workers']} at the peak, {r['worker_uss_mb']:.0f} MB USS ({r['worker_rss_mb']:.0f} MB "
          f"RSS) each, forked from a zygote of {r.get('zygote_uss_mb', 0):.0f} MB USS; their CPU (the zygote's "
          f"with it) {r['workers_cpu_s']:.0f} s: {r['workers_cpu_ms_per_trial']:.0f} ms a trial; the "
          f"machine's cores busy {r['cores_busy']:.0%}")
    print(f"  the tracking service (the trials' runs: created, their records and their ends delivered): CPU "
          f"{r['service_cpu_s']:.0f} s: {r['service_cpu_ms_per_trial']:.0f} ms a trial")
    if "samples" in r:
        print(f"  the scheduler's working time ({r['samples']} samples): "
              + ", ".join(f"{part} {r[f'{part}_share']:.0%}" for part in PARTS))

if __name__ == "__main__":
    main()
