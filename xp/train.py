"""The epoch loop: framework-agnostic, drives a backend and fires events."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from xp.backend import Backend
from xp.callbacks import Callback, fire
from xp.errors import Terminated
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
        with deferred_interrupts() as pending:
            return _epochs(plan, backend, callbacks, start_epoch, pending)
    finally:
        fire(callbacks, "on_end")


@contextmanager
def deferred_interrupts() -> Iterator[list[BaseException]]:
    """SIGTERM (a spot interruption notice) and Ctrl-C wait for the batch being trained to finish, so the
    state at the interruption is one a checkpoint can hold; a second signal interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    pending: list[BaseException] = []

    def handler(signum: int, frame: object) -> None:
        if pending:
            raise pending[0]
        pending.append(KeyboardInterrupt() if signum == signal.SIGINT else Terminated())

    before = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield pending
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _check(pending: list[BaseException]) -> None:
    if pending:
        raise pending[0]


def _epochs(plan: Plan, backend: Backend, callbacks: list[Callback], start_epoch: int,
            pending: list[BaseException]) -> list[dict[str, float]]:
    history: list[dict[str, float]] = []

    def on_batch(epoch: int, step: int, n: int) -> None:
        fire(callbacks, "on_batch_end", epoch, step, n)
        _check(pending)  # a batch boundary: the interruption happens here

    for epoch in range(start_epoch + 1, plan.epochs + 1):
        _check(pending)  # an epoch boundary: the last epoch is complete (and committed)
        fire(callbacks, "on_epoch_begin", epoch)
        metrics = dict(backend.train_epoch(epoch, lambda step, n, e=epoch: on_batch(e, step, n)))
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
