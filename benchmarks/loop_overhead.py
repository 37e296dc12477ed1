"""Training-loop overhead: xp's logged throughput against minimal hand-written loops with the same
model, data, batch and optimizer, on the CPU, interleaved in one process.

Two cases:
- `--data synthetic` (default): one fixed random batch in memory (dataset=synthetic), gluon and
  module backends against hand-written hybridized Gluon and Module API loops. Target: >= 0.97.
- `--data digits`: the default experiment (LeNet on the digits, data in memory, batch 32, about
  1 ms a step, so every microsecond of xp's own per-step work shows), gluon, module and torch
  against hand-written Gluon, Module and PyTorch loops over the same in-memory arrays in the same
  epoch order. Target: >= 0.95.

    .venv/bin/python benchmarks/loop_overhead.py [--model resnet18] [--size 32] [--batch 32] [--reps 3]
    .venv/bin/python benchmarks/loop_overhead.py --data digits [--epochs 10] [--reps 3]
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from common import logged_throughput, compose, interleave, report, synthetic_args, synthetic_overrides, temp_store

WARMUP = 2  # batches per epoch left out of the timing, as xp's timing_warmup_batches
MX_INIT = dict(rnd_type="gaussian", factor_type="in", magnitude=2)


def timed_epochs(steps: Callable[[int], object], epochs: int, batch: int, sync: Callable[[], None]) -> float:
    """Median samples/s over `epochs` epochs of the step iterator `steps(epoch)`, timed as xp times
    them: from the end of the warm-up batches (synchronised) to the end of the epoch's work."""
    rates = []
    for epoch in range(1, epochs + 1):
        n = 0
        for i, _ in enumerate(steps(epoch)):
            n += 1
            if i == WARMUP - 1:
                sync()
                start = time.perf_counter()
        sync()
        rates.append((n - WARMUP) * batch / (time.perf_counter() - start))
    return statistics.median(rates)


