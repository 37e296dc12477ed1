"""xp.check's probe of a network on MXNet: one batch of the run's data through the network the backend builds."""

from __future__ import annotations

import time
from pathlib import Path

import mxnet as mx
import numpy as np

from xp.run.plan import Plan


class Probe:
    def __init__(self, plan: Plan):
        from xp.mx.models import build_net, initialize

        self.plan, self.ctx = plan, [mx.cpu()]
        self.net = build_net(plan.model, plan.dataset.num_classes, plan.dataset.image_shape, plan.backend)
        initialize(self.net, self.ctx, plan.seed, plan.dataset.image_shape)
        self.start = {n: p.data().copy() for n, p in self.net.collect_params().items()}

    def _reset(self) -> None:
        for n, p in self.net.collect_params().items():
            p.set_data(self.start[n])

    def batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's first training batch, as the backend reads it (one process)."""
        from xp.mx.data import make_iters

        train, _ = make_iters(self.plan)
        train.reset()
        b = train.next()
        return b.data[0].asnumpy().astype(np.float32), b.label[0].asnumpy().astype(np.int64)

    def outputs(self, x: np.ndarray) -> np.ndarray:
        self._reset()
        return self.net(mx.nd.array(x)).asnumpy()

    def _loss(self, x: np.ndarray, y: np.ndarray):
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
        with mx.autograd.record():
            out = loss(self.net(mx.nd.array(x)), mx.nd.array(y)).mean()
        out.backward()
        return out

    def grads(self, x: np.ndarray, y: np.ndarray, seed: int) -> tuple[dict[str, np.ndarray], float]:
        """Each parameter's gradient of the mean cross-entropy on (x, y), in training mode, from the same weights
        and random state (seed) every time."""
        self._reset()
        mx.random.seed(seed)
        loss = self._loss(x, y)
        return ({n: p.grad().asnumpy().copy() for n, p in self.net.collect_params().items() if p.grad_req != "null"},
                float(loss.asscalar()))

    def losses(self, x: np.ndarray, y: np.ndarray, steps: int, lr: float) -> list[float]:
        self._reset()
        trainer = mx.gluon.Trainer(self.net.collect_params(), "sgd", {"learning_rate": lr, "momentum": 0.9})
        out = []
        for _ in range(steps):
            loss = self._loss(x, y)
            trainer.step(1)  # the loss is a mean already
            out.append(float(loss.asscalar()))
        self._reset()
        return out

    def step_time(self, x: np.ndarray, y: np.ndarray, steps: int) -> float:
        self._reset()
        trainer = mx.gluon.Trainer(self.net.collect_params(), "sgd", {"learning_rate": 0.0})
        self._loss(x, y)  # the first step's set-up is not a step's time
        trainer.step(1)
        mx.nd.waitall()
        t0 = time.perf_counter()
        for _ in range(steps):
            self._loss(x, y)
            trainer.step(1)
        mx.nd.waitall()
        took = (time.perf_counter() - t0) / steps
        self._reset()
        return took

    def suspects(self) -> dict[str, list[str]]:
        """The layers that make N workers differ from one: BatchNorm without sync, dropout."""
        from mxnet.gluon import nn

        bn, drop = [], []

        def walk(block):
            for child in block._children.values():
                kind = type(child).__name__
                if isinstance(child, nn.BatchNorm) and "SyncBatchNorm" not in kind:
                    bn.append(f"{child.name} ({kind})")
                elif isinstance(child, nn.Dropout) and child._rate > 0:
                    drop.append(f"{child.name} ({kind})")
                walk(child)
        walk(self.net)
        return {"BatchNorm without sync": bn, "dropout": drop}

    def exported(self, x: np.ndarray, folder: Path) -> np.ndarray:
        """Predictions of the network saved as xp logs it (an MLflow pyfunc of its symbol) and loaded back."""
        import mlflow.pyfunc

        from xp.mx.saved import save
        from xp.tracking.models import built

        self._reset()
        save(self.net, {n: v.asnumpy() for n, v in self.start.items()}, folder, x, {})
        built(folder)
        return np.asarray(mlflow.pyfunc.load_model(str(folder)).predict(x))

    def framework_version(self) -> str:
        return mx.__version__
