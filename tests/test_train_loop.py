"""The core's batch loop (xp.run.train.train_epoch) against a real backend (the NumPy one): it never waits on the
step it has just given, yet scores every step exactly once, stops at the batch that diverged, and leaves scores
that match the position an interruption commits."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_config
from numpy_backend import NumpyBackend
from xp.errors import Diverged
from xp.run.metrics import Scores
from xp.run.plan import build_plan
from xp.run.train import LoopState, train_epoch


class Recording(NumpyBackend):
    """Records when each step is given and when its outputs are read."""

    def __init__(self, poison_step: int | None = None):
        self.events: list[tuple[str, int]] = []
        self.outputs: list[tuple[np.ndarray, np.ndarray]] = []
        self.poison_step = poison_step

    def train_step(self, batch, lr):
        logits, labels = super().train_step(batch, lr)
        step = len(self.outputs)
        if step == self.poison_step:
            logits = np.full_like(logits, np.nan)
        self.outputs.append((logits.copy(), labels.copy()))
        self.events.append(("step", step))
        return step

    def fetch(self, step):
        self.events.append(("fetch", step))
        return self.outputs[step]


def _backend(**kwargs) -> Recording:
    plan = build_plan(compose_config("epochs=1", "lr_schedule=constant"), visible_gpus=0)
    backend = Recording(**kwargs)
    backend.setup(plan)
    return backend


def test_a_step_is_read_after_the_next_is_given_and_every_step_is_scored_once():
    backend = _backend()
    metrics = train_epoch(backend.plan, backend, 1, lambda i, n: None)
    steps = backend.plan.steps_per_epoch
    order = backend.events
    assert sorted(s for kind, s in order if kind == "fetch") == list(range(steps))
    for s in range(steps - 1):  # not read before the next step was given: the engine is never left idle
        assert order.index(("fetch", s)) > order.index(("step", s + 1))
    expected = Scores(backend.plan.dataset.num_classes)
    for logits, labels in backend.outputs:
        expected.update(logits, labels)  # one batch at a time: the sums the loop's batched scoring must equal
    assert metrics == expected.result("train")
    assert metrics["train_loss"] == expected.loss_sum / expected.n  # exactly, not approximately


def test_divergence_names_the_batch_that_diverged_though_it_is_read_later():
    backend = _backend(poison_step=5)
    with pytest.raises(Diverged, match=r"at epoch 1, batch 6 \(lr"):
        train_epoch(backend.plan, backend, 1, lambda i, n: None)
    assert len(backend.outputs) < backend.plan.steps_per_epoch  # stopped within the epoch, not at its end


def test_an_interruption_leaves_scores_for_exactly_the_steps_its_position_counts():
    backend = _backend()

    def interrupt(i: int, n: int) -> None:
        if i == 7:
            raise KeyboardInterrupt

    state = LoopState()
    with pytest.raises(KeyboardInterrupt):
        train_epoch(backend.plan, backend, 1, interrupt, state)
    assert state.position == (1, 8)
    assert state.scores.n == 8 * backend.plan.global_batch  # the in-flight step was read before leaving
    partial = state.partial()
    assert partial["step"] == 8 and partial["scores"]["n"] == state.scores.n
