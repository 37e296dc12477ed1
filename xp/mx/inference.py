"""An exported MXNet network loaded and run for predictions, with nothing but mxnet and numpy: the logged MLflow
model carries a copy of this file (xp.mx.export), so that it loads where only its own requirements are installed
(`mlflow models serve`, a Docker image MLflow builds, batch inference), without xp."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np


def load(symbol: str, params: str) -> Any:
    """The saved network on the CPU, in inference mode."""
    import mxnet as mx

    with warnings.catch_warnings():  # "cannot decide type for data": it is float32, as predict feeds it
        warnings.simplefilter("ignore")
        return mx.gluon.SymbolBlock.imports(symbol, ["data"], params, ctx=mx.cpu())


def predict(net: Any, x: Any) -> np.ndarray:
    """The classes' scores (N, classes) of float32 images `x` (N, C, H, W, normalised)."""
    import mxnet as mx

    return net(mx.nd.array(np.asarray(x, dtype=np.float32))).asnumpy()
