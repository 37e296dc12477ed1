"""Training-loop overhead: xp's logged throughput (gluon and module backends) against minimal
hand-written MXNet loops with the same model, data, batch and optimizer, on the CPU.

The data is one fixed random batch already in memory (dataset=synthetic), so the
comparison is about the loop, not the input pipeline. Target: xp / hand >= 0.97.

    .venv/bin/python benchmarks/loop_overhead.py [--model resnet18] [--size 32] [--batch 32] [--reps 3]
"""

from __future__ import annotations

import statistics
import time

from common import logged_throughput, compose, interleave, report, synthetic_args, synthetic_overrides, temp_store


def main() -> int:
    args = synthetic_args(__doc__.splitlines()[0]).parse_args()
    temp_store()

    import mxnet as mx
    from mxnet import autograd, gluon

    from xp.mx.models import build_net
    from xp.plan import ModelSpec

    classes, warmup = 10, 2
    shape = (args.batch, 3, args.size, args.size)
    overrides = synthetic_overrides(args, classes, warmup)
    spec = compose(*overrides)["model"]
    model = ModelSpec(spec["name"], spec["zoo"], spec["arch"])
    rng = mx.nd.random
    data, label = rng.uniform(-1, 1, shape), mx.nd.array(mx.nd.random.randint(0, classes, (args.batch,)))

    def xp(backend: str):
        return lambda: logged_throughput(f"backend={backend}", *overrides)

    def timed_epochs(step) -> float:
        rates = []
        for _ in range(args.epochs):
            for i in range(args.steps):
                step()
                if i == warmup - 1:
                    mx.nd.waitall()
                    start = time.perf_counter()
            mx.nd.waitall()
            rates.append((args.steps - warmup) * args.batch / (time.perf_counter() - start))
        return statistics.median(rates)

    def hand_gluon() -> float:
        net = build_net(model, classes)
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.02, "momentum": 0.9, "wd": 1e-4})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

        def step():
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch)
        return timed_epochs(step)

    def hand_module() -> float:
        net = build_net(model, classes)
        sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
        mod = mx.mod.Module(sym, context=mx.cpu())
        mod.bind(data_shapes=[("data", shape)], label_shapes=[("softmax_label", (args.batch,))])
        mod.init_params(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
        mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.02, "momentum": 0.9, "wd": 1e-4,
                                                              "rescale_grad": 1.0 / args.batch})
        batch = mx.io.DataBatch([data], [label])

        def step():
            mod.forward_backward(batch)
            mod.update()
        return timed_epochs(step)

    results = interleave({"hand-written gluon": hand_gluon, "xp backend=gluon": xp("gluon"),
                          "hand-written module": hand_module, "xp backend=module": xp("module")}, args.reps)
    ok = report(f"Training loop, {args.model} on {shape} random batches, CPU, {args.steps} steps x {args.epochs} epochs",
                results, [("xp backend=gluon", "hand-written gluon", 0.97),
                          ("xp backend=module", "hand-written module", 0.97)],
                f"loop_overhead_{args.model}_{args.size}.json")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
