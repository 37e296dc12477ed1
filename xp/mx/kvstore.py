"""MXNet's kvstores (the config group `kvstore`): which there are, and what each asks of a plan. The MXNet
backends check a plan against these rules (MXBackend.check) and derive what they change (MXBackend.planned);
the core only carries the kvstore's name."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from xp.errors import ConfigError

if TYPE_CHECKING:
    from xp.run.plan import Plan

KVSTORES = ("local", "device", "nccl", "dist_sync", "dist_device_sync", "dist_async")
ELASTIC = ("dist_sync", "dist_device_sync")  # elastic training relaunches a synchronous parameter-server job


def distributed(kvstore: str) -> bool:
    """The parameter server (ps-lite) aggregates across worker processes."""
    return kvstore.startswith("dist_")


def check(plan: Plan) -> None:
    """The kvstore exists and fits the plan's devices and elastic settings (ConfigError, one line)."""
    if plan.kvstore not in KVSTORES:
        raise ConfigError(f"kvstore={plan.kvstore!r}: not supported; valid: {', '.join(KVSTORES)}")
    if plan.kvstore == "nccl" and plan.device_type != "gpu":
        raise ConfigError("kvstore=nccl: NCCL aggregates gradients between GPUs and gpus=0; "
                          "on the CPU use kvstore=local or kvstore=device")
    if plan.elastic.enabled and plan.kvstore not in ELASTIC:
        raise ConfigError(f"elastic.enabled=true: needs kvstore=dist_sync (or dist_device_sync), not {plan.kvstore}; "
                          "xp relaunches the parameter-server job when the workers change")


def planned(plan: Plan) -> Any:
    """dist_async applies each worker's gradient on its own: an update sees one worker's batch, and the linear
    scaling rule scales the learning rate to it."""
    if plan.kvstore != "dist_async":
        return plan
    return replace(plan, effective_lr=plan.lr * plan.worker_batch / plan.lr_ref_batch)
