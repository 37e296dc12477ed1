"""The part of every MXNet backend that is not about gradient aggregation.

A plugin subclasses MXNetBackend and implements three methods: prepare
(optimizer and kvstore state for the initialised network), step (one training
step on a batch, returning the logits) and predict (logits for evaluation).
Setup, the batch loops, synchronisation and metrics live here.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from dataclasses import replace
from typing import Any

import numpy as np

from xp.run.backend import Backend
from xp.errors import ConfigError, XPError
from xp.mx import kvstore as kvstores
from xp.run.plan import Plan
from xp.mx.cpu import cpu_bfloat16, cpu_model


_amp_target: str | None = None  # MXNet's AMP, once initialised, stays on for the whole process


def enable_amp(device_type: str) -> str:
    """Switch on MXNet's AMP: float16 on GPUs, bfloat16 on CPUs (MKL-DNN kernels)."""
    global _amp_target
    target = "float16" if device_type == "gpu" else "bfloat16"
    if _amp_target is None:
        from mxnet.contrib import amp

        amp.init(target_dtype=target)
        _amp_target = target
    elif _amp_target != target:
        raise ConfigError(f"dtype=amp: AMP already runs with {_amp_target} in this process, cannot switch to {target}")
    return target


# The newest GPU architecture each MXNet wheel carries kernels for. These wheels ship
# no PTX, so a newer GPU cannot JIT-compile them: mxnet-cu112 1.9.1 stops at sm_86
# (Ampere), and an H100 (sm_90) fails at its first kernel.
MXNET_MAX_ARCH = {"mxnet-cu112": (8, 6)}


def check_compute_capability(count: int, nvml: Any = None, wheel: str | None = None) -> None:
    """Refuse GPUs the installed MXNet wheel has no kernels for, before anything starts."""
    from importlib import metadata

    from xp.run.gpu import describe_gpus
    from xp.run.telemetry import nvml_indices

    if wheel is None:
        wheel = next((w for w in MXNET_MAX_ARCH if _installed(metadata, w)), None)
    if wheel is None:
        return
    top = MXNET_MAX_ARCH[wheel]
    for index, name, cc in describe_gpus(nvml_indices(count), nvml):
        if tuple(cc) > top:
            raise ConfigError(f"gpus={count}: GPU {index} is {name} (compute capability {cc[0]}.{cc[1]}); the "
                              f"installed {wheel} has kernels up to sm_{top[0]}{top[1]} and no PTX, so it cannot "
                              "run on this GPU; use a GPU of sm_86 or older")


