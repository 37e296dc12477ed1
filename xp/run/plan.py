"""The plan: the validated, typed form of one experiment, derived values included.

Hydra composes a config; `build_plan` checks every value and writes out what
follows from it (devices, per-device / per-worker / global batch, effective
learning rate, steps and samples per epoch, cost rate) exactly once. Nothing
below the entry point sees the raw config.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from dataclasses import replace
from typing import Any, Callable

from xp.data import datasets
from xp.data.datasets import DatasetSpec
from xp.errors import ConfigError
from xp.models import trained_name
from xp.run.pretrained import PretrainedRequest, PretrainedSpec
from xp.readback.registry import fits
from xp.tracking.stores import resolve_uri
from xp.run.settings import (ElasticSettings, LaunchSettings, StudySettings, choice, elastic_settings, flag,
                             flatten, group, integer, is_int, is_number, launch_settings, number, study_settings, text)

# a backend's resolve_pretrained(request, model): pretrained= weights found on disk
PretrainedResolver = Callable[[PretrainedRequest, "ModelSpec"], PretrainedSpec]

IMAGENET_MEAN = (123.68, 116.28, 103.53)  # RGB, 0-255 scale: what GluonCV's ImageNet models were trained on
IMAGENET_STD = (58.395, 57.12, 57.375)

DTYPES = ("float32", "float16", "bfloat16", "amp")
OPTIMIZERS = ("sgd", "nag")
LR_SCHEDULES = ("constant", "step", "cosine")
MAX_DEVICES = 64


@dataclass(frozen=True)
class ModelSpec:
    name: str
    zoo: str  # xp (its own networks), or a zoo the backend knows (MXNet's: gluoncv)
    arch: str  # network name inside that zoo
    dropout: float = 0.0  # xp's lenet: dropout before the classifier
    log: str = "best"  # the trained model logged to the run: best (the best val_accuracy's epoch), last, none
    # the model group's other keys, for the backends' packages (e.g. torchvision: the network's name there)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    gpus: int | None  # GPUs the instance has; None = whatever is visible
    gpu_model: str | None
    vcpus: int | None
    price_per_hour: float  # on-demand USD per instance-hour
    spot_price_per_hour: float | None = None
    pricing: str = "on_demand"  # which of the two prices this run pays

    @property
    def hourly(self) -> float:
        if self.pricing == "spot" and self.spot_price_per_hour is not None:  # the plan requires it with spot
            return self.spot_price_per_hour
        return self.price_per_hour


@dataclass(frozen=True)
class Plan:
    backend: str
    backend_options: dict[str, Any]
    model: ModelSpec
    dataset: DatasetSpec
    pretrained: PretrainedSpec | None
    kvstore: str  # how gradients are aggregated: the kvstore group's name, which the backend checks
    dtype: str
    hardware: HardwareSpec
    # devices and batch
    device_type: str  # cpu | gpu
    devices: tuple[str, ...]  # e.g. ("cpu(0)", "cpu(1)")
    workers: int
    rank: int
    hosts: int  # instances the run occupies (cost); the local launcher puts every role on one
    servers: int  # parameter-server processes, where the backend's engine has servers
    save_params: str | None  # where rank 0 writes the trained parameters
    checkpoint_dir: str | None  # where rank 0 commits the training state
    checkpoint_every: int  # epochs between commits
    checkpoint_keep: tuple[int, int]  # commits kept: the latest N, and the best M by val_accuracy
    resume: str | None  # a checkpoint_dir to continue from
    batch: int  # per device
    worker_batch: int  # batch x devices
    global_batch: int  # worker_batch x workers
    # optimisation
    optimizer: str
    lr: float  # as given, at lr_ref_batch
    lr_ref_batch: int
    effective_lr: float  # after the linear scaling rule
    lr_schedule: str
    lr_steps: tuple[int, ...]
    lr_decay: float
    warmup_epochs: float
    momentum: float
    wd: float
    epochs: int
    steps_per_epoch: int
    samples_per_epoch: int
    seed: int
    # input pipeline, measurement
    data_nthreads: int
    timing_warmup_batches: int
    test_io: bool  # read the data only: measures the input pipeline
    target_accuracy: float | None  # val_accuracy whose first reaching is timed and priced
    auto_batch_memory_mb: float  # CPU memory bound of batch=auto
    diagnose: bool  # measure real / IO-only / synthetic briefly instead of training
    diagnose_steps: int
    telemetry_interval_s: float  # GPU sampling interval
    system_metrics_interval_s: float  # MLflow system metrics interval; 0 = off
    # tracking
    experiment: str
    tracking_uri: str  # the MLflow store, resolved once (a relative SQLite path made absolute)
    run_name: str | None
    launch: LaunchSettings = LaunchSettings()
    elastic: ElasticSettings = ElasticSettings()
    study: StudySettings | None = None  # a trial of an Optuna study
    batch_auto: bool = False  # batch was auto: the largest that fits (batch holds it)
    # the settings as given (flattened: model.name, ...), recorded as the run's parameters; nothing decides on them
    requested: dict[str, Any] = field(default_factory=dict)

    @property
    def cost_per_hour(self) -> float:
        """USD per hour of this run: the instance's price (spot or on-demand) x the hosts it occupies."""
        return self.hardware.hourly * self.hosts

    def describe(self, uri: str) -> str:
        """The plan on the console, as a run starts."""
        d = self.dataset
        lines = [
            f"xp: backend={self.backend} model={self.model.name} dataset={d.name} dtype={self.dtype} "
            f"kvstore={self.kvstore} hardware={self.hardware.name}",
            f"  devices          {', '.join(self.devices)}  ({self.workers} worker{'s' if self.workers > 1 else ''})",
            f"  batch            {self.batch} per device, {self.worker_batch} per worker, {self.global_batch} global",
            f"  learning rate    {self.lr:g} given at batch {self.lr_ref_batch}, {self.effective_lr:g} effective "
            f"(x {self.effective_lr / self.lr * self.lr_ref_batch:g}/{self.lr_ref_batch}"
            + (", the batch one asynchronous update sees" if self.kvstore == "dist_async" else "")
            + f"); schedule {self.lr_schedule}"
            + (f" at epochs {list(self.lr_steps)} x{self.lr_decay:g}" if self.lr_schedule == "step" else "")
            + f"; warm-up {self.warmup_epochs:g} epochs",
            f"  samples/epoch    {self.samples_per_epoch} ({self.steps_per_epoch} steps of {self.global_batch}; "
            f"{d.train_size} training, {d.val_size} validation, {d.num_classes} classes, "
            f"{'x'.join(map(str, d.image_shape))} images)",
            f"  epochs           {self.epochs}, seed {self.seed}",
            f"  tracking         {uri}  experiment={self.experiment}",
        ]
        return "\n".join(lines)

    def derived(self) -> dict[str, Any]:
        """The values the plan computed (as opposed to those the user typed)."""
        return {
            "devices": ",".join(self.devices),
            "num_devices": len(self.devices),
            "workers": self.workers,
            "worker_batch": self.worker_batch,
            "global_batch": self.global_batch,
            "effective_lr": self.effective_lr,
            "steps_per_epoch": self.steps_per_epoch,
            "samples_per_epoch": self.samples_per_epoch,
            "train_size": self.dataset.train_size,
            "val_size": self.dataset.val_size,
            "num_classes": self.dataset.num_classes,
            "image_shape": "x".join(map(str, self.dataset.image_shape)),
            "cost_per_hour": self.cost_per_hour,
            "pricing": self.hardware.pricing,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_plan(cfg: dict[str, Any], *, visible_gpus: int | None, workers: int | None = None, rank: int = 0,
               hosts: int | None = None, pretrained_by: PretrainedResolver | None = None, backend_cls: Any = None) -> Plan:
    """Validate a resolved config (plain dict) and derive the plan, one builder per group of settings.

    visible_gpus: GPUs this process can see (NVML); injected so it can be tested. None: the run's processes go to
    hosts a launcher places them on, whose GPUs are theirs (the launcher, or the hosts themselves, check them).
    hosts: instances the run occupies (its cost), as the launcher counted them from its hosts (launched
    workers learn it from XP_HOSTS); None: one, this machine.
    pretrained_by: the backend's Backend.resolve_pretrained, which finds pretrained= weights on disk (the plan
    never looks up a backend itself: xp.run.backend_plan.plan_and_backend hands it the selected one's).
    """
    backend = group(cfg, "backend")
    kvstore = text({"kvstore": group(cfg, "kvstore")["name"]}, "kvstore") or "local"
    dtype = choice(group(cfg, "dtype")["name"], "dtype", DTYPES)
    model = _model(group(cfg, "model"))
    dataset, pretrained = _data(cfg, model, pretrained_by, backend_cls)
    hardware = _hardware(cfg)
    device_type, devices = _devices(cfg, hardware, visible_gpus)
    workers = integer(cfg, "workers", 1, 4096) if workers is None else workers
    servers = integer(cfg, "servers", 1, 1024)
    launch = launch_settings(cfg)
    elastic = elastic_settings(cfg.get("elastic") or {})
    sizes = _batch(cfg, dataset, len(devices), workers)
    return Plan(
        backend=backend["name"], backend_options={k: v for k, v in backend.items() if k != "name"},
        model=model, dataset=dataset, pretrained=pretrained, kvstore=kvstore, dtype=dtype, hardware=hardware,
        device_type=device_type, devices=devices, workers=workers, rank=rank,
        hosts=hosts or 1, servers=servers, **_state(cfg), **sizes,
        **_optimisation(cfg, sizes), **_measurement(cfg),
        experiment=str(cfg.get("experiment") or "xp"), tracking_uri=resolve_uri(cfg.get("tracking_uri")),
        run_name=cfg.get("run_name"), launch=launch, elastic=elastic, study=study_settings(cfg),
        requested={**flatten(cfg), "model.name": model.name})  # the network that trains (xp.models.trained_name)


MODEL_LOG = ("best", "last", "none")


def _model(m: dict) -> ModelSpec:
    zoo = text({"model.zoo": m.get("zoo")}, "model.zoo") or "xp"  # "xp": the registered; others the backend checks
    arch = str(m.get("arch") or m["name"])
    model = ModelSpec(trained_name(str(m["name"]), zoo, arch, m.get("factory")), zoo, arch,
                      number({"model.dropout": m.get("dropout", 0.0)}, "model.dropout", 0.0, 1.0, hi_open=True),
                      str(m.get("log", "best")).lower(),
                      {k: v for k, v in m.items() if k not in ("name", "zoo", "arch", "dropout", "log")})
    if model.log not in MODEL_LOG:
        raise ConfigError(f"model.log={m.get('log')}: one of {', '.join(MODEL_LOG)} (which epoch's model the run "
                          "logs to MLflow)")
    if model.dropout and model.zoo != "xp":
        raise ConfigError(f"model.dropout={model.dropout:g}: applies to registered networks (model.zoo=xp); "
                          f"model={model.name} comes from {model.zoo}, whose architecture fixes its dropout")
    return model


def _data(cfg: dict, model: ModelSpec, pretrained_by: PretrainedResolver | None, backend_cls: Any
          ) -> tuple[DatasetSpec, PretrainedSpec | None]:
    """The data set (a registered one read in the framework of `backend_cls`, the backend's class) and the
    pretrained weights."""
    dataset_cfg = group(cfg, "dataset")
    dataset = datasets.describe(dataset_cfg["name"], {k: v for k, v in dataset_cfg.items() if k != "name"},
                                backend_cls)
    classes = cfg.get("num_classes")
    if classes is not None and classes != dataset.num_classes:
        raise ConfigError(f"num_classes={classes!r}: dataset={dataset.name} has {dataset.num_classes} classes; "
                          f"leave num_classes unset or give {dataset.num_classes}")
    pretrained = _pretrained(cfg, model, pretrained_by)
    if pretrained is not None and pretrained.described is not None:  # a model xp logged: it fits this data set
        fits(pretrained, dataset.image_shape, dataset.num_classes)
    if pretrained and pretrained.imagenet_input and cfg.get("pretrained_input", "auto") == "auto" \
            and dataset.options.get("kind") in ("folder", "rec"):
        # the input the ImageNet network was trained on: MXNet zoo ResNets normalise raw pixels themselves
        mean, std = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)) if pretrained.raw_pixels else (IMAGENET_MEAN, IMAGENET_STD)
        dataset = replace(dataset, image_shape=(3, 224, 224),
                          options={**dataset.options, "image_shape": (3, 224, 224), "mean": mean, "std": std})
    return dataset, pretrained


