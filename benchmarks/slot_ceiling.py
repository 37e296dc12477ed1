"""What a second core can give a study of LeNet on the digits on this machine, with nothing of xp or Optuna:
the same fixed trials (6 epochs each, batches 16 to 128) trained bare with Gluon, in one process on the cores it
is given. benchmarks/study_scheduler.py runs it once on all the cores, and once per core in two processes at
the same time, each pinned to its core with one thread, taking half the trials: the ratio of the two wall
times is the most two slots can run faster than one.

    .venv/bin/python benchmarks/slot_ceiling.py CORES PART   (CORES: 0,1; PART: all, or i/n for every n-th trial)
"""

from __future__ import annotations

import os
import sys
import time

BATCHES = (16, 32, 64, 128, 128, 64, 32, 16)  # in an order whose halves (every other one) are the same work


def main(cores: list[int], part: str) -> int:
    whole = set(cores) == os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    if not whole:  # a slot's thread counts, as xp's slots set them
        os.environ.update({v: str(len(cores)) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                         "OPENBLAS_NUM_THREADS")})
    from bare_study import load, train
    from common import compose
    from xp.run.plan import build_plan

    plan = build_plan(compose(), visible_gpus=0)
    arrays = load(plan)  # MXNet imported
    batches = BATCHES if part == "all" else BATCHES[int(part.split("/")[0])::int(part.split("/")[1])]
    t0 = time.perf_counter()
    for batch in batches:
        train(plan, arrays, 0.05 * 32 / batch, batch, 0.9, 6)
    print(f"{time.perf_counter() - t0:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main([int(c) for c in sys.argv[1].split(",")], sys.argv[2]))
