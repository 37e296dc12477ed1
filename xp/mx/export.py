"""An MXNet run's network (Gluon, Module API, Horovod) as an MLflow model: MLflow has no MXNet flavor since 2.x,
so it is a Python-function model around the exported network, its symbol and parameters.

`mlflow.pyfunc.load_model(uri).predict(x)` takes float32 images as the run's data set feeds them (N, C, H, W,
normalised) and answers the classes' scores (N, classes), as a PyTorch run's model does.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np

from xp.mx.pretrained import PARAMS, SYMBOL
from xp.tracking.models import quiet


class Network(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined]  # (mlflow.pyfunc's lazy attribute)
    """The exported network on the CPU, in inference mode."""

    _skip_type_hint_validation = True  # MLflow's checks of predict's type hints: its signature is the model's

    def load_context(self, context):  # (no type hints: MLflow would read a signature from them)
        import mxnet as mx

        with warnings.catch_warnings():  # "cannot decide type for data": it is float32, as predict feeds it
            warnings.simplefilter("ignore")
            self.net = mx.gluon.SymbolBlock.imports(context.artifacts["symbol"], ["data"],
                                                    context.artifacts["params"], ctx=mx.cpu())

    def predict(self, context, model_input, params=None):
        import mxnet as mx

        return self.net(mx.nd.array(np.asarray(model_input, dtype=np.float32))).asnumpy()


def save(block: Any, params: dict[str, np.ndarray], folder: Path, example: np.ndarray, extra: dict[str, str]) -> None:
    """Write the network (`block`: its Gluon block, traced from a "data" input to the logits; `params`: its
    parameters by name, in whichever process holds them) as an MLflow model into `folder`, with its signature and
    input example, and `extra` files (name: text)."""
    import mxnet as mx
    from mlflow.models import infer_signature

    symbol = block(mx.sym.var("data"))
    work = folder.with_name(folder.name + ".parts")
    work.mkdir(parents=True, exist_ok=True)
    symbol.save(str(work / SYMBOL))
    aux = set(symbol.list_auxiliary_states())
    mx.nd.save(str(work / PARAMS), {f"{'aux' if n in aux else 'arg'}:{n}": mx.nd.array(v, dtype="float32")
                                    for n, v in params.items() if n in aux or n in symbol.list_arguments()})
    artifacts = {"symbol": str(work / SYMBOL), "params": str(work / PARAMS)}
    with quiet():
        net = Network()
        net.load_context(type("Context", (), {"artifacts": artifacts})())
        mlflow.pyfunc.save_model(str(folder), python_model=Network(), artifacts=artifacts,
                                 signature=infer_signature(example, net.predict(None, example)),
                                 input_example=example, pip_requirements=[f"mxnet=={mx.__version__}", "numpy<1.24"])
    for name, text in extra.items():
        (folder / name).write_text(text)
    for part in work.iterdir():
        part.unlink()
    work.rmdir()