def _hardware(cfg: dict) -> HardwareSpec:
    hw_cfg = group(cfg, "hardware")
    hw_gpus = hw_cfg.get("gpus")
    if hw_gpus is not None and (not is_int(hw_gpus) or hw_gpus < 0):
        raise ConfigError(f"hardware.gpus={hw_gpus!r}: must be an integer >= 0, or null to count visible GPUs")
    price = hw_cfg.get("price_per_hour", 0.0)
    if not is_number(price) or price < 0:
        raise ConfigError(f"hardware.price_per_hour={price!r}: must be a number >= 0 (USD per hour)")
    pricing = choice(cfg.get("pricing", "on_demand"), "pricing", ("on_demand", "spot"))
    spot = hw_cfg.get("spot_price_per_hour")
    if spot is not None and (not isinstance(spot, (int, float)) or isinstance(spot, bool) or spot < 0):
        raise ConfigError(f"hardware.spot_price_per_hour={spot!r}: must be a number >= 0 (USD per hour)")
    if pricing == "spot" and spot is None:
        raise ConfigError(f"pricing=spot: hardware={hw_cfg['name']} has no spot price (spot prices move hourly); "
                          "set hardware.spot_price_per_hour=USD from your account's spot history")
    return HardwareSpec(hw_cfg["name"], hw_gpus, hw_cfg.get("gpu_model"), hw_cfg.get("vcpus"), float(price),
                        None if spot is None else float(spot), pricing)