def _installed(metadata: Any, dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def to_numpy(x: Any) -> np.ndarray:
    """float32 numpy copy of an NDArray of any precision (bfloat16 has no numpy dtype)."""
    return (x if x.dtype == np.float32 else x.astype("float32")).asnumpy()


class MXNetBackend(Backend):
    requires = ("mxnet", "gluoncv", "numpy")
    framework = "mxnet"
    # a kvstore refuses mixed key types: the gather key has the type of the backend's parameter keys
    gather_key: int | str = 1 << 30

    @classmethod
    def warm(cls) -> None:
        import mxnet  # noqa: F401

    @classmethod
    def dataset_type(cls) -> tuple[type, str]:
        from mxnet.gluon.data import Dataset

        return Dataset, "a Gluon Dataset (mxnet.gluon.data.Dataset)"

    @classmethod
    def probe(cls, plan: Plan) -> Any:
        from xp.mx.check import Probe

        return Probe(plan)

    @classmethod
    def engine_for(cls, plan: Plan) -> Any:
        if not plan.kvstore.startswith("dist_"):
            return None
        from xp.mx.pslite import PsLite

        return PsLite

    @classmethod
    def resolve_pretrained(cls, request: Any, model: Any) -> Any:
        from xp.mx.pretrained import resolve

        return resolve(request, model)

    @classmethod
    def planned(cls, plan: Plan) -> Plan:
        return kvstores.planned(plan)

    @classmethod
    def check(cls, plan: Plan) -> None:
        kvstores.check(plan)
        from xp.mx.models import check_network

        check_network(plan)  # a zoo of MXNet's; a registered network offered for MXNet, a package's probed
        if plan.dtype == "float16" and plan.device_type != "gpu":
            raise ConfigError("dtype=float16: MXNet 1.9.1 has no float16 CPU kernels for dense layers "
                              "(\"FP16 gemm on cpu not implemented\"); on the CPU use dtype=float32 or dtype=amp "
                              "(bfloat16), or train on GPUs (gpus>=1)")
        if plan.dtype == "bfloat16":
            raise ConfigError("dtype=bfloat16: the MXNet backends reach bfloat16 through AMP on CPUs; use dtype=amp "
                              "(or backend=torch dtype=bfloat16)")
        if plan.dtype == "amp" and plan.device_type != "gpu" and not cpu_bfloat16():
            raise ConfigError(f"dtype=amp on the CPU: MXNet's bfloat16 kernels (MKL-DNN) need AVX-512, which this CPU "
                              f"({cpu_model()}) does not have; use dtype=float32, backend=torch dtype=bfloat16, or "
                              "train on GPUs (gpus>=1)")
        if plan.workers > 1 and cls.engine_for(plan) is None:
            raise ConfigError(f"workers={plan.workers}: several worker processes need a distributed kvstore "
                              "(kvstore=dist_sync) or backend=horovod; for devices in one process use "
                              "cpu_devices/gpus")
        if plan.kvstore == "nccl":  # on GPUs (kvstore.check)
            import mxnet as mx

            if not mx.runtime.Features().is_enabled("NCCL"):
                raise ConfigError(f"kvstore=nccl: the installed mxnet {mx.__version__} was built without NCCL; "
                                  "use kvstore=device")
        if plan.dataset.options.get("kind") == "rec":
            from xp.data.recordio import check_records

            o = plan.dataset.options
            for part in ("train", "val"):  # a bad file fails before any run starts, naming the file
                # without a resize, MXNet silently upscales images smaller than the crop
                resized = o.get("resize") or (part == "train" and o.get("random_resized_crop"))
                rec = o[f"{part}_rec"]
                check_records(rec, rec[:-4] + ".idx", plan.dataset.num_classes, limit=8,
                              min_size=None if resized else plan.dataset.image_shape[1:])
        if _amp_target is not None and plan.dtype != "amp":
            raise ConfigError(f"dtype={plan.dtype}: MXNet's AMP was switched on earlier in this process and "
                              "patches operators process-wide; run dtype=amp and other dtypes as separate commands")

    @classmethod
    def check_devices(cls, plan: Plan) -> None:
        if plan.device_type == "gpu":
            check_compute_capability(len(plan.devices))
            import mxnet as mx

            seen = mx.context.num_gpus()
            if seen < len(plan.devices):
                raise ConfigError(f"gpus={len(plan.devices)}: the installed mxnet {mx.__version__} can use {seen} "
                                  "GPUs (a CPU build?); install the GPU build: pip install -e '.[gpu]'")

    @classmethod
    def fits(cls, plan: Plan) -> bool:
        from xp.mx.models import fits

        return fits(plan)

    # --- plugin hooks --------------------------------------------------------
    @abstractmethod
    def prepare(self) -> None:
        """Create the optimizer/kvstore state for self.net (already initialised on self.contexts)."""

    @abstractmethod
    def step(self, batch: Any, lr: float) -> list[Any]:
        """Forward, backward and update on one batch at learning rate `lr`; return the logits (NDArrays), without
        waiting for them. They are read after the next step was given: arrays that step overwrites are copied."""

    @abstractmethod
    def predict(self, batch: Any) -> list[Any]:
        """Logits for one batch, without training."""

    # --- shared ----------------------------------------------------------------
    def setup(self, plan: Plan) -> None:
        import mxnet as mx

        from xp.mx.data import make_iters
        from xp.mx.models import build_net, initialize, load_pretrained

        from xp.run.worker import report_progress

        self.kv: Any = None  # mx.kv's store of a dist_* job
        plan = self.connect(plan)
        report_progress(plan.rank)  # a launched worker tells its launcher its rank as soon as it knows it
        self.plan = plan
        random.seed(plan.seed)
        np.random.seed(plan.seed)
        mx.random.seed(plan.seed)
        make_ctx = mx.gpu if plan.device_type == "gpu" else mx.cpu
        self.contexts = [make_ctx(i) for i in self.device_ids()]
        self.amp = enable_amp(plan.device_type) if plan.dtype == "amp" else None  # before the net is built
        self.backbone = None
        if plan.pretrained:
            self.net, self.backbone = load_pretrained(plan.pretrained, plan.model, plan.dataset.num_classes,
                                                      plan.dataset.image_shape, self.contexts, plan.backend)
        else:
            self.net = build_net(plan.model, plan.dataset.num_classes, plan.dataset.image_shape, plan.backend)
        initialize(self.net, self.contexts, plan.seed, plan.dataset.image_shape)
        self.draws = '"Dropout"' in self.net(mx.sym.var("data")).tojson()  # random layers in the graph
        if self.backbone is not None and plan.pretrained is not None:
            for p in self.backbone.collect_params().values():
                if plan.pretrained.freeze_backbone:
                    p.grad_req = "null"  # gradients are neither computed nor applied
                else:
                    p.lr_mult = plan.pretrained.backbone_lr_mult
        if plan.dtype == "float16":
            self.net.cast("float16")  # the optimizer keeps float32 master copies (multi_precision)
        # MXNet's convention (the Module API applies it by name): no weight decay on biases and
        # BatchNorm betas. Set on the block too, so every backend decays the same parameters.
        for name, p in self.net.collect_params().items():
            if not name.endswith(("_weight", "_gamma")):
                p.wd_mult = 0.0
        self.train_iter, self.val_iter = make_iters(plan)
        self.prepare()
        if plan.resume:
            from xp.run.checkpoint import require

            self.load_state(require(plan.resume).folder)  # every worker loads the same commit
        if plan.workers > 1 or self.kv is not None:
            self.join()

    def split(self, batch: Any) -> tuple[list[Any], list[Any]]:
        """The batch's data and labels, one even slice per device, in device order."""
        from mxnet import gluon

        load = gluon.utils.split_and_load
        return (load(batch.data[0], self.contexts, even_split=True),
                load(batch.label[0], self.contexts, even_split=True))

    # --- distributed (ps-lite here; a backend with its own engine overrides these) ---------------
    def connect(self, plan: Plan) -> Plan:
        """Join the job's other processes; return the plan with this worker's rank (it picks the data shard)."""
        if plan.kvstore.startswith("dist_"):
            import mxnet as mx

            from xp.mx.pslite import check_scheduler

            check_scheduler()  # mx.kv.create would wait forever for a scheduler that is not there
            self.kv = mx.kv.create(plan.kvstore)  # ps-lite assigns the rank
            if self.kv.num_workers != plan.workers:
                raise ConfigError(f"workers={plan.workers}: the parameter server reports {self.kv.num_workers}")
            plan = replace(plan, rank=self.kv.rank)
        return plan

    def device_ids(self) -> list[int]:
        return list(range(len(self.plan.devices)))

    @property
    def grad_batch(self) -> int:
        """The samples an update's gradient sums over: devices and, through a synchronous kvstore, workers."""
        return self.plan.worker_batch if self.server_updates else self.plan.global_batch

    @property
    def server_updates(self) -> bool:
        """dist_async: the servers hold the optimizer and its learning-rate schedule (xp.mx.server)."""
        return self.plan.kvstore == "dist_async"

    @property
    def kvstore(self) -> Any:
        """What Trainer and Module get: the distributed kvstore object, or a local kvstore's name."""
        return self.kv if self.kv is not None else self.plan.kvstore

    def join(self) -> None:
        """Finish a distributed setup: every worker holds the same weights before the first step."""
        import mxnet as mx

        if self.kv is not None:
            # ps-lite's init returns before rank 0's values reach the servers; a worker that pushed right
            # away would have its gradient taken as the key's initial value. Wait for every push, then meet.
            self.kv.init(self.gather_key, mx.nd.zeros(self.plan.workers))
            self._gathered = 0.0
            mx.nd.waitall()
            self.kv._barrier()
        sums = self.gather(float(sum(v.astype(np.float64).sum() for v in self.get_params().values())))
        if len(set(sums)) > 1:
            raise XPError(f"workers start from different weights (parameter sums {sums}); "
                          "every worker must build the model with the same seed")

    def gather(self, value: float) -> list[float]:
        if self.kv is None:
            return [value]
        import mxnet as mx

        # dist_sync sums the workers' pushes: each writes its own slot, the pull returns every slot.
        # dist_async adds each push to what the key holds: a worker pushes the change of its value.
        mine = mx.nd.zeros(self.plan.workers)
        mine[self.plan.rank] = value - self._gathered if self.server_updates else value
        self._gathered = value
        self.kv.push(self.gather_key, mine)
        if self.server_updates:
            mx.nd.waitall()
            self.kv._barrier()  # every worker's push applied
        out = mx.nd.zeros(self.plan.workers)
        self.kv.pull(self.gather_key, out=out)
        values = out.asnumpy().tolist()
        if self.server_updates:
            self.kv._barrier()  # every worker read before the next round's pushes
        return values

    def make_optimizer(self, rescale_grad: float = 1.0) -> Any:
        """The optimizer every MXNet backend uses, so their updates are the same arithmetic."""
        import mxnet as mx

        kwargs = dict(learning_rate=self.plan.effective_lr, momentum=self.plan.momentum, wd=self.plan.wd,
                      rescale_grad=rescale_grad, multi_precision=self.plan.dtype == "float16")
        if not self.server_updates:
            return mx.optimizer.create(self.plan.optimizer, **kwargs)
        from xp.mx.server import PlanSchedule, ServerOptimizer

        return ServerOptimizer(mx.optimizer.create(self.plan.optimizer, lr_scheduler=PlanSchedule(self.plan), **kwargs),
                               self.gather_index)

    @property
    def gather_index(self) -> int:
        """The gather key as the servers number it (int keys are their own number)."""
        return self.gather_key  # type: ignore[return-value]

    def get_params(self) -> dict[str, np.ndarray]:
        """Current parameters by name (device 0's copy), as numpy arrays."""
        return {name: to_numpy(p.data(self.contexts[0])) for name, p in self.net.collect_params().items()}

    def export_model(self, folder: Any, example: Any, extra: dict[str, str], params: dict[str, Any]) -> None:
        from xp.mx.saved import save

        save(self.net, params, folder, example, extra)

    # --- what the core's loop asks (xp.run.train.train_epoch) --------------------------------------------------
    def batches(self, epoch: int, skip: int) -> Any:
        self.train_iter.set_epoch(epoch)
        for i, batch in enumerate(self.train_iter):
            if i >= skip:  # the skipped batches are read all the same: that keeps the epoch's data order
                yield batch

    def batch_size(self, batch: Any) -> int:
        return batch.data[0].shape[0]

    def read(self, batch: Any) -> None:
        batch.data[0].wait_to_read()

    def train_step(self, batch: Any, lr: float) -> tuple[Any, Any]:
        # the labels are read now: they are input, ready (no wait for the step), and a RecordIO reader reuses
        # their buffer for a later batch before the core reads this step's logits
        return self.step(batch, lr), batch.label[0].asnumpy()

    def fetch(self, outputs: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        logits, labels = outputs
        return np.concatenate([to_numpy(o) for o in logits]), labels

    def sync(self) -> None:
        import mxnet as mx

        mx.nd.waitall()

    def reseed(self, seed: int) -> None:
        import mxnet as mx

        mx.random.seed(seed)

    def evaluate(self) -> dict[str, float]:
        from xp.run.metrics import Scores

        scores = Scores(self.plan.dataset.num_classes)
        if self.val_iter is None:
            raise RuntimeError("a test_io run has no validation data to evaluate")
        self.val_iter.reset()
        for batch in self.val_iter:
            logits = self.predict(batch)
            scores.update(np.concatenate([to_numpy(o) for o in logits]), batch.label[0].asnumpy(), batch.pad)
        return scores.result("val")
