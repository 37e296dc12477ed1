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
    os.sched_setaffinity(0, cores)
    if set(cores) != set(range(os.cpu_count() or 1)):  # a slot's thread counts, as xp's slots set them
        os.environ.update({v: str(len(cores)) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                         "OPENBLAS_NUM_THREADS")})
    import mxnet as mx
    from mxnet import autograd, gluon

    from common import compose
    from xp.data import datasets
    from xp.mx.models import build_net
    from xp.run.plan import build_plan

    plan = build_plan(compose(), visible_gpus=0)
    x, y, vx, vy = datasets.load_arrays(plan.dataset)
    xs, ys, vxs = mx.nd.array(x), mx.nd.array(y), mx.nd.array(vx)
    batches = BATCHES if part == "all" else BATCHES[int(part.split("/")[0])::int(part.split("/")[1])]
    t0 = time.perf_counter()
    for batch in batches:
        mx.random.seed(plan.seed)
        net = build_net(plan.model, plan.dataset.num_classes)
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for epoch in range(1, 7):
            order = mx.nd.array(datasets.epoch_order(len(x), plan.seed, epoch, True))
            data, label = xs.take(order), ys.take(order)
            for i in range(len(x) // batch):
                with autograd.record():
                    loss = loss_fn(net(data[i * batch:(i + 1) * batch]), label[i * batch:(i + 1) * batch])
                loss.backward()
                trainer.step(batch)
            float((net(vxs).asnumpy().argmax(axis=1) == vy).mean())
    print(f"{time.perf_counter() - t0:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main([int(c) for c in sys.argv[1].split(",")], sys.argv[2]))
