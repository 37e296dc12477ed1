"""A run's outputs beyond its metrics: its trained model as an MLflow model of its run (model.log), and its
parameters in a file (save_params).

A callback of the one loop: with `best` it keeps the network's parameters each time an epoch beats the best
val_accuracy so far (a resumed run's: so far in the whole run), with `last` every epoch's; the run's end writes them once as an MLflow model (through the
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

    def __init__(self, plan: Plan, backend: Any, logged: Callable[[Callable[[Path], None], int, dict], None],
                 before: Any = None):
        self.plan, self.how, self.backend, self.logged = plan, plan.model.log, backend, logged
        self.best: float | None = None
        if before is not None and before.history:
            self._resumed(before)

    def _resumed(self, before: Any) -> None:
        """A resumed run (xp.run.checkpoint.Commit `before`): its model is the whole run's. `last`: the epoch it
        resumes from, its parameters now. `best`: the best epoch before it, from its commit if retention kept it
        (the backend loads it, then the resume point again); later epochs replace it only if they beat it. A run
        killed (SIGKILL) at its end logs its model when resumed, with no epoch left to train."""
        history = before.history
        if self.how == "last":
            return self._keep(before.epoch, history[before.epoch - 1], self.backend.get_params())
        values = [(m.get(OBJECTIVE), n) for n, m in enumerate(history, 1) if m.get(OBJECTIVE) is not None]
        if not values:
            return
        value, epoch = max(values, key=lambda v: v[0])  # the first of equals, as on_epoch_end keeps it
        folder = before.folder.parent / f"epoch-{epoch}"
        if epoch == before.epoch:
            params = self.backend.get_params()
        elif (folder / "meta.json").is_file() and self.plan.workers == 1:  # (a group's ranks load together)
            self.backend.load_state(folder)
            params = self.backend.get_params()
            self.backend.load_state(before.folder)
        else:
            log.warning(f"model.log=best: the best epoch before the resume ({epoch}, {OBJECTIVE} {value:.4f}) has "
                        f"no commit left in {before.folder.parent} (checkpoint.keep_best=1 keeps it) or is a "
                        "group's: the run's model is the best epoch from the resume on")
            return
        self.best = value
        self._keep(epoch, history[epoch - 1], params)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        value = metrics.get(OBJECTIVE)
        if self.how == "best" and (value is None or self.best is not None and value <= self.best):
            return
        self.best = value if value is not None else self.best
        self._keep(epoch, metrics, self.backend.get_params())  # (a copy, as the epoch left them)

    def _keep(self, epoch: int, metrics: dict[str, float], params: dict[str, Any]) -> None:
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


def model_output(plan: Plan, backend: Any, tracker: Any, before: Any = None) -> list[Callback]:
    """The callback for this run (`before`: the commit a resumed run goes on from): none with model.log=none, on
    ranks other than 0, without a tracked run, or with a backend that exports no model (Backend.export_model)."""
    from xp.run.backend import Backend

    if plan.model.log == "none" or plan.rank != 0 or not tracker.run_id or plan.test_io \
            or type(backend).export_model is Backend.export_model:
        return []
    return [ModelOutput(plan, backend, tracker.log_model, before)]


def example_input(plan: Plan, n: int = 2) -> np.ndarray:
    """A few inputs as the backend is fed them: the data set's first validation images where they are in memory,
    else zeros of its shape."""
    d = plan.dataset
    if d.name == "digits":
        from xp.data.datasets import load_arrays

        return np.ascontiguousarray(load_arrays(d)[2][:n], dtype=np.float32)
    return np.zeros((n, *d.image_shape), np.float32)


def _plugin_description(plan: Plan) -> dict[str, Any]:
    """A registered data set's: its class names, its transform's import path, xp's normalisation."""
    from xp.data import plugins
    from xp.run.entry_points import Registry

    d = plan.dataset
    data = plugins.load(d.name, d.options, Registry().load(plan.backend))
    out: dict[str, Any] = {"dataset": d.name, "image_shape": list(d.image_shape),
                           "classes": list(data.class_names) or [str(i) for i in range(d.num_classes)]}
    if data.transform is not None:
        out["transform"] = f"{data.transform.__module__}:{data.transform.__qualname__}"
    if d.options.get("mean") is not None:
        out["pixels"] = {"mean": list(d.options["mean"]), "std": list(d.options["std"])}
    return out


def input_description(plan: Plan) -> dict[str, Any]:
    """What a model's input is: the image shape, the classes' names in label order, and how an image file's
    pixels become the input (python -m xp.predict)."""
    d = plan.dataset
    from xp.data import datasets

    if datasets.is_plugin(d):
        return _plugin_description(plan)
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
