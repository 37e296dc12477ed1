"""The study scheduler's calls per trial, in one process, split into xp's own bookkeeping and Optuna's.

What xp's scheduler does for each trial of a study, with its own functions, on a real storage, without workers
or MLflow: how many trials are left (xp.studies.trial._counts), ask (Optuna's sampler) and xp's checks of the
proposal (the same parameters ran or are running: proposals._same_params and friends), its marks (the scheduler's
user attribute, the MLflow run id), a report and a pruning question per epoch (Optuna's median pruner), tell.
Each call's thread CPU is summed by kind, over N trials; xp's part is what a bare Optuna loop does not pay.

    .venv/bin/python benchmarks/scheduler_calls.py [--trials 1000] [--storage journal|sqlite|memory]
                                                   [--sampler tpe|random]
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

XP_CALLS = ("counts", "checks", "marks")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--storage", default="journal", choices=("journal", "sqlite", "memory"))
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "random"))
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import optuna
    from optuna.trial import TrialState

    from xp.studies import proposals
    from xp.studies.study import spec_from
    from xp.studies.trial import _counts, distributions, make_pruner, make_sampler, storage_of

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec_from({"study_name": "calls", "n_trials": args.trials, "sampler": args.sampler, "sampler_seed": 1,
                      "pruner": "median", "pruner_options": {"n_startup_trials": 5, "n_warmup_steps": 1},
                      "params": {"lr": {"type": "float", "low": 0.001, "high": 1.0, "log": True},
                                 "momentum": {"type": "float", "low": 0.5, "high": 0.99}}}, "calls", search=True)
    work = Path(tempfile.mkdtemp(prefix="xp-bench-calls-"))
    url = {"journal": f"journal:///{work}/optuna.log", "sqlite": f"sqlite:///{work}/optuna.db", "memory": None}
    storage = storage_of(url[args.storage], spec) if url[args.storage] else None
    study = optuna.create_study(study_name="calls", storage=storage, sampler=make_sampler(spec),
                                pruner=make_pruner(spec), direction="maximize")
    dists = distributions(spec)
    cpu: collections.Counter[str] = collections.Counter()

    def timed(kind: str, call):
        t0 = time.thread_time()
        out = call()
        cpu[kind] += time.thread_time() - t0
        return out

    ask = study.ask
    study.ask = lambda *a, **k: timed("ask (sampler)", lambda: ask(*a, **k))  # inside proposals.propose: Optuna's part
    for _ in range(args.trials):
        timed("counts", lambda: _counts(study))
        start = time.thread_time()
        asked = cpu["ask (sampler)"]
        trial = proposals.propose(study, dists, 1)[0][0]
        cpu["checks"] += time.thread_time() - start - (cpu["ask (sampler)"] - asked)
        timed("marks", lambda: (trial.set_user_attr("xp.scheduler", "host:1"), trial.set_user_attr("run", "0" * 32)))
        lr, momentum = trial.params["lr"], trial.params["momentum"]
        pruned = False
        for epoch in range(1, args.epochs + 1):
            value = (1 - min(1, abs(math.log10(lr) + 1.5) / 2) * 0.5 - abs(momentum - 0.9) * 0.2) * (1 - 0.5 ** epoch)
            timed("report", lambda: trial.report(value, epoch))
            if epoch < args.epochs and timed("should_prune (pruner)", trial.should_prune):
                pruned = True
                break
        timed("tell", lambda: study.tell(trial, state=TrialState.PRUNED) if pruned else study.tell(trial, value))
    n = args.trials
    ours = sum(cpu[k] for k in XP_CALLS)
    print(f"{n} trials, {args.storage}, {args.sampler}: {1000 * sum(cpu.values()) / n:.2f} ms of CPU a trial; xp's "
          f"own bookkeeping {1000 * ours / n:.2f} ms, Optuna's {1000 * (sum(cpu.values()) - ours) / n:.2f} ms")
    for kind, seconds in cpu.most_common():
        print(f"  {kind:24} {1000 * seconds / n:7.2f} ms a trial{'  (xp)' if kind in XP_CALLS else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