def _devices(cfg: dict, hardware: HardwareSpec, visible_gpus: int | None) -> tuple[str, tuple[str, ...]]:
    gpus = integer(cfg, "gpus", 0, MAX_DEVICES)
    if hardware.gpus is not None and gpus > hardware.gpus:
        raise ConfigError(f"gpus={gpus}: hardware={hardware.name} has {hardware.gpus} GPUs; "
                          f"valid: 0 to {hardware.gpus}")
    if visible_gpus is not None and gpus > visible_gpus:
        raise ConfigError(f"gpus={gpus}: {gpus} GPU{'s' if gpus > 1 else ''} asked for, {visible_gpus} visible on this machine; "
                          f"valid: 0 to {visible_gpus} (gpus=0 trains on the CPU)")
    if gpus:
        return "gpu", tuple(f"gpu({i})" for i in range(gpus))
    return "cpu", tuple(f"cpu({i})" for i in range(integer(cfg, "cpu_devices", 1, MAX_DEVICES)))


def _batch(cfg: dict, dataset: DatasetSpec, devices: int, workers: int) -> dict[str, Any]:
    batch = integer(cfg, "batch", 1, 65536)
    worker_batch = batch * devices
    global_batch = worker_batch * workers
    steps_per_epoch = dataset.train_size // global_batch
    if steps_per_epoch < 1:
        raise ConfigError(f"batch={batch}: the global batch ({global_batch} = {batch} x {devices} devices"
                          f" x {workers} workers) exceeds the {dataset.train_size} training samples of "
                          f"dataset={dataset.name}; valid: batch <= {dataset.train_size // (devices * workers)}")
    return {"batch": batch, "worker_batch": worker_batch, "global_batch": global_batch,
            "steps_per_epoch": steps_per_epoch, "samples_per_epoch": steps_per_epoch * global_batch}


