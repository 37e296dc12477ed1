"""What the MXNet backends (Gluon, Module API, Horovod) share.

models: one network definition (a Gluon HybridBlock); data: iterators on the
mx.io.DataIter contract, sharded by worker rank; metrics: loss and accuracy
computed identically for every backend; base: the batch loop.
Only backend plugins import this package; the core never imports mxnet.
"""

import sys
from importlib.abc import MetaPathFinder

# imported by mxnet's __init__ with a fallback each, for what xp never uses: scikit-learn for the base class of
# FeedForward (MXNet's oldest API), scipy.stats for INT8 entropy calibration and mxnet.test_utils
_SKIPPED = ("sklearn", "scipy.stats")


class _LeanMXNetImport(MetaPathFinder):
    """While mxnet itself is being imported, the imports of _SKIPPED fail, as if those were not installed (mxnet
    provides for that): `import mxnet` 1.8 s -> 1.1 s here, in every MXNet process xp starts (a study's every
    worker). Afterwards they import as usual."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if any(name == skipped or name.startswith(skipped + ".") for skipped in _SKIPPED):
            spec = getattr(sys.modules.get("mxnet"), "__spec__", None)
            if getattr(spec, "_initializing", False):
                raise ModuleNotFoundError(f"{name}: not imported with mxnet (xp.mx)", name=name)
        return None


sys.meta_path.insert(0, _LeanMXNetImport())  # once: this runs at the package's first import
