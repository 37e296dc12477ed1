"""An MXNet run's network (Gluon, Module API, Horovod) as an MLflow model: MLflow has no MXNet flavor since 2.x,
so it is a Python-function model around the exported network, its symbol and parameters, written as MLflow's
"models from code" (xp/mx/pyfunc_model.py, with a copy of xp/mx/inference.py): it loads with its own requirements
(mlflow, mxnet, numpy) alone, without xp.

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


def build(parts: Path, folder: Path) -> None:
    """The MLflow model (a Python-function model around the network) in `folder`, of the parts `save` wrote into
    `parts`."""
    from mlflow.models import infer_signature

    import shutil
    import tempfile

    from xp.mx import inference, pyfunc_model

    about = json.loads((parts / BUILD).read_text())
    example = np.load(parts / EXAMPLE)
    artifacts = {"symbol": str(parts / SYMBOL), "params": str(parts / PARAMS)}
    with tempfile.TemporaryDirectory(prefix="xp-model-") as tmp, quiet():
        code = Path(tmp) / f"{pyfunc_model.INFERENCE}.py"  # (the name the model's code imports it by)
        shutil.copyfile(inference.__file__, code)
        mlflow.pyfunc.save_model(str(folder), python_model=pyfunc_model.__file__, artifacts=artifacts,
                                 code_paths=[str(code)], signature=infer_signature(example, np.load(parts / ANSWER)),
                                 input_example=example, pip_requirements=about["pip"])
    for name in about["extra"]:
        (folder / name).write_bytes((parts / name).read_bytes())