def writable_folder(path: str, key: str) -> None:
    """A folder this process can write in: made now if missing, so a file in its place or a read-only parent is
    one line before the run starts, not an error after its first epoch."""
    import os

    folder = os.path.expanduser(path)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(f"{key}={path}: a file, not a folder; give a folder (it is created if missing)")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot create it ({e.strerror}: {e.filename}); give a folder this user "
                          "can write") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={path}: this user cannot write in it; give another folder")


def _state(cfg: dict) -> dict[str, Any]:
    given = {"keep_last": 2, "keep_best": 0, **(cfg.get("checkpoint") or {})}
    keep = {f"checkpoint.{k}": v for k, v in given.items()}
    return {"save_params": cfg.get("save_params"), "checkpoint_dir": cfg.get("checkpoint_dir"),
            "checkpoint_every": integer(cfg, "checkpoint_every", 1, 10**6) if "checkpoint_every" in cfg else 1,
            "checkpoint_keep": (integer(keep, "checkpoint.keep_last", 1, 10**6), integer(keep, "checkpoint.keep_best",
                                                                                        0, 10**6)),
            "resume": cfg.get("resume")}


def _optimisation(cfg: dict, sizes: dict[str, int]) -> dict[str, Any]:
    lr = number(cfg, "lr", 0.0, 100.0, lo_open=True)
    lr_ref_batch = integer(cfg, "lr_ref_batch", 1)
    epochs = integer(cfg, "epochs", 1, 100_000)
    schedule = choice(cfg.get("lr_schedule"), "lr_schedule", LR_SCHEDULES)
    steps = cfg.get("lr_steps") or []
    if not isinstance(steps, (list, tuple)) or not all(is_int(s) and s >= 1 for s in steps):
        raise ConfigError(f"lr_steps={steps!r}: must be a list of epochs (integers >= 1)")
    # an update sees the global batch (a backend whose updates see less says so: Backend.planned)
    update_batch = sizes["global_batch"]
    return {"optimizer": choice(cfg.get("optimizer"), "optimizer", OPTIMIZERS), "lr": lr,
            "lr_ref_batch": lr_ref_batch, "effective_lr": lr * update_batch / lr_ref_batch, "lr_schedule": schedule,
            "lr_steps": tuple(sorted(steps)), "lr_decay": number(cfg, "lr_decay", 0.0, 1.0, lo_open=True),
            "warmup_epochs": number(cfg, "warmup_epochs", 0.0, float(epochs)),
            "momentum": number(cfg, "momentum", 0.0, 1.0, hi_open=True), "wd": number(cfg, "wd", 0.0, 1.0),
            "epochs": epochs, "seed": integer(cfg, "seed", 0, 2**31 - 1)}


