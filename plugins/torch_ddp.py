"""PyTorch backend: torchvision models trained with DistributedDataParallel, one process per device.

`python -m xp backend=torch` trains in this process on one device; with several (gpus=N,
cpu_devices=N or workers=N) xp launches the processes with torchrun (xp.launching) and they
allreduce gradients over gloo (CPU) or NCCL (GPU). Precision: dtype=float16/bfloat16/amp
through autocast (float16 with a gradient scaler), channels-last and torch.compile on request.
Arithmetic as in the MXNet backends: the same initial LeNet (He-normal), SGD with momentum,
no weight decay on biases, gradients averaged over the global batch, the same data order.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import replace
from typing import Any

import numpy as np

from xp.run.backend import Backend
from xp.errors import ConfigError, XPError
from xp.models import own, zoo_name
from xp.run.metrics import Scores
from xp.pt.optim import autocast, autocast_dtype, decay_groups, sgd
from xp.run.plan import Plan

log = logging.getLogger("xp")


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class TorchBackend(Backend):
    name = "torch"
    requires = ("torch", "torchvision", "numpy")
    framework = "torch"
    decodes_on_gpu = True  # dataset.decode=gpu: nvJPEG through torchvision (xp.pt.data.GpuDecoder)

    @classmethod
    def dataset_type(cls) -> tuple[type, str]:
        from torch.utils.data import Dataset

        return Dataset, "a torch Dataset (torch.utils.data.Dataset)"

    @classmethod
    def probe(cls, plan: Plan) -> Any:
        from xp.pt.check import Probe

        return Probe(plan)

    @classmethod
    def processes(cls, plan: Plan) -> int:
        return len(plan.devices) * plan.workers

    @classmethod
    def warm(cls) -> None:
        """One small training step, so the first trial of a study's worker does not pay what torch brings up at the
        first step (the optimizer imports torch._dynamo: 0.5-2.4 s), nor, on a slot of one GPU, the CUDA context,
        cuBLAS and cuDNN. With several GPUs a slot's trials train in torchrun's processes: no context here."""
        import torch

        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and torch.cuda.device_count() == 1 else [])
        for device in devices:
            net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                      torch.nn.Linear(144, 2)).to(device)
            opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
            loss = torch.nn.functional.cross_entropy(net(torch.randn(2, 1, 8, 8, device=device)),
                                                     torch.zeros(2, dtype=torch.long, device=device))
            loss.backward()
            opt.step()
        if len(devices) > 1:
            torch.cuda.synchronize()

    @classmethod
    def engine_for(cls, plan: Plan) -> Any:
        if cls.processes(plan) == 1:
            return None
        from xp.pt.torchrun import Torchrun

        return Torchrun

    @classmethod
    def resolve_pretrained(cls, request: Any, model: Any) -> Any:
        from xp.pt.pretrained import resolve  # torchvision's weights files, in PyTorch's cache

        return resolve(request)

    @classmethod
    def check(cls, plan: Plan) -> None:
        try:
            import torch  # noqa: F401 (installed?)
        except ImportError as e:
            raise ConfigError(f"backend=torch: PyTorch is not installed ({e}); ./dev.sh setup installs it") from None
        if plan.kvstore.startswith("dist_") or plan.kvstore == "nccl":
            raise ConfigError(f"kvstore={plan.kvstore}: backend=torch allreduces gradients with DDP (NCCL on GPUs, "
                              "gloo on CPUs) itself; leave kvstore at its default")
        if plan.elastic.enabled and plan.launch.launcher == "local":
            raise ConfigError("elastic.enabled=true: backend=torch is elastic across hosts (torchrun's elastic agent, "
                              "one per host): launcher=ssh with elastic.discovery=HOSTS (on this machine: an MXNet "
                              "backend with kvstore=dist_sync)")
        if plan.elastic.enabled and not plan.checkpoint_dir:
            raise ConfigError("elastic.enabled=true: backend=torch needs checkpoint_dir= on storage every host sees "
                              "(each restart of the workers resumes from its last commit)")
        if plan.device_type == "gpu" and plan.workers > 1 and plan.launch.launcher == "local":
            raise ConfigError(f"workers={plan.workers}: backend=torch runs one process per GPU on this machine; "
                              f"use gpus={len(plan.devices) * plan.workers} (NCCL cannot share a GPU between ranks)")
        if plan.optimizer == "nag" and plan.momentum == 0:
            raise ConfigError("optimizer=nag: Nesterov momentum needs momentum > 0")
        if (mode := plan.backend_options.get("compile", False)) not in (True, False, *COMPILE_MODES):
            raise ConfigError(f"backend.compile={mode}: true, false or a torch.compile mode "
                              f"({', '.join(COMPILE_MODES)})")
        if plan.pretrained is not None and plan.pretrained.described is None and zoo_name(plan.model, "torch") is None:
            raise ConfigError(f"pretrained={plan.pretrained.name}: model={plan.model.name} is no torchvision "
                              "network; torchvision weights fit torchvision models (model=resnet50, ...)")
        if plan.dataset.options.get("kind") == "rec":
            from xp.data.recordio import check_records

            for part in ("train", "val"):
                rec = plan.dataset.options[f"{part}_rec"]
                check_records(rec, rec[:-4] + ".idx", plan.dataset.num_classes, limit=8)
        from xp.pt.models import build_model, probe

        net = build_model(plan.model, plan.dataset.num_classes, plan.dataset.image_shape)  # a bad name fails now
        if not own(plan.model):  # a package's network: its output and input checked on one batch of zeros
            probe(net, plan.model, plan.dataset.num_classes, plan.dataset.image_shape)

    @classmethod
    def check_devices(cls, plan: Plan) -> None:
        import torch

        if plan.device_type == "gpu" and torch.cuda.device_count() < len(plan.devices):
            raise ConfigError(f"gpus={len(plan.devices)}: the installed torch {torch.__version__} sees "
                              f"{torch.cuda.device_count()} GPUs")

    @classmethod
    def in_group(cls, plan: Plan) -> Plan:
        """Elastic (torchrun's agent): the group this rendezvous formed, WORLD_SIZE processes, trains the same
        global batch (per-process batch recomputed) from the last commit, if there is one."""
        if not plan.elastic.enabled or "WORLD_SIZE" not in os.environ:
            return plan
        from xp.run.checkpoint import latest

        world, devices = int(os.environ["WORLD_SIZE"]), len(plan.devices)
        if plan.global_batch % world:
            raise ConfigError(f"elastic: {world} processes cannot share the global batch {plan.global_batch} evenly")
        batch = plan.global_batch // world
        done = latest(plan.checkpoint_dir)
        return replace(plan, workers=world // devices, batch=batch, worker_batch=batch * devices,
                       resume=plan.checkpoint_dir if done is not None else None)

    @classmethod
    def fits(cls, plan: Plan) -> bool:
        """A real training step at plan.batch on the GPU (out of memory caught)."""
        if plan.device_type != "gpu":
            raise ConfigError("batch=auto: backend=torch measures GPU memory only; give batch=N on the CPU")
        import torch

        from xp.pt.models import build_model

        net = build_model(plan.model, plan.dataset.num_classes, plan.dataset.image_shape).cuda()
        try:
            x = torch.zeros(plan.batch, *plan.dataset.image_shape, device="cuda")
            with autocast("cuda", autocast_dtype(plan)):
                net(x).float().sum().backward()
            torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            del net
            torch.cuda.empty_cache()

    # --- setup ------------------------------------------------------------------------------------
    def setup(self, plan: Plan) -> None:
        import torch
        from torch import nn

        from xp.run.worker import report_progress
        from xp.pt.data import make_batches
        from xp.pt.export import load_logged
        from xp.pt.models import build_model, load_pretrained

        self.world, rank, local = 1, 0, 0
        if self.processes(plan) > 1:
            rank, local = self.connect(plan)
        report_progress(rank)
        self.plan = plan = replace(plan, rank=rank)
        if plan.dtype == "float16" and plan.device_type == "cpu" and rank == 0:
            # LeNet on the digits (2 cores): 318 samples/s in float16 against 1,831 in float32
            log.warning("dtype=float16 on the CPU: PyTorch's float16 CPU kernels are slow (about 6x slower than "
                        "float32 here); dtype=bfloat16 is the CPU's fast half precision")
        random.seed(plan.seed)
        np.random.seed(plan.seed)
        torch.manual_seed(plan.seed)
        gpu = plan.device_type == "gpu"
        self.device = torch.device(f"cuda:{local}" if gpu else "cpu")
        from xp.pt.threads import FitThreads

        fit = not gpu and plan.backend_options.get("fit_threads", True)
        self.threads = FitThreads(torch) if fit else None  # the cores other processes leave, from the 1st epoch on
        if gpu:
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True
        self.net = build_model(plan.model, plan.dataset.num_classes, plan.dataset.image_shape)
        groups = [{"params": list(self.net.parameters()), "lr_mult": 1.0}]
        if plan.pretrained is not None and plan.pretrained.described is not None:  # a model xp logged: whole
            load_logged(self.net, plan.pretrained)
        elif plan.pretrained is not None:
            groups = load_pretrained(self.net, plan.pretrained.params, plan.pretrained.freeze_backbone,
                                     plan.pretrained.backbone_lr_mult)
        # random layers (dropout, stochastic depth): the generator is reseeded per step for them (about 80 us)
        self.draws = any("Dropout" in type(m).__name__ or "StochasticDepth" in type(m).__name__
                         for m in self.net.modules())
        self.channels_last = gpu and bool(plan.backend_options.get("channels_last", True))
        self.net.to(self.device, memory_format=torch.channels_last if self.channels_last else torch.preserve_format)
        self.amp_dtype = autocast_dtype(plan)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.optimizer = sgd(decay_groups(self.net, groups, plan.wd), plan, fused=not self.scaler.is_enabled())
        self.model: nn.Module = self.net
        if self.world > 1:
            import warnings

            # 1-channel 3x3 kernels have two valid stride layouts; oneDNN's differs from DDP's bucket (harmless)
            warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
            self.model = nn.parallel.DistributedDataParallel(self.net, device_ids=[local] if gpu else None)
        if mode := plan.backend_options.get("compile", False):  # true, or one of torch.compile's modes
            self.model = torch.compile(self.model, **({"mode": mode} if isinstance(mode, str) else {}))
        self.loss = nn.CrossEntropyLoss()
        self.train_data, self.val_data = make_batches(plan, self.world, rank, pin=gpu, device=self.device)
        if plan.resume:
            from xp.run.checkpoint import require

            self.load_state(require(plan.resume).folder)
        if self.world > 1:
            self.join()

    def connect(self, plan: Plan) -> tuple[int, int]:
        """Join the process group torchrun set up: (global rank, local rank)."""
        import atexit
        import datetime

        import torch.distributed as dist

        if "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
            raise ConfigError(f"backend=torch with {self.processes(plan)} processes: this process was not started by "
                              "torchrun (RANK, MASTER_ADDR unset); run it through python -m xp, which launches them")
        if not dist.is_initialized():  # once per process (diagnose=true sets up several backends)
            timeout = datetime.timedelta(seconds=float(os.environ.get("XP_CONNECT_TIMEOUT_S", 300)))
            dist.init_process_group("nccl" if plan.device_type == "gpu" else "gloo", timeout=timeout)
            atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        self.world = dist.get_world_size()
        if self.world != self.processes(plan) and not plan.elastic.enabled:  # elastic: the rendezvous decides
            raise ConfigError(f"workers={plan.workers} x {len(plan.devices)} devices: torchrun started "
                              f"{self.world} processes")
        return dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))

    def join(self) -> None:
        """DDP broadcast rank 0's weights when it wrapped the model; check every process holds them."""
        sums = self.gather(float(sum(v.astype(np.float64).sum() for v in self.get_params().values())))
        if len(set(sums)) > 1:
            raise XPError(f"processes start from different weights (parameter sums {sums})")

    def gather(self, value: float) -> list[float]:
        if self.world == 1:
            return [value]
        import torch
        import torch.distributed as dist

        mine = torch.tensor([value], dtype=torch.float64, device=self.device)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(out, mine)
        return [float(t.item()) for t in out]

    def get_params(self) -> dict[str, np.ndarray]:
        import torch

        # a copy: on a CPU float32 tensor .float().cpu().numpy() is a view of the live weights, which later steps
        # overwrite (the best epoch's model would be the last's)
        return {n: v.detach().to("cpu", torch.float32, copy=True).numpy() for n, v in self.net.state_dict().items()
                if not n.endswith("num_batches_tracked")}

    def export_model(self, folder: Any, example: Any, extra: dict[str, str], params: dict[str, Any]) -> None:
        from xp.pt.export import save

        save(self.net, params, folder, example, extra)

    def save_state(self, folder: Any) -> None:
        import torch

        torch.save({"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict()}, folder / "state.pt")

    def load_state(self, folder: Any) -> None:
        import torch

        state = torch.load(folder / "state.pt", map_location=self.device, weights_only=True)
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # (the commit's momentum came with it: this run's goes on)
            group["momentum"] = self.plan.momentum
        self.scaler.load_state_dict(state["scaler"])

    # --- training -----------------------------------------------------------------------------------
    def _input(self, x: Any) -> Any:
        if self.device.type == "cpu":
            return x  # the batches are there already
        import torch

        x = x.to(self.device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def batches(self, epoch: int, skip: int) -> Any:
        if self.threads is not None:
            self.threads.fit()
        self.model.train()
        return self.train_data.epoch(epoch, skip)

    @property
    def input_path(self) -> str:
        return getattr(self.train_data, "decode", None) or super().input_path  # RecordIO: CPU workers or GPU

    def batch_size(self, batch: Any) -> int:
        return len(batch[0])

    def read(self, batch: Any) -> None:
        if batch[0].is_cuda:  # decoded on the GPU (dataset.decode=gpu): wait for it
            import torch

            torch.cuda.synchronize(batch[0].device)

    def train_step(self, batch: Any, lr: float) -> tuple[Any, Any]:
        x, y = batch
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g["lr_mult"]
        x, y_dev = self._input(x), y if self.device.type == "cpu" else y.to(self.device, non_blocking=True)
        if self.amp_dtype is None:
            loss = self.loss(logits := self.model(x), y_dev)
        else:
            with autocast(self.device.type, self.amp_dtype):
                logits = self.model(x)
                loss = self.loss(logits.float(), y_dev)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled():
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return logits.detach(), y

    def fetch(self, outputs: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        logits, y = outputs
        return logits.float().cpu().numpy(), y.numpy()  # .cpu() waits for the step's forward pass

    def sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def reseed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def evaluate(self) -> dict[str, float]:
        import torch

        scores = Scores(self.plan.dataset.num_classes)
        self.model.eval()
        with torch.no_grad(), autocast(self.device.type, self.amp_dtype):
            for x, y in self.val_data.epoch(0):
                scores.update(self.model(self._input(x)).float().cpu().numpy(), y.numpy())
        self.model.train()
        return scores.result("val")
