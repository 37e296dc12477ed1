"""The epoch loop: framework-agnostic, drives a backend and fires events. The loop owns where training stands
(LoopState: epoch, position, resume point, scores, history); a backend supplies only what a framework does."""

from __future__ import annotations

import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xp.errors import Diverged, Terminated
from xp.interrupts import Interrupts, held_interrupts
from xp.run.backend import Backend, BatchHook
from xp.run.callbacks import Callback, StopTraining
from xp.run.plan import Plan, learning_rate
from xp.states import TrialState
from xp.studies.trial import TrialPruned

log = logging.getLogger("xp")


@dataclass
class LoopState:
    """Where training stands, as the loop keeps it: a mid-epoch commit holds `partial()`, and a run resumed
    from one sets `resume_at` to it (the loop then skips the batches it covered, with their scores)."""

    epoch: int = 0  # the epoch being trained (1-based; 0 before the first)
    position: tuple[int, int] | None = None  # (epoch, batches of it trained)
    resume_at: dict[str, Any] | None = None  # a mid-epoch commit's position, to go on from
    scores: Any = None  # the running training scores of the epoch (xp.run.metrics.Scores)
    history: list[dict[str, float]] = field(default_factory=list)  # the metrics of the epochs this loop ran

    def begin_epoch(self, epoch: int, num_classes: int) -> int:
        """Fresh scores for `epoch`; returns how many of its batches to skip (those trained before an
        interruption, when the run resumes inside this epoch: their scores are restored too)."""
        from xp.run.metrics import Scores

        self.epoch, self.scores, self.position = epoch, Scores(num_classes), (epoch, 0)
        if self.resume_at is None or self.resume_at["epoch"] != epoch:
            return 0
        skip = self.resume_at["step"]
        self.scores.__dict__.update(self.resume_at["scores"])
        self.resume_at = None
        return skip

    def partial(self) -> dict[str, Any] | None:
        """Where an interrupted epoch stands (JSON-able), for a mid-epoch commit; None: at an epoch boundary."""
        if self.position is None or self.position[1] == 0:
            return None
        return {"epoch": self.position[0], "step": self.position[1], "scores": dict(self.scores.__dict__)}


def fit(plan: Plan, backend: Backend, callbacks: list[Callback], setup: bool = True,
        start_epoch: int = 0, state: LoopState | None = None) -> list[dict[str, float]]:
    """Train epochs start_epoch+1 .. plan.epochs; return their metrics (setup=False: already set up). `state`:
    the caller's, to read where an interrupted run stood or to resume mid-epoch (resume_at)."""
    if setup:
        backend.setup(plan)
    plan = backend.plan  # with this worker's rank (the step seeds draw on it)
    state = state if state is not None else LoopState()
    fire(callbacks, "on_train_begin")
    try:
        with held_interrupts() as held:  # Ctrl-C and SIGTERM wait for the batch being trained to finish, so the
            return _epochs(plan, backend, callbacks, start_epoch, held, state)  # state is one a checkpoint holds
    finally:
        fire(callbacks, "on_end")


# Steps in flight: a step's logits are read back this many steps after it was given. An asynchronous engine
# (MXNet, CUDA) then computes step i while Python prepares step i+1, as in a hand-written loop that never
# reads its outputs; reading each step's logits at once left the engine idle while Python worked.
READ_LAG = 1
SCORE_EVERY = 16  # steps scored in one numpy pass


def train_epoch(plan: Plan, backend: Backend, epoch: int, on_batch: BatchHook,
                state: LoopState | None = None) -> dict[str, float]:
    """One training epoch (1-based), the same for every backend: the learning rate per step, random layers
    reseeded per step, the divergence stop, the resume position, the warm-up timing sync. Returns
    train_loss and train_accuracy once all the epoch's work has finished (so it can be timed). With
    plan.test_io only the input pipeline runs (batches read, decoded, nothing trained; no metrics).
    `state` (the loop's) holds the position and scores as they move."""
    state = state if state is not None else LoopState()
    if plan.test_io:
        for i, batch in enumerate(backend.batches(epoch, 0)):
            if i == plan.steps_per_epoch:
                break
            backend.read(batch)
            on_batch(i, backend.batch_size(batch))
        return {}
    skip = state.begin_epoch(epoch, plan.dataset.num_classes)
    scores = state.scores
    first_step = (epoch - 1) * plan.steps_per_epoch
    flight = InFlight(backend, scores, epoch)
    try:  # (an error ends the run: the steps in flight are left unread)
        for i, batch in enumerate(backend.batches(epoch, skip), start=skip):
            if i == plan.steps_per_epoch:  # the plan's epoch, also when it is shorter than the data
                break
            lr = learning_rate(plan, first_step + i)
            if backend.draws:
                # random layers draw from a generator seeded by (seed, rank, step): a run resumed at any batch
                # draws what the uninterrupted run drew (MXNet cannot save a generator's state; reseeding costs
                # about 1 ms in MXNet, so only networks that draw pay it)
                backend.reseed(step_seed(plan.seed, plan.rank, first_step + i))
            flight.add(i, lr, backend.train_step(batch, lr))
            if i == plan.timing_warmup_batches - 1:
                backend.sync()  # throughput is timed from here: the warm-up's backward and update must be done
            state.position = (epoch, i + 1)
            on_batch(i, backend.batch_size(batch))
    except (KeyboardInterrupt, Terminated):
        flight.drain()  # a commit's scores cover every step its position counts
        raise
    flight.drain()
    backend.sync()  # the last parameter update, too
    return scores.result("train")