def _measurement(cfg: dict) -> dict[str, Any]:
    if flag(cfg, "diagnose") and flag(cfg, "test_io"):
        raise ConfigError("diagnose=true test_io=true: pick one; diagnose measures the input pipeline alone itself "
                          "(its io figure), beside real and synthetic training")
    return {
        "data_nthreads": integer(cfg, "data_nthreads", 1, 256),
        "timing_warmup_batches": integer(cfg, "timing_warmup_batches", 0, 10_000),
        "test_io": flag(cfg, "test_io"),
        "auto_batch_memory_mb": number(cfg, "auto_batch_memory_mb", 1.0, 10**7),
        "diagnose": flag(cfg, "diagnose"),
        "diagnose_steps": integer(cfg, "diagnose_steps", 3, 100_000),
        "telemetry_interval_s": number(cfg, "telemetry_interval_s", 0.01, 3600.0),
        "system_metrics_interval_s": number(cfg, "system_metrics_interval_s", 0.0, 3600.0),
        "target_accuracy": None if cfg.get("target_accuracy") is None else number(cfg, "target_accuracy", 0.0, 1.0),
    }


def _pretrained(cfg: dict, model: ModelSpec, pretrained_by: PretrainedResolver | None) -> PretrainedSpec | None:
    """The pretrained_* settings, resolved to files by the backend's package (Backend.resolve_pretrained)."""
    value = cfg.get("pretrained")
    if value is None or value == "none":  # none: a study's choice of no weights, beside a path
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"pretrained={value!r}: must be a model-zoo name or a checkpoint prefix")
    choice(cfg.get("pretrained_input", "auto"), "pretrained_input", ("auto", "dataset"))
    layer = cfg.get("pretrained_layer")
    request = PretrainedRequest(value, integer(cfg, "pretrained_epoch", 0, 9999), str(layer) if layer else None,
                                flag(cfg, "freeze_backbone"), number(cfg, "backbone_lr_mult", 0.0, 100.0),
                                resolve_uri(cfg.get("tracking_uri")))
    if pretrained_by is None:
        raise ConfigError(f"pretrained={value}: the backend resolves pretrained weights; plan the run through "
                          "xp.run.backend_plan.plan_and_backend (or hand build_plan its Backend.resolve_pretrained)")
    return pretrained_by(request, model)


def learning_rate(plan: Plan, step: int) -> float:
    """Learning rate at global step `step` (0-based): warm-up, then the schedule.

    Warm-up follows Goyal et al.: a linear ramp to the effective (scaled) lr,
    so large global batches do not diverge in the first epochs.
    """
    spe = plan.steps_per_epoch
    warm_steps = int(round(plan.warmup_epochs * spe))
    if step < warm_steps:
        return plan.effective_lr * (step + 1) / warm_steps
    if plan.lr_schedule == "constant":
        return plan.effective_lr
    if plan.lr_schedule == "step":
        done_epochs = step // spe
        return plan.effective_lr * plan.lr_decay ** sum(1 for e in plan.lr_steps if done_epochs >= e)
    total = plan.epochs * spe
    progress = (step - warm_steps) / max(1, total - warm_steps)
    return plan.effective_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
