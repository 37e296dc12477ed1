"""The Python-function model of an MXNet network, as MLflow's "models from code" (MLflow keeps this file in the
model and runs it to load it; nothing is pickled): it needs mlflow, mxnet and numpy, not xp. The network's
loading is the model's copy of xp/mx/inference.py (its code path, importable as INFERENCE)."""

import importlib

import mlflow
from mlflow.pyfunc import PythonModel

INFERENCE = "xp_mx_inference"  # the name the model's copy of xp/mx/inference.py has (xp.mx.export)


class Network(PythonModel):
    """The exported network on the CPU, in inference mode: float32 images (N, C, H, W, normalised) in, the classes'
    scores (N, classes) out."""

    _skip_type_hint_validation = True  # MLflow's checks of predict's type hints: its signature is the model's

    def load_context(self, context):  # (no type hints: MLflow would read a signature from them)
        self.inference = importlib.import_module(INFERENCE)
        self.net = self.inference.load(context.artifacts["symbol"], context.artifacts["params"])

    def predict(self, context, model_input, params=None):
        return self.inference.predict(self.net, model_input)


mlflow.models.set_model(Network())