def mx_gluon_loop(net, batches, lr: float, batch: int):
    """The textbook hybridized Gluon step: record, backward, Trainer.step."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net.initialize(mx.init.Xavier(**MX_INIT))
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def steps(epoch: int):
        for data, label in batches(epoch):
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(batch)
            yield
    return steps


def mx_module_loop(net, batches, lr: float, batch: int, shape: tuple[int, ...]):
    """The textbook Module API step: forward_backward, update."""
    import mxnet as mx

    sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    mod = mx.mod.Module(sym, context=mx.cpu())
    mod.bind(data_shapes=[("data", (batch, *shape))], label_shapes=[("softmax_label", (batch,))])
    mod.init_params(mx.init.Xavier(**MX_INIT))
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": lr, "momentum": 0.9, "wd": 1e-4,
                                                          "rescale_grad": 1.0 / batch})

    def steps(epoch: int):
        for data, label in batches(epoch):
            mod.forward_backward(mx.io.DataBatch([data], [label]))
            mod.update()
            yield
    return steps


def synthetic(args) -> int:
    import mxnet as mx

    from xp.mx.models import build_net
    from xp.run.plan import ModelSpec

    classes = 10
    shape = (3, args.size, args.size)
    overrides = synthetic_overrides(args, classes, WARMUP)
    spec = compose(*overrides)["model"]
    model = ModelSpec(spec["name"], spec["zoo"], spec["arch"])
    data = mx.nd.random.uniform(-1, 1, (args.batch, *shape))
    label = mx.nd.array(mx.nd.random.randint(0, classes, (args.batch,)))

    def batches(epoch: int):
        return ((data, label) for _ in range(args.steps))

    def hand(kind: str):
        def measure() -> float:
            net = build_net(model, classes, shape)
            loop = (mx_gluon_loop(net, batches, 0.02, args.batch) if kind == "gluon"
                    else mx_module_loop(net, batches, 0.02, args.batch, shape))
            return timed_epochs(loop, args.epochs, args.batch, mx.nd.waitall)
        return measure

    results = interleave({"hand-written gluon": hand("gluon"), "xp backend=gluon": xp("gluon", *overrides),
                          "hand-written module": hand("module"), "xp backend=module": xp("module", *overrides)},
                         args.reps)
    return report(f"Training loop, {args.model} on {(args.batch, *shape)} random batches, CPU, "
                  f"{args.steps} steps x {args.epochs} epochs", results,
                  [("xp backend=gluon", "hand-written gluon", 0.97), ("xp backend=module", "hand-written module", 0.97)],
                  f"loop_overhead_{args.model}_{args.size}.json")


def digits(args) -> int:
    """The default experiment (LeNet, digits in memory, batch 32) against hand-written loops that slice
    the same arrays in the same epoch order."""
    import mxnet as mx
    import torch

    from xp.data import datasets
    from xp.mx.models import build_net
    from xp.run.plan import build_plan
    from xp.pt.models import build_model

    overrides = [f"epochs={args.epochs}", f"batch={args.batch}"]
    plan = build_plan(compose(*overrides), visible_gpus=0)
    x, y, _, _ = datasets.load_arrays(plan.dataset)
    b, steps, lr = plan.global_batch, plan.steps_per_epoch, plan.effective_lr
    xs_mx, ys_mx = mx.nd.array(x), mx.nd.array(y)
    xs_pt, ys_pt = torch.from_numpy(x), torch.from_numpy(y)

    def mx_batches(epoch: int):
        order = mx.nd.array(datasets.epoch_order(len(x), plan.seed, epoch, True))
        data, label = xs_mx.take(order), ys_mx.take(order)  # the epoch's order, once; batches are views of it
        return ((data[i * b:(i + 1) * b], label[i * b:(i + 1) * b]) for i in range(steps))

    def hand_mx(kind: str):
        def measure() -> float:
            net = build_net(plan.model, plan.dataset.num_classes, plan.dataset.image_shape)
            loop = (mx_gluon_loop(net, mx_batches, lr, b) if kind == "gluon"
                    else mx_module_loop(net, mx_batches, lr, b, plan.dataset.image_shape))
            return timed_epochs(loop, args.epochs, b, mx.nd.waitall)
        return measure

    def hand_torch(**sgd) -> Callable[[], float]:
        def measure() -> float:
            torch.manual_seed(plan.seed)
            net = build_model(plan.model, plan.dataset.num_classes, plan.dataset.image_shape)
            opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4, **sgd)
            loss_fn = torch.nn.CrossEntropyLoss()

            def loop(epoch: int):
                order = torch.from_numpy(datasets.epoch_order(len(x), plan.seed, epoch, True))
                data, label = xs_pt[order], ys_pt[order]
                for i in range(steps):
                    opt.zero_grad(set_to_none=True)
                    loss_fn(net(data[i * b:(i + 1) * b]), label[i * b:(i + 1) * b]).backward()
                    opt.step()
                    yield
            return timed_epochs(loop, args.epochs, b, lambda: None)
        return measure

    results = interleave({"hand-written gluon": hand_mx("gluon"), "xp backend=gluon": xp("gluon", *overrides),
                          "hand-written module": hand_mx("module"), "xp backend=module": xp("module", *overrides),
                          "hand-written torch": hand_torch(), "xp backend=torch": xp("torch", *overrides),
                          # xp's torch backend uses SGD's fused kernel: what that alone is worth (no target)
                          "hand-written torch, fused": hand_torch(fused=True)}, args.reps)
    return report(f"Training loop, the default experiment (LeNet, digits in memory, batch {b}), CPU, "
                  f"{steps} steps x {args.epochs} epochs", results,
                  [(f"xp backend={k}", f"hand-written {k}", 0.95) for k in ("gluon", "module", "torch")],
                  f"loop_overhead_digits_{b}.json")


def xp(backend: str, *overrides: str) -> Callable[[], float]:
    return lambda: logged_throughput(f"backend={backend}", *overrides)


def main() -> int:
    ap = synthetic_args(__doc__.splitlines()[0])
    ap.add_argument("--data", choices=("synthetic", "digits"), default="synthetic")
    args = ap.parse_args()
    if args.data == "digits" and args.epochs == 3:
        args.epochs = 10  # the default experiment's epochs: its epochs are short (about 45 ms)
    temp_store()
    return 0 if (digits if args.data == "digits" else synthetic)(args) else 1


if __name__ == "__main__":
    raise SystemExit(main())
