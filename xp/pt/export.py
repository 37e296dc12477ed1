"""A PyTorch run's network as an MLflow model, through MLflow's PyTorch flavor.

`mlflow.pyfunc.load_model(uri).predict(x)` takes float32 images as the run's data set feeds them (N, C, H, W,
normalised) and answers the classes' scores (N, classes); `mlflow.pytorch.load_model(uri)` gives the module.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from xp.tracking.models import quiet


def save(net: Any, params: dict[str, np.ndarray], folder: Path, example: np.ndarray, extra: dict[str, str]) -> None:
    """Write `net` with `params` (its parameters by name, as numpy arrays) as an MLflow model into `folder` (a
    copy on the CPU in float32, in eval mode), with its signature and input example (`example`: a few inputs), and
    `extra` files (name: text) beside it."""
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    model = copy.deepcopy(net).float().cpu().eval()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}, strict=False)
    with torch.no_grad():
        out = model(torch.from_numpy(example)).numpy()
    # the requirements given: MLflow would otherwise load the model in a new process to find them (seconds)
    with quiet():
        mlflow.pytorch.save_model(model, str(folder), signature=infer_signature(example, out),
                                  input_example=example,
                                  pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy"])
    for name, text in extra.items():
        (folder / name).write_text(text)


def load_logged(net: Any, spec: Any) -> None:
    """Load the parameters of a model xp logged (`spec`: its PretrainedSpec, downloaded) into `net`, which must be
    the same network (one ConfigError line if not)."""
    import mlflow.pytorch

    from xp.errors import ConfigError

    with quiet():
        state = mlflow.pytorch.load_model(spec.params, map_location="cpu").state_dict()
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(f"pretrained={spec.name}: not this run's network ({str(e).splitlines()[0][:160]})") from None
