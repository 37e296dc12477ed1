"""A population-based study's interval (xp.studies.pbt) records what a member went through: its hyperparameters
at every epoch (metrics hp.KEY, the schedule it followed) and a fingerprint of the weights it starts from and
ends with (tags xp.pbt.weights_in, xp.pbt.weights_out: an interval that took another member's commit starts
from exactly the weights that member ended with)."""

from __future__ import annotations

import hashlib
from typing import Any

from xp.run.callbacks import Callback


def fingerprint(params: dict[str, Any]) -> str:
    """sha256 of the parameters' names, shapes, types and bytes, in name order."""
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(params):
        a = np.ascontiguousarray(params[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class Lineage(Callback):
    """Rank 0 of a PBT member's interval: `hyper` (its trial's parameters) logged at every epoch, the weights'
    fingerprints at its start (after the commit it resumes is loaded) and after its last epoch."""

    def __init__(self, tracker: Any, get_params: Any, hyper: dict[str, Any], last_epoch: int):
        self.tracker, self.get_params, self.last = tracker, get_params, last_epoch
        self.hyper = {f"hp.{k}": float(v) for k, v in hyper.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def on_train_begin(self) -> None:
        self.tracker.set_tags({"xp.pbt.weights_in": fingerprint(self.get_params())})

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.hyper:
            self.tracker.log_metrics(self.hyper, step=epoch)
        if epoch == self.last:
            self.tracker.set_tags({"xp.pbt.weights_out": fingerprint(self.get_params())})
