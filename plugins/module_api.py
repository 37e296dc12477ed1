"""Module API backend: mx.mod.Module on the symbol of the same Gluon block, updated through a kvstore."""

from __future__ import annotations

from typing import Any

from xp.errors import ConfigError
from xp.mx.base import MXNetBackend, to_numpy


class ModuleBackend(MXNetBackend):
    name = "module"
    gather_key = "xp.gather"  # Module keys the kvstore by parameter name

    @classmethod
    def check(cls, plan: Any) -> None:
        super().check(plan)
        if plan.dtype == "amp" and plan.device_type == "gpu":
            raise ConfigError("dtype=amp: float16 AMP needs dynamic loss scaling, which MXNet's SoftmaxOutput "
                              "(backend=module) does not support; use backend=gluon or dtype=float16")

    def prepare(self) -> None:
        import mxnet as mx

        data = mx.sym.var("data")
        if self.plan.dtype == "float16":
            data = mx.sym.Cast(data, dtype="float16")
        logits = self.net(data)  # the Gluon block traced into a symbol: one model definition
        if self.plan.dtype == "float16":
            logits = mx.sym.Cast(logits, dtype="float32")  # softmax and loss in float32
        # Two heads: SoftmaxOutput supplies the gradient; the blocked logits feed the shared metrics.
        symbol = mx.sym.Group([mx.sym.SoftmaxOutput(logits, name="softmax"), mx.sym.BlockGrad(logits)])
        params = self.net.collect_params()
        frozen = [name for name, p in params.items() if p.grad_req == "null" and name in symbol.list_arguments()]
        self.mod = mx.mod.Module(symbol, data_names=["data"], label_names=["softmax_label"], context=self.contexts,
                                 fixed_param_names=frozen)
        self.mod.bind(data_shapes=self.train_iter.provide_data, label_shapes=self.train_iter.provide_label)
        values = {name: p.data(self.contexts[0]) for name, p in params.items()}
        self.mod.set_params({k: values[k] for k in symbol.list_arguments() if k in values},
                            {k: values[k] for k in symbol.list_auxiliary_states()})
        # SoftmaxOutput's gradient is per sample; 1/batch makes the summed gradient the mean, as in Gluon.
        self.optimizer = self.make_optimizer(rescale_grad=1.0 / self.grad_batch)
        # the block's per-parameter multipliers (no decay on biases, backbone lr) hold here too
        self.optimizer.set_lr_mult({name: p.lr_mult for name, p in params.items()})
        self.optimizer.set_wd_mult({name: p.wd_mult for name, p in params.items()})
        # the launcher sets MXNET_UPDATE_ON_KVSTORE: 0 for dist_sync (updates and the lr schedule stay on
        # the workers), 1 for dist_async (the servers update, with xp's schedule)
        self.mod.init_optimizer(kvstore=self.kvstore, optimizer=self.wrap_optimizer(self.optimizer))

    def wrap_optimizer(self, optimizer: Any) -> Any:
        return optimizer

    @property
    def gather_index(self) -> int:
        return len(self.mod._param_names)  # string keys are numbered in the order they were initialised

    def step(self, batch: Any, lr: float) -> list[Any]:
        if not self.server_updates:
            self.optimizer.set_learning_rate(lr)
        self.mod.forward_backward(batch)
        self.mod.update()
        return [self.mod.get_outputs()[1].copy()]  # the executor's own array: the next forward overwrites it

    def get_params(self) -> dict[str, Any]:
        arg_params, aux_params = self.mod.get_params()
        return {name: to_numpy(v) for name, v in {**arg_params, **aux_params}.items()}

    def save_state(self, folder: Any) -> None:
        self.mod.save_params(str(folder / "params"))
        self.mod.save_optimizer_states(str(folder / "optimizer.states"))

    def load_state(self, folder: Any) -> None:
        self.mod.load_params(str(folder / "params"))
        self.mod.load_optimizer_states(str(folder / "optimizer.states"))

    def predict(self, batch: Any) -> list[Any]:
        self.mod.forward(batch, is_train=False)
        return [self.mod.get_outputs()[1].copy()]  # the executor's own array: the next forward overwrites it