class InFlight:
    """The steps not scored yet. A step's logits are read back (fetch) READ_LAG steps after it was given, and
    scored (with the divergence stop, naming the batch that diverged) SCORE_EVERY steps at a time: scoring
    each step on its own took about 0.1 ms of a 2 ms LeNet step in a PyTorch run (0.03 ms when timed alone)."""

    def __init__(self, backend: Backend, scores: Any, epoch: int):
        self.backend, self.scores, self.epoch = backend, scores, epoch
        self.given: deque[tuple[int, float, Any]] = deque()  # (step, lr, outputs as train_step returned them)
        self.read: list[tuple[int, float, tuple[Any, Any]]] = []  # (step, lr, numpy logits and labels)

    def add(self, i: int, lr: float, outputs: Any) -> None:
        self.given.append((i, lr, outputs))
        while len(self.given) > READ_LAG:
            self.read_oldest()
        if len(self.read) >= SCORE_EVERY:
            self.score()

    def drain(self) -> None:
        while self.given:
            self.read_oldest()
        self.score()

    def read_oldest(self) -> None:
        i, lr, outputs = self.given.popleft()
        self.read.append((i, lr, self.backend.fetch(outputs)))

    def score(self) -> None:
        read, self.read = self.read, []
        if not read:
            return
        for (i, lr, _), loss_sum in zip(read, self.scores.update_many([r[2] for r in read])):
            if not np.isfinite(loss_sum):
                self.given.clear()
                raise Diverged(f"the training loss became {loss_sum} at epoch {self.epoch}, batch {i + 1} "
                               f"(lr {lr:.4g}); lower lr or add warmup_epochs")


def _epochs(plan: Plan, backend: Backend, callbacks: list[Callback], start_epoch: int,
            held: Interrupts, state: LoopState) -> list[dict[str, float]]:
    history = state.history

    # per batch, only the callbacks that listen (the event costs microseconds of a LeNet step's 1.3 ms)
    listeners = [cb.on_batch_end for cb in callbacks if type(cb).on_batch_end is not Callback.on_batch_end]

    def on_batch(epoch: int, step: int, n: int) -> None:
        for listener in listeners:
            listener(epoch, step, n)
        held.check()  # a batch boundary: the interruption happens here

    for epoch in range(start_epoch + 1, plan.epochs + 1):
        held.check()  # an epoch boundary: the last epoch is complete (and committed)
        fire(callbacks, "on_epoch_begin", epoch)
        metrics = dict(train_epoch(plan, backend, epoch, functools.partial(on_batch, epoch), state))
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


def train_run(plan: Plan, backend: Backend, callbacks: list[Callback], tracker: Any, before: Any,
              trial: Any) -> str:
    """A run's training with its callbacks, from a commit (`before`) when it resumes (its random state comes
    back with a callback: xp.run.checkpoint.Restore); returns the state: COMPLETE, or PRUNED (a trial the
    pruner stopped). Ctrl-C and SIGTERM reach the callbacks (on_interrupt: a commit of where training stands)
    and go on up."""
    loop = LoopState(resume_at=before.meta.get("position") if before else None)  # mid-epoch: go on from there
    state = TrialState.COMPLETE
    try:
        fit(plan, backend, callbacks, setup=False, start_epoch=before.epoch if before else 0, state=loop)
    except (KeyboardInterrupt, Terminated):
        fire(callbacks, "on_interrupt", loop.partial())  # a spot notice, Ctrl-C
        raise
    except TrialPruned as e:
        state = TrialState.PRUNED
        log.info(f"trial {trial.optuna.number}: {e}")
        why = str(e)[:500]  # on the run (the Pareto rule's: which trials): a tag, and its description, shown whole
        tracker.set_tags({"xp.pruned": why, "mlflow.note.content": f"Trial {trial.optuna.number} {why}."})
    except Exception as e:
        log.debug("training failed", exc_info=True)  # into the log file now, while the run is open
        setattr(e, "xp_logged", True)
        if trial:
            tracker.set_tags({"optuna.trial_state": TrialState.FAIL})
        raise
    if trial:
        tracker.set_tags({"optuna.trial_state": state})
    return state


def fire(callbacks: list[Callback], event: str, *args: Any) -> None:
    for cb in callbacks:
        getattr(cb, event)(*args)


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of training step `step` (0-based, over the whole run) on worker `rank`: random layers
    (dropout) draw from it, so a run resumed at any batch draws what the uninterrupted run drew."""
    import zlib

    return zlib.crc32(f"{seed}:{rank}:{step}".encode())
