"""The epoch loop: framework-agnostic, drives a backend and fires events."""

from __future__ import annotations

from xp.backend import Backend
from xp.callbacks import Callback, fire
from xp.plan import Plan, learning_rate


class StopTraining(Exception):
    """Raised by a callback at an epoch's end: training stops there, cleanly (the epoch counts)."""


def fit(plan: Plan, backend: Backend, callbacks: list[Callback], setup: bool = True,
        start_epoch: int = 0) -> list[dict[str, float]]:
    """Train epochs start_epoch+1 .. plan.epochs; return their metrics (setup=False: already set up)."""
    if setup:
        backend.setup(plan)
    fire(callbacks, "on_train_begin")
    try:
        return _epochs(plan, backend, callbacks, start_epoch)
    finally:
        fire(callbacks, "on_end")


def _epochs(plan: Plan, backend: Backend, callbacks: list[Callback], start_epoch: int) -> list[dict[str, float]]:
    history: list[dict[str, float]] = []
    for epoch in range(start_epoch + 1, plan.epochs + 1):
        fire(callbacks, "on_epoch_begin", epoch)
        metrics = dict(backend.train_epoch(epoch, lambda step, n, e=epoch: fire(callbacks, "on_batch_end", e, step, n)))
        fire(callbacks, "on_train_epoch_end", epoch)
        if not plan.test_io:
            metrics.update(backend.evaluate())
            metrics["lr"] = learning_rate(plan, epoch * plan.steps_per_epoch - 1)
        try:
            fire(callbacks, "on_epoch_end", epoch, metrics)
        except StopTraining:
            history.append(metrics)
            return history
        history.append(metrics)
    fire(callbacks, "on_train_end", history)
    return history
