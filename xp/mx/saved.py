"""An MXNet run's network saved as the parts of its MLflow model (xp.mx.export makes the model of them, where
MLflow is imported), and loaded back for predictions (xp.mx.inference, re-exported here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from xp.mx.inference import load, predict
from xp.mx.pretrained import PARAMS, SYMBOL
from xp.tracking.models import BUILD

EXAMPLE, ANSWER = "example.npy", "answer.npy"  # the parts' input example and the network's answer to it


def save(block: Any, params: dict[str, np.ndarray], folder: Path, example: np.ndarray, extra: dict[str, str]) -> None:
    """Write the network (`block`: its Gluon block, traced from a "data" input to the logits; `params`: its
    parameters by name, in whichever process holds them) into `folder` as the parts of an MLflow model: its
    symbol and parameters, the input example and the network's answer to it, and `extra` files (name: text).
    `build` makes the MLflow model of them, where MLflow is imported (xp.tracking.models.built: the tracking
    service, as it logs the model; a run's process does not import MLflow for it)."""
    import mxnet as mx

    symbol = block(mx.sym.var("data"))
    folder.mkdir(parents=True, exist_ok=True)
    symbol.save(str(folder / SYMBOL))
    aux = set(symbol.list_auxiliary_states())
    mx.nd.save(str(folder / PARAMS), {f"{'aux' if n in aux else 'arg'}:{n}": mx.nd.array(v, dtype="float32")
                                      for n, v in params.items() if n in aux or n in symbol.list_arguments()})
    np.save(folder / EXAMPLE, example)
    np.save(folder / ANSWER, predict(load(str(folder / SYMBOL), str(folder / PARAMS)), example))
    for name, text in extra.items():
        (folder / name).write_text(text)
    (folder / BUILD).write_text(json.dumps({"build": "xp.mx.export:build", "extra": sorted(extra),
                                            "pip": [f"mxnet=={mx.__version__}", "numpy<1.24"]}))


__all__ = ["ANSWER", "EXAMPLE", "load", "predict", "save"]
