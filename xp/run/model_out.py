"""A run's outputs beyond its metrics: its trained model as an MLflow model of its run (model.log), and its
parameters in a file (save_params).

A callback of the one loop: with `best` it keeps the network's parameters each time an epoch beats the best
val_accuracy so far, with `last` every epoch's; the run's end writes them once as an MLflow model (through the
backend: Backend.export_model) and logs it as the run's model (xp.tracking.models), with the metrics of the
epoch it came from. Beside the model, `xp_input.json` says what its input is (shape, classes, the data set's
pixel transform): `python -m xp.predict` reads image files with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xp.run.callbacks import Callback
from xp.run.plan import Plan
from xp.tracking.models import INPUT

log = logging.getLogger("xp")

OBJECTIVE = "val_accuracy"  # the metric `best` compares (higher is better)


class ModelOutput(Callback):
    """The run's model (`how`: best, the epoch that beats the best so far; last: every epoch): its parameters are
    kept (Backend.get_params) and handed to the tracker with a writer, which the run's end calls once to write
    the MLflow model (Backend.export_model) and log it: also when a trial is pruned, stopped or fails."""

    def __init__(self, plan: Plan, backend: Any, logged: Callable[[Callable[[Path], None], int, dict], None]):
        self.plan, self.how, self.backend, self.logged = plan, plan.model.log, backend, logged
        self.best: float | None = None

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        value = metrics.get(OBJECTIVE)
        if self.how == "best" and (value is None or self.best is not None and value <= self.best):
            return
        self.best = value if value is not None else self.best
        params = self.backend.get_params()  # (a copy, as the epoch left them)

        def write(folder: Path) -> None:
            self.backend.export_model(folder, example_input(self.plan),
                                      {INPUT: json.dumps(input_description(self.plan))}, params)

        self.logged(write, epoch, dict(metrics))


class SaveParams(Callback):
    """save_params=FILE: the trained parameters (rank 0's) into a numpy .npz file when training ends."""

    def __init__(self, path: str, params: Callable[[], dict[str, Any]]):
        self.path, self.params = path, params

    def on_train_end(self, history: list[dict[str, float]]) -> None:
        np.savez(self.path, **self.params())


def model_output(plan: Plan, backend: Any, tracker: Any) -> list[Callback]:
    """The callback for this run: none with model.log=none, on ranks other than 0, without a tracked run, or with a
    backend that exports no model (Backend.export_model)."""
    from xp.run.backend import Backend

    if plan.model.log == "none" or plan.rank != 0 or not tracker.run_id or plan.test_io \
            or type(backend).export_model is Backend.export_model:
        return []
    return [ModelOutput(plan, backend, tracker.log_model)]


def example_input(plan: Plan, n: int = 2) -> np.ndarray:
    """A few inputs as the backend is fed them: the data set's first validation images where they are in memory,
    else zeros of its shape."""
    d = plan.dataset
    if d.name == "digits":
        from xp.data.datasets import load_arrays

        return np.ascontiguousarray(load_arrays(d)[2][:n], dtype=np.float32)
    return np.zeros((n, *d.image_shape), np.float32)


def input_description(plan: Plan) -> dict[str, Any]:
    """What a model's input is: the image shape, the classes' names in label order, and how an image file's
    pixels become the input (python -m xp.predict)."""
    d = plan.dataset
    if d.listing is not None:
        names = list(d.listing.classes)
    elif d.name == "digits" and d.options.get("classes"):
        names = [str(c) for c in sorted(d.options["classes"])]
    else:
        names = [str(i) for i in range(d.num_classes)]
    out: dict[str, Any] = {"dataset": d.name, "image_shape": list(d.image_shape), "classes": names}
    if d.name == "digits":
        from xp.data.datasets import digits_standardisation

        mean, std = digits_standardisation(d)
        out["pixels"] = {"scale": 16.0 / 255.0, "mean": [mean], "std": [std]}  # the 8x8 digits are 0..16
    elif "mean" in d.options:
        c = d.image_shape[0]
        out["pixels"] = {"scale": 1.0, "mean": list(d.options["mean"])[:c], "std": list(d.options["std"])[:c],
                         "resize": int(d.options.get("resize") or 0)}
    return out
