"""Horovod backend: gradients allreduced over gloo between worker processes started by horovodrun.

backend.api=gluon trains with horovod.mxnet.DistributedTrainer, api=module with mx.mod.Module
and horovod.mxnet.DistributedOptimizer. Every worker starts from rank 0's parameters
(broadcast_parameters) and trains one device; `python -m xp backend=horovod workers=N`
runs horovodrun itself (xp.launching).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from xp.errors import ConfigError
from xp_plugins.gluon import GluonBackend
from xp_plugins.module_api import ModuleBackend

APIS = ("gluon", "module")


class Horovod:
    """What both API variants share: processes, rank, broadcast, aggregation scale."""
    name = "horovod"
    requires = (*GluonBackend.requires, "horovod")

    @classmethod
    def for_plan(cls, plan: Any) -> type:
        api = plan.backend_options.get("api", "gluon")
        if api not in APIS:
            raise ConfigError(f"backend.api={api!r}: must be one of {', '.join(APIS)}")
        return HorovodModuleBackend if api == "module" else HorovodBackend

    @classmethod
    def engine_for(cls, plan: Any) -> Any:
        from xp.mx.horovodrun import Horovod

        return Horovod

    @classmethod
    def check(cls, plan: Any) -> None:
        try:
            import horovod.mxnet  # noqa: F401
        except Exception as e:  # ImportError, or a build without MXNet support
            raise ConfigError(f"backend=horovod: Horovod with MXNet support is not installed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:160]}); ./dev.sh setup builds it against the installed "
                              "mxnet") from None
        if plan.kvstore.startswith("dist_"):
            raise ConfigError(f"kvstore={plan.kvstore}: backend=horovod allreduces gradients itself; "
                              "use kvstore=local (or another backend for the parameter server)")
        if len(plan.devices) > 1:
            raise ConfigError(f"backend=horovod: one device per worker process ({len(plan.devices)} asked); "
                              f"use workers={len(plan.devices) * plan.workers} instead")
        super().check(plan)

    def connect(self, plan: Any) -> Any:
        import horovod.mxnet as hvd

        hvd.init()
        if hvd.size() != plan.workers:
            raise ConfigError(f"workers={plan.workers}: horovodrun started {hvd.size()} processes")
        return replace(plan, rank=hvd.rank())

    def device_ids(self) -> list[int]:
        import horovod.mxnet as hvd

        return [hvd.local_rank()] if self.plan.device_type == "gpu" else [0]  # one GPU per worker on a host

    @property
    def grad_batch(self) -> int:
        # Horovod's trainer and optimizer divide the allreduced sum by the number of workers
        return self.plan.worker_batch

    @property
    def kvstore(self) -> Any:
        return None  # Horovod, not a kvstore, aggregates

    def join(self) -> None:
        import horovod.mxnet as hvd

        import mxnet as mx

        # plain copies: after a forward pass MXNet keeps conv weights in its MKL-DNN layout, which
        # Horovod's in-place broadcast corrupts ("We can't generate TBlob for MKLDNN data")
        plain = {name: mx.nd.array(v, dtype=v.dtype) for name, v in self.get_params().items()}
        hvd.broadcast_parameters(plain, root_rank=0)
        if getattr(self, "mod", None) is not None:
            arg, aux = self.mod.get_params()
            self.mod.set_params({k: plain[k] for k in arg}, {k: plain[k] for k in aux})
        else:
            for name, p in self.net.collect_params().items():
                p.set_data(plain[name])
        super().join()  # then every worker checks it holds the same weights

    def gather(self, value: float) -> list[float]:
        import horovod.mxnet as hvd
        import mxnet as mx

        return hvd.allgather(mx.nd.array([value], dtype="float64"), name="xp.gather").asnumpy().tolist()


class HorovodBackend(Horovod, GluonBackend):
    """backend.api=gluon (the registered class; for_plan picks the Module variant)."""

    def make_trainer(self) -> Any:
        import horovod.mxnet as hvd

        return hvd.DistributedTrainer(self.net.collect_params(), self.make_optimizer())


class HorovodModuleBackend(Horovod, ModuleBackend):
    """backend.api=module."""

    def wrap_optimizer(self, optimizer: Any) -> Any:
        import horovod.mxnet as hvd

        # Module names the parameters of an optimizer it is given only when it sees no names, and it
        # would name the wrapper, not the optimizer inside: per-name multipliers (no decay on biases)
        # would be lost. One device per worker: update index i is parameter i.
        optimizer.idx2name = dict(enumerate(self.mod._param_names))
        return hvd.DistributedOptimizer(optimizer)
