"""A backend whose training sleeps: every trial of a study lasts a fixed time and uses no CPU, and is still a
complete xp run (its MLflow run with parameters, per-epoch metrics and tags, the study's ask, report, prune
and tell). Made for benchmarks/study_scale.py, which registers it (`install`) as a third party's backend is.

Each epoch sleeps $XP_SLEEP_EPOCH_S (0.25 s) over its steps; its val_accuracy is a smooth function of lr and
momentum that grows with the epochs, so samplers and pruners have something to work on. No framework is
imported, and no data set is loaded.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from xp.run.backend import Backend


class SleepBackend(Backend):
    name = "sleep"

    def setup(self, plan: Any) -> None:
        self.plan = plan
        self.epoch_s = float(os.environ.get("XP_SLEEP_EPOCH_S", "0.25"))
        self.epochs_done = 0
        classes = plan.dataset.num_classes
        self.logits, self.labels = np.zeros((plan.batch, classes), np.float32), np.zeros(plan.batch, np.int64)

    def batches(self, epoch: int, skip: int) -> Iterator[int]:
        self.epochs_done = epoch
        return iter(range(skip, self.plan.steps_per_epoch))

    def batch_size(self, batch: Any) -> int:
        return self.plan.batch

    def train_step(self, batch: Any, lr: float) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(self.epoch_s / self.plan.steps_per_epoch)
        return self.logits, self.labels

    def evaluate(self) -> dict[str, float]:
        value = accuracy(self.plan.lr, self.plan.momentum, self.epochs_done)
        return {"val_accuracy": value, "val_loss": 1.0 - value}

    def get_params(self) -> dict[str, np.ndarray]:
        return {}

    def save_state(self, folder: Path) -> None:
        (folder / "sleep.txt").write_text(str(self.epochs_done))

    def load_state(self, folder: Path) -> None:
        self.epochs_done = int((folder / "sleep.txt").read_text())


def accuracy(lr: float, momentum: float, epoch: int) -> float:
    """The val_accuracy of a trial's epoch (also benchmarks/study_scale.py's bare Optuna objective's)."""
    best = 1.0 - min(1.0, abs(math.log10(lr) + 1.5) / 2) * 0.5 - abs(momentum - 0.9) * 0.2
    return best * (1.0 - 0.5 ** (epoch + 1))


def install(root: Path) -> Path:
    """This module as an installed distribution with its `xp.backends` entry point under `root` (put it on
    PYTHONPATH), written as the tests write their third-party plugins."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from plugin_fixtures import as_package

    return as_package(root, Path(__file__), "xp_sleep_backend", "xp.backends",
                      "sleep = xp_sleep_backend:SleepBackend\n")
