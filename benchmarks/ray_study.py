"""A study on a Ray cluster and on this machine, side by side: the same study through launcher=ray (each slot an
actor holding a warm trial worker on a Ray node), launcher=local (each slot a worker process here) and, with
--ways local,ray,hydra-ray, Hydra's own Ray launcher (hydra/launcher=ray: the trials as Ray tasks, in batches of
sweep.parallel).

    .venv/bin/python benchmarks/ray_study.py [--trials 12,36] [--parallel 2] [--epochs 3] [--reps 2]   # as root
        [--ways local,ray,hydra-ray]

hydra-ray-launcher 1.2.2 pins cloudpickle<3, which .venv cannot take (joblib 1.6, under Hydra's joblib launcher,
needs >=3): with hydra-ray the benchmark makes .venv-hydra-ray, a virtual environment over .venv's packages with
the plugin and cloudpickle 2 in front, and runs itself, the Ray nodes and every way there (the same interpreter).

The hosts are the tests' namespaces (tests/hosts.py): h1 is the launching machine, with the Ray head (no CPUs:
only the drivers run there) and an MLflow server both ways log to; h2 is a Ray node of `parallel` CPUs
(tests/test_ray.py's nodes). All of them share this machine's cores. Both ways run the same study (random sampler,
seed 5, no pruner, LeNet on the digits, SQLite study storage on h1). For each way and repetition (interleaved):

- wall: the command's time, start to exit;
- s/trial: wall over trials;
- overhead/trial: what a trial cost beyond its own MLflow run, (parallel x wall - the runs' time) / trials;
- cover: the trials' run time over parallel x the span from the first run's start to the last run's end;

and, from the two study sizes, what a command costs once (its start, its slots' workers, its end) and what each
more trial costs: per way and repetition, marginal s/trial = the walls' difference over the trials' difference
(slot-seconds: x parallel), fixed s = the smaller study's wall less its trials at that rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

STUDY = ("study_name: {name}\nn_trials: {n}\nsampler: random\nsampler_seed: 5\npruner: none\n"
         "params:\n  lr: {{type: float, low: 0.001, high: 0.3, log: true}}\n")


def one(c, way: str, rep: int, trials: int, args: argparse.Namespace) -> dict[str, float]:
    from slurm_study import trial_runs
    from test_multihost import env

    name = f"bench-{way}-{rep}-{trials}"
    folder = c.shared / name
    (folder / "sweeps").mkdir(parents=True)
    (folder / "sweeps" / "bench.yaml").write_text(STUDY.format(name=name, n=trials))
    argv = [sys.executable, "-m", "xp", "-m", "sweep=bench", f"sweep.parallel={args.parallel}",
            f"epochs={args.epochs}", f"tracking_uri={c.uri}", f"experiment={name}", f"hydra.sweep.dir={folder}/sweep"]
    if way == "ray":
        argv += ["launcher=ray", f"launcher.address={c.ray_address}", f"host_ip={c.launcher.address}"]
    elif way == "hydra-ray":  # each trial a Ray task of 1 CPU (the plugin's default) on the node, 2 at a time
        argv += ["hydra/launcher=ray", f"hydra.launcher.ray.init.address={c.ray_address}",
                 "+hydra.launcher.ray.init.object_store_memory=null"]  # (its default is refused by a running cluster)
    study_env = dict(env(), XP_SWEEPS_DIR=str(folder / "sweeps"), XP_OPTUNA_STORAGE=f"sqlite:///{folder}/optuna.db")
    cpu = CpuByKind()
    t0 = time.monotonic()
    proc = subprocess.Popen(c.on_launcher(argv), cwd=ROOT, env=study_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    cpu.follow(proc)
    out, err = proc.communicate(timeout=1800)
    wall = time.monotonic() - t0
    r = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if r.returncode != 0:
        raise SystemExit(f"{way}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    runs = trial_runs(c.db, name)
    busy = sum(e - s for s, e, _ in runs)
    span = max(e for _, e, _ in runs) - min(s for s, _, _ in runs)
    return {"wall": wall, "per_trial": wall / len(runs), "overhead": (args.parallel * wall - busy) / len(runs),
            "cover": busy / (args.parallel * span), "trials": len(runs), "cpu": cpu.totals()}


KINDS = (("trial workers", ("xp.launching.trialworker",)), ("ray drivers", ("xp.launching.ray_actors",)),
         ("ray actors", ("ray::",)), ("ray daemons", ("raylet", "gcs_server", "log_monitor", "dashboard",
                                                     "runtime_env", "ray/_private", "monitor.py")),
         ("xp command", ("-m xp ",)), ("mlflow server", ("mlflow", "gunicorn", "uvicorn")))


class CpuByKind:
    """The CPU seconds every process of the machine used while a study ran, by kind (its command line): what a
    way costs beyond its trials, and where (each process's last reading counts; one that ends between two
    readings, 0.5 s apart, loses at most that half second)."""

    def __init__(self):
        import psutil

        self.psutil, self.seen, self.kind = psutil, {}, {}
        self.base = {p.pid: self._cpu(p) for p in psutil.process_iter()}  # what ran before the study

    def _cpu(self, p) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except self.psutil.Error:
            return 0.0

    def follow(self, proc: subprocess.Popen) -> None:
        while proc.poll() is None:
            for p in self.psutil.process_iter():
                if self.kind.get(p.pid, "other") == "other":  # (a Ray worker names itself once it is an actor)
                    try:
                        line = " ".join(p.cmdline()) or p.name()
                    except self.psutil.Error:
                        continue
                    self.kind[p.pid] = next((k for k, marks in KINDS if any(m in line for m in marks)), "other")
                self.seen[p.pid] = max(self.seen.get(p.pid, 0.0), self._cpu(p))
            time.sleep(0.5)

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, cpu in self.seen.items():
            out[self.kind[pid]] = out.get(self.kind[pid], 0.0) + cpu - self.base.get(pid, 0.0)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="12,36", help="two study sizes (their difference gives a trial's cost)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ways", default="local,ray", help="of local, ray, hydra-ray")
    args = ap.parse_args()
    args.ways = args.ways.split(",")
    if set(args.ways) - {"local", "ray", "hydra-ray"}:
        raise SystemExit(f"--ways={','.join(args.ways)}: of local, ray, hydra-ray")
    if "hydra-ray" in args.ways and Path(sys.prefix) != OVERLAY:
        py = overlay()
        os.execv(py, [str(py), __file__, *sys.argv[1:]])
    sizes = sorted(int(n) for n in args.trials.split(","))
    if len(sizes) != 2 or sizes[0] == sizes[1]:
        raise SystemExit("--trials: two different study sizes, e.g. 12,36")
    import hosts
    from test_ray import PORT, start_node, wait_nodes

    with hosts.Cluster(2) as c:
        c.db = c.dir / "mlflow.db"
        c.uri = c.mlflow_server(c.db)
        c.ray_address = f"{c.launcher.address}:{PORT}"
        start_node(c, c.launcher, ["--head", f"--port={PORT}", "--num-cpus=0", "--include-dashboard=false",
                                      f"--temp-dir={c.dir}/ray"])
        wait_nodes(c, 1)
        start_node(c, c.host("h2"), [f"--address={c.ray_address}", f"--num-cpus={args.parallel}"])
        wait_nodes(c, 2)
        print(f"studies of {sizes[0]} and {sizes[1]} trials of {args.epochs} epochs, {args.parallel} at a time; "
              f"Ray {ray_version()}")
        print(f"{'way':<6} {'rep':>3} {'wall s':>7} {'s/trial':>8} {'overhead/trial s':>16} {'cover':>6} {'trials':>6}")
        costs: dict[str, list[tuple[float, float]]] = {way: [] for way in args.ways}
        cpus: dict[str, list[tuple[int, dict]]] = {way: [] for way in args.ways}
        for rep in range(args.reps):
            for way in args.ways:  # interleaved: the machine's drift hits each
                walls = []
                for n in sizes:
                    m = one(c, way, rep, n, args)
                    walls.append(m["wall"])
                    print(f"{way:<6} {rep:>3} {m['wall']:>7.1f} {m['per_trial']:>8.2f} {m['overhead']:>16.2f} "
                          f"{m['cover']:>6.3f} {m['trials']:>6}  CPU s: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(m["cpu"].items(), key=lambda kv: -kv[1])),
                          flush=True)
                    cpus[way].append((n, m["cpu"]))
                marginal = (walls[1] - walls[0]) / (sizes[1] - sizes[0])
                costs[way].append((marginal, walls[0] - sizes[0] * marginal))
        print(f"\n{'way':<6} {'marginal s/trial (wall)':>24} {'slot-s/trial':>13} {'fixed s':>8}")
        for way, rows in costs.items():
            for marginal, fixed in rows:
                print(f"{way:<6} {marginal:>24.3f} {marginal * args.parallel:>13.3f} {fixed:>8.1f}")
        print("\nCPU s per trial by kind of process (the difference between the two sizes, over the trials' "
              "difference; medians of the repetitions)")
        for way, rows in cpus.items():
            small = [c for n, c in rows if n == sizes[0]]
            large = [c for n, c in rows if n == sizes[1]]
            kinds = sorted({k for c in small + large for k in c})
            per = {k: statistics.median((b.get(k, 0) - a.get(k, 0)) / (sizes[1] - sizes[0])
                                        for a, b in zip(small, large)) for k in kinds}
            print(f"{way:<10} " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
                  + f"; all {sum(per.values()):.3f}")


OVERLAY = ROOT / ".venv-hydra-ray"


def overlay() -> Path:
    """.venv-hydra-ray's python, the environment made once: .venv's packages behind its own (hydra-ray-launcher
    1.2.2, cloudpickle 2), its own `ray` command."""
    py = OVERLAY / "bin" / "python"
    if not (OVERLAY / "ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(OVERLAY)], check=True)
        base = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
        mine = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                              capture_output=True, text=True).stdout.strip()
        Path(mine, "zz-xp-venv.pth").write_text(f"import site; site.addsitedir({base!r})\n")  # after its own
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "hydra-ray-launcher==1.2.2",
                        "cloudpickle<3"], check=True)
        ray = (Path(sys.prefix) / "bin" / "ray").read_text().split("\n", 1)[1]
        (OVERLAY / "bin" / "ray").write_text(f"#!{py}\n{ray}")
        (OVERLAY / "bin" / "ray").chmod(0o755)
        (OVERLAY / "ready").touch()
    return py


def ray_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("ray")


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
