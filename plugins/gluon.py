"""Gluon backend: a (hybridized) HybridBlock trained by gluon.Trainer over a kvstore."""

from __future__ import annotations

from typing import Any

from xp.mx.base import MXNetBackend


class GluonBackend(MXNetBackend):
    name = "gluon"

    def prepare(self) -> None:
        from mxnet import gluon

        opts = self.plan.backend_options
        if opts.get("hybridize", True):
            # static_alloc/static_shape: one memory plan reused by every step
            self.net.hybridize(static_alloc=bool(opts.get("static_alloc", True)),
                               static_shape=bool(opts.get("static_shape", True)))
        self.trainer = self.make_trainer()
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()
        self.loss_scaling = self.amp == "float16"  # bfloat16 keeps float32's range: no scaling needed
        if self.loss_scaling:
            from mxnet.contrib import amp

            amp.init_trainer(self.trainer)

    def make_trainer(self) -> Any:
        from mxnet import gluon

        # dist_sync: servers sum gradients, workers update (update_on_kvstore=False), so the per-step
        # learning rate set here reaches every update. dist_async: servers update, with xp's schedule.
        on_servers = self.server_updates
        optimizer = self.make_optimizer()
        trainer = gluon.Trainer(self.net.collect_params(), optimizer, kvstore=self.kvstore,
                                update_on_kvstore=on_servers if self.kv is not None else None)
        if on_servers:
            optimizer.rescale_grad = 1.0 / self.grad_batch  # what step() will ask for; fixed once on the servers
            # the servers' copy of the optimizer knows parameters by number only: give it their names
            # and multipliers (no decay on biases), which Gluon would keep on the workers
            params = trainer._params
            optimizer.idx2name = {i: p.name for i, p in enumerate(params)}
            optimizer.set_lr_mult({p.name: p.lr_mult for p in params})
            optimizer.set_wd_mult({p.name: p.wd_mult for p in params})
        if self.kv is not None:
            # Trainer would push rank 0's weights and pull them at the first step, racing that step's
            # gradient pushes: a worker could pull the servers' gradient sum as its weights. Every worker
            # starts from the same weights (same seed; checked after setup), so the keys are initialised
            # here and never pulled. Copies: the kvstore keeps the arrays it is given as send buffers, and
            # with the parameters themselves some keys never reached the servers.
            trainer._init_kvstore()
            params = trainer._params
            self.kv.init(list(range(len(params))), [p.data(self.contexts[0]).copy() for p in params])
            trainer._params_to_init = []
        return trainer

    def step(self, batch: Any, lr: float) -> list[Any]:
        from mxnet import autograd

        datas, labels = self.split(batch)
        with autograd.record():
            logits = [self.net(self.cast(x)) for x in datas]
            losses = [self.loss(z, y) for z, y in zip(logits, labels)]
            if self.loss_scaling:
                from mxnet.contrib import amp

                with amp.scale_loss(losses, self.trainer) as scaled:
                    losses = scaled
        autograd.backward(losses)
        if not self.server_updates:
            self.trainer.set_learning_rate(lr)
        # Gradients are summed over devices (and workers), then scaled by 1/batch: the global batch's mean.
        self.trainer.step(self.grad_batch)
        return logits

    def save_state(self, folder: Any) -> None:
        self.net.save_parameters(str(folder / "params"))
        self.trainer.save_states(str(folder / "trainer.states"))

    def load_state(self, folder: Any) -> None:
        self.net.load_parameters(str(folder / "params"), ctx=self.contexts)
        self.trainer.load_states(str(folder / "trainer.states"))
        if not self.server_updates:  # the commit's optimizer came with its momentum: this run's goes on (a PBT
            self.trainer.optimizer.momentum = self.plan.momentum  # member's explored one)

    def predict(self, batch: Any) -> list[Any]:
        datas, _ = self.split(batch)
        return [self.net(self.cast(x)) for x in datas]

    def cast(self, x: Any) -> Any:
        return x.astype("float16") if self.plan.dtype == "float16" else x
