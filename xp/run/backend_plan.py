"""Planning a run: a resolved config validated into a typed plan by its backend (`plan_and_backend`), once per
process; a launched process takes the plan its launching process handed down (xp.run.handoff)."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import replace
from typing import Any

from xp.errors import ConfigError
from xp.run import handoff
from xp.run.gpu import visible_gpus
from xp.run.plan import Plan, build_plan
from xp.run.backend import Backend
from xp.run.entry_points import Registry
from xp.run.worker import HOSTS_ENV, WORKER_ENV

log = logging.getLogger("xp")


_planned: dict[str, tuple[Plan, type[Backend]] | None] = {}  # this process's plans by what they were made of


def plan_and_backend(config: dict[str, Any], resolve_auto: bool = False,
                     gpus_here: bool = True) -> tuple[Plan, type[Backend]]:
    """Validate the resolved config into a plan and load its backend; raises ConfigError/PluginError.

    batch=auto is checked as batch=1; with resolve_auto it is replaced by the largest batch that fits.
    A process plans a config once: the preflight's plan is the one its launch decision and its run use. A
    launched process plans nothing: it uses the plan its launching process handed down (xp.run.handoff).
    gpus_here=False: the run's processes go to other hosts (xp.launching.launcher.gpus_here): their GPUs, not
    this machine's, are the ones it may ask for.
    """
    import json

    if os.environ.get(WORKER_ENV) and "handed" not in _planned:
        _planned["handed"] = None
        if (plan := handoff.received()) is not None:  # None: batch=auto, each worker finds its batch
            backend_cls = Registry().load(plan.backend).for_plan(plan)
            plan = backend_cls.in_group(plan)  # torch elastic: the group's size, from the last commit
            backend_cls.check(plan)  # on this host: its frameworks
            backend_cls.check_devices(plan)  # and its devices
            _planned["handed"] = plan, backend_cls
    if (handed := _planned.get("handed")) is not None:
        return handed
    auto = config.get("batch") == "auto"
    gpus = visible_gpus() if gpus_here else None
    hosts = int(os.environ.get(HOSTS_ENV) or 0) or None  # a launched worker: the launcher counted the hosts
    key = json.dumps([config, gpus, hosts], sort_keys=True, default=str)
    if (known := _planned.get(key)) is not None and not (auto and resolve_auto):
        return known
    name = (config.get("backend") or {}).get("name")
    chosen = Registry().load(name) if isinstance(name, str) else None  # (the plan names a missing one)
    planned = functools.partial(build_plan, visible_gpus=gpus, hosts=hosts, backend_cls=chosen,
                                pretrained_by=chosen.resolve_pretrained if chosen else None)
    plan = planned({**config, "batch": 1} if auto else config)
    backend_cls = (chosen or Registry().load(plan.backend)).for_plan(plan)
    _check_decode(plan, backend_cls)
    backend_cls.check(plan)
    if gpus_here:
        backend_cls.check_devices(plan)
    plan = backend_cls.planned(plan)
    if auto and resolve_auto:
        from xp.run.autobatch import largest_fitting

        devices_workers = len(plan.devices) * plan.workers
        limit = min(65536, plan.dataset.train_size // devices_workers)
        batch, tried = largest_fitting(lambda b: backend_cls.fits(planned({**config, "batch": b})), limit)
        log.info(f"batch=auto: {batch} per device (tried {', '.join(map(str, tried))}; "
                 + ("the data set's size bounds it" if batch == limit else
                    "GPU memory" if plan.device_type == "gpu" else
                    f"auto_batch_memory_mb={plan.auto_batch_memory_mb:g}") + ")")
        config["batch"] = batch
        return replace(backend_cls.planned(planned(config)), batch_auto=True), backend_cls
    _planned[key] = plan, backend_cls
    return plan, backend_cls


def _check_decode(plan: Plan, backend_cls: type[Backend]) -> None:
    if plan.dataset.options.get("decode", "cpu") != "gpu":
        return
    if not backend_cls.decodes_on_gpu:
        registry = Registry()
        able = [f"backend={n}" for n in registry.names() if getattr(registry.load(n), "decodes_on_gpu", False)]
        raise ConfigError(f"dataset.decode=gpu: backend={plan.backend} decodes on the CPU (data_nthreads threads); "
                          f"{' and '.join(able) or 'no installed backend'} decode{'s' if len(able) == 1 else ''} on GPUs")
    if plan.device_type != "gpu":
        raise ConfigError("dataset.decode=gpu: needs GPUs (gpus=N); on the CPU the data_nthreads workers decode "
                          "(dataset.decode=cpu)")
