"""Training-loop overhead: xp's logged throughput (gluon and module backends) against minimal
hand-written MXNet loops with the same model, data, batch and optimizer, on the CPU.

The data is one fixed random batch already in memory (dataset=synthetic), so the
comparison is about the loop, not the input pipeline. Target: xp / hand >= 0.97.

    .venv/bin/python benchmarks/loop_overhead.py [--model resnet18] [--size 32] [--batch 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import compose, interleave, report, temp_store


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", help="conf/model option")
    ap.add_argument("--size", type=int, default=32, help="image height and width")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per measurement; the median counts")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    uri = temp_store()

    import mxnet as mx
    from mlflow.tracking import MlflowClient
    from mxnet import autograd, gluon

    from xp.experiment import run
    from xp.mx.models import build_net
    from xp.plan import ModelSpec

    classes, warmup = 10, 2
    shape = (args.batch, 3, args.size, args.size)
    overrides = [f"model={args.model}", "dataset=synthetic", f"dataset.image_shape=[3,{args.size},{args.size}]",
                 f"dataset.num_classes={classes}", f"dataset.train_size={args.batch * args.steps}",
                 f"dataset.val_size={args.batch}", f"batch={args.batch}", f"epochs={args.epochs}",
                 f"timing_warmup_batches={warmup}", "lr_schedule=constant"]
    spec = compose(*overrides)["model"]
    model = ModelSpec(spec["name"], spec["zoo"], spec["arch"])
    rng = mx.nd.random
    data, label = rng.uniform(-1, 1, shape), mx.nd.array(mx.nd.random.randint(0, classes, (args.batch,)))

    def xp(backend: str):
        def measure() -> float:
            run(compose(f"backend={backend}", *overrides))
            client = MlflowClient(uri)
            last = client.search_runs([client.get_experiment_by_name("xp").experiment_id],
                                      order_by=["attributes.start_time DESC"], max_results=1)[0]
            return last.data.metrics["summary.throughput"]  # median over epochs, as xp logs it
        return measure

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
