"""PBT against TPE at the same budget, with seeds: the recipe pair sweeps/pbt_lr.yaml (4 members, an exploit
decision every 2 epochs, 10 epochs: 40 epochs in all) and sweeps/tpe_lr.yaml (4 trials of 10 epochs: 40), the
same lr x momentum space on the default experiment (LeNet on digits, constant lr), each run once per seed: the
training's `seed` and the search's `sweep.sampler_seed` both S. What each study answers (PBT: the best member at
the last epoch; TPE: its best trial) is read from its Optuna storage, the epochs it trained counted from its
trials, and the two are reported side by side: per seed, and mean, standard deviation and range across seeds.

    .venv/bin/python benchmarks/pbt_vs_tpe.py [--seeds 0 1 2 3 4] [--epochs 10] [--population 4]

Both select on val_accuracy, the figure they report (the same optimism for both). Figures: stdout and
benchmarks/results/pbt_vs_tpe.json.
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
sys.path.insert(0, str(ROOT))


def run(search: str, seed: int, epochs: int, population: int, work: Path) -> dict:
    """One study of the pair: `python -m xp -m sweep=SEARCH_lr seed=S sweep.sampler_seed=S epochs=E`."""
    import optuna

    from xp.studies.summary import kept
    from xp.studies.pbt import PBT_ATTR

    name = f"{search}_lr"
    storage = f"sqlite:///{work}/optuna.db"
    env = dict(os.environ, XP_OPTUNA_STORAGE=storage)
    study_name = f"{name}-p{population}-seed{seed}"
    extra = [f"sweep.pbt.population={population}", f"sweep.n_trials={population * epochs // 2}"] \
        if search == "pbt" else [f"sweep.n_trials={population}"]  # (members x epochs / interval; as many trials)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xp", "-m", f"sweep={name}", f"seed={seed}",
                           f"sweep.sampler_seed={seed}", f"sweep.study_name={study_name}", f"epochs={epochs}", *extra,
                           f"tracking_uri=sqlite:///{work}/mlflow.db", f"checkpoint_dir={work}/ckpt-{study_name}",
                           f"hydra.sweep.dir={work}/sweep-{study_name}"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{study_name} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    answer = kept(study)  # (the study's answer, as its search wrote it)
    best = study.trials[answer.first.trial]
    if search == "pbt":
        trained = sum(t.user_attrs[PBT_ATTR]["end"] - t.user_attrs[PBT_ATTR]["start"] for t in done)
        steps = [(s["first"], s["last"], s["params"]) for s in answer.schedule]
    else:
        trained = epochs * len(done)
        steps = [(1, epochs, best.params)]
    return {"search": search, "seed": seed, "val_accuracy": best.value, "params": best.params,
            "schedule": steps, "epochs_trained": trained, "intervals_or_trials": len(done), "wall_s": wall}


def spread(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} +- {std:.4f} (std), {min(values):.4f} - {max(values):.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epochs", type=int, default=10, help="each member's and each trial's epochs (even)")
    ap.add_argument("--population", type=int, default=4, help="PBT's members, TPE's trials")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pbt_vs_tpe.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xp-bench-pbt-tpe-"))
    results = [run(search, seed, args.epochs, args.population, work) for seed in args.seeds for search in ("pbt", "tpe")]
    print("| seed | PBT val acc | PBT epochs | TPE val acc | TPE epochs | PBT winner's schedule (epochs: lr, momentum) |")
    print("|---|---|---|---|---|---|")
    for seed in args.seeds:
        p, t = (next(r for r in results if r["seed"] == seed and r["search"] == s) for s in ("pbt", "tpe"))
        steps = "; ".join(f"{a}-{b}: {ps['lr']:.3g}, {ps['momentum']:.2f}" for a, b, ps in p["schedule"])
        print(f"| {seed} | {p['val_accuracy']:.4f} | {p['epochs_trained']} | {t['val_accuracy']:.4f} | "
              f"{t['epochs_trained']} | {steps} |")
    for search in ("pbt", "tpe"):
        mine = [r for r in results if r["search"] == search]
        print(f"{search}: val_accuracy across {len(mine)} seeds {spread([r['val_accuracy'] for r in mine])}; "
              f"epochs trained {sorted({r['epochs_trained'] for r in mine})}; wall "
              f"{statistics.median(r['wall_s'] for r in mine):.1f} s a study (median)")
    wins = sum(p["val_accuracy"] > t["val_accuracy"] for p, t in zip(results[::2], results[1::2]))
    ties = sum(p["val_accuracy"] == t["val_accuracy"] for p, t in zip(results[::2], results[1::2]))
    print(f"PBT better on {wins} of {len(args.seeds)} seeds, equal on {ties}")
    print(f"(population {args.population}, {args.epochs} epochs, work folder {work})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
