"""An MXNet run's network (Gluon, Module API, Horovod) as an MLflow model: MLflow has no MXNet flavor since 2.x,
so it is a Python-function model around the exported network, its symbol and parameters.

`mlflow.pyfunc.load_model(uri).predict(x)` takes float32 images as the run's data set feeds them (N, C, H, W,
normalised) and answers the classes' scores (N, classes), as a PyTorch run's model does.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc
import numpy as np

from xp.mx.saved import ANSWER, EXAMPLE
from xp.mx.pretrained import PARAMS, SYMBOL
from xp.tracking.models import BUILD, quiet


class Network(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined]  # (mlflow.pyfunc's lazy attribute)
    """The exported network on the CPU, in inference mode."""

    _skip_type_hint_validation = True  # MLflow's checks of predict's type hints: its signature is the model's

    def load_context(self, context):  # (no type hints: MLflow would read a signature from them)
        from xp.mx.saved import load

        self.net = load(context.artifacts["symbol"], context.artifacts["params"])

    def predict(self, context, model_input, params=None):
        from xp.mx.saved import predict

        return predict(self.net, model_input)


def build(parts: Path, folder: Path) -> None:
    """The MLflow model (a Python-function model around the network) in `folder`, of the parts `save` wrote into
    `parts`."""
    from mlflow.models import infer_signature

    about = json.loads((parts / BUILD).read_text())
    example = np.load(parts / EXAMPLE)
    artifacts = {"symbol": str(parts / SYMBOL), "params": str(parts / PARAMS)}
    with quiet():
        mlflow.pyfunc.save_model(str(folder), python_model=Network(), artifacts=artifacts,
                                 signature=infer_signature(example, np.load(parts / ANSWER)),
                                 input_example=example, pip_requirements=about["pip"])
    for name in about["extra"]:
        (folder / name).write_bytes((parts / name).read_bytes())
