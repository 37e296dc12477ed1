"""A whole xp backend in pure NumPy, as a third-party plugin would write it: the example of the README's
"Adding a backend" and a member of the conformance suite (tests/test_backends.py).

A two-layer perceptron (flattened image -> 64 ReLU -> classes) trained with SGD, momentum and weight decay
on the in-memory data sets (digits). The core runs the loop (learning rate per step, resume position,
divergence stop, timing, test_io); this module says only how to build, step, evaluate and save.
Registered by writing a distribution with an `xp.backends` entry point (see `install`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from xp.data import datasets
from xp.run.backend import Backend
from xp.errors import ConfigError
from xp.run.metrics import Scores

HIDDEN = 64


class NumpyBackend(Backend):
    name = "numpy"
    requires = ("numpy",)

    @classmethod
    def check(cls, plan: Any) -> None:
        if plan.dataset.name != "digits" or plan.device_type != "cpu" or len(plan.devices) > 1 or plan.workers > 1:
            raise ConfigError("backend=numpy: one CPU device, one process, dataset=digits")

    def setup(self, plan: Any) -> None:
        self.plan = plan
        self.x, self.y, self.val_x, self.val_y = datasets.load_arrays(plan.dataset)
        rng = np.random.RandomState(plan.seed)
        inputs = int(np.prod(plan.dataset.image_shape))
        self.params = {"w1": rng.randn(inputs, HIDDEN) * np.sqrt(2 / inputs), "b1": np.zeros(HIDDEN),
                       "w2": rng.randn(HIDDEN, plan.dataset.num_classes) * np.sqrt(2 / HIDDEN),
                       "b2": np.zeros(plan.dataset.num_classes)}
        self.velocity = {k: np.zeros_like(v) for k, v in self.params.items()}
        if plan.resume:
            from xp.run.checkpoint import require

            self.load_state(require(plan.resume).folder)

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.maximum(0, x.reshape(len(x), -1) @ self.params["w1"] + self.params["b1"])
        return hidden, hidden @ self.params["w2"] + self.params["b2"]

    # --- the core's loop asks for these -------------------------------------------------------------------
    def batches(self, epoch: int, skip: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = datasets.epoch_order(len(self.x), self.plan.seed, epoch, True)
        for step in range(skip, self.plan.steps_per_epoch):
            idx = order[datasets.worker_slice(step, self.plan.global_batch, 0, 1)]
            yield self.x[idx], self.y[idx]

    def batch_size(self, batch: Any) -> int:
        return len(batch[0])

    def train_step(self, batch: Any, lr: float) -> tuple[np.ndarray, np.ndarray]:
        x, y = batch
        hidden, logits = self._forward(x)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        grad_logits = p / p.sum(axis=1, keepdims=True)
        grad_logits[np.arange(len(y)), y] -= 1
        grad_logits /= len(y)
        grad_hidden = (grad_logits @ self.params["w2"].T) * (hidden > 0)
        grads = {"w2": hidden.T @ grad_logits, "b2": grad_logits.sum(0),
                 "w1": x.reshape(len(x), -1).T @ grad_hidden, "b1": grad_hidden.sum(0)}
        for k, g in grads.items():
            decay = self.plan.wd * self.params[k] if k.startswith("w") else 0.0  # no decay on biases
            self.velocity[k] = self.plan.momentum * self.velocity[k] - lr * (g + decay)
            self.params[k] += self.velocity[k]
        return logits, y

    def evaluate(self) -> dict[str, float]:
        scores = Scores(self.plan.dataset.num_classes)
        scores.update(self._forward(self.val_x)[1], self.val_y)
        return scores.result("val")

    # --- state in and out ---------------------------------------------------------------------------------
    def get_params(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.params.items()}

    def save_state(self, folder: Path) -> None:
        np.savez(folder / "state.npz", **self.params, **{f"velocity.{k}": v for k, v in self.velocity.items()})

    def load_state(self, folder: Path) -> None:
        state = np.load(folder / "state.npz")
        self.params = {k: state[k] for k in self.params}
        self.velocity = {k: state[f"velocity.{k}"] for k in self.params}


def install(root: Path) -> Path:
    """Write this module as an installed distribution with its entry point under `root` (put it on sys.path)."""
    from plugin_fixtures import as_package

    return as_package(root, Path(__file__), "xp_numpy_backend", "xp.backends",
                      "numpy = xp_numpy_backend:NumpyBackend\n")
