"""One worker of benchmarks/comm_hosts.py: time one gradient exchange of N float32 values per step with one
engine's own primitive (ps-lite push+pull, Horovod allreduce, torch.distributed all_reduce over gloo).

Started by xp's launch engines (`python -m benchmarks.comm_worker ENGINE N STEPS`); rank 0 prints
`RESULT ENGINE MEDIAN_MS MIN_MS`.
"""

from __future__ import annotations

import statistics
import sys
import time

from xp.run.worker import report_progress


def main() -> None:
    engine, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if engine == "ps-lite":
        import mxnet as mx

        kv = mx.kv.create("dist_sync")
        grad, weights = mx.nd.ones(n), mx.nd.zeros(n)
        kv.init(0, weights)
        rank = kv.rank

        def step() -> None:
            kv.push(0, grad)
            kv.pull(0, out=weights)
            weights.wait_to_read()
    elif engine == "horovod":
        import horovod.mxnet as hvd
        import mxnet as mx

        hvd.init()
        grad, rank = mx.nd.ones(n), hvd.rank()

        def step() -> None:
            hvd.allreduce_(grad, average=False, name="grad")
            grad.wait_to_read()
    else:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        grad, rank = torch.ones(n), dist.get_rank()

        def step() -> None:
            dist.all_reduce(grad)
    times = []
    for i in range(steps + 2):  # two warm-up steps (connections, buffers) are not timed
        report_progress(rank)
        t0 = time.perf_counter()
        step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"RESULT {engine} {statistics.median(times) * 1000:.1f} {min(times) * 1000:.1f}", flush=True)


if __name__ == "__main__":
    main()
