"""The network: one Gluon HybridBlock per model, built in xp or taken from the GluonCV zoo."""

from __future__ import annotations

import warnings
from typing import Any

from xp.errors import XPError
from xp.run.plan import ModelSpec
from xp.run.pretrained import PretrainedSpec
from xp.tracking.models import LOGGED


class WeightsError(XPError):
    """Pretrained weights that do not fit: names the file and the problem."""

    exit_code = 2


def lenet(classes: int, dropout: float = 0.0):
    """LeNet-style CNN sized for small images (8x8 digits up to 32x32)."""
    from mxnet.gluon import nn

    net = nn.HybridSequential(prefix="lenet_")
    with net.name_scope():
        net.add(
            nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(64, kernel_size=3, padding=1, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(),
            nn.Dense(128, activation="relu"),
        )
        if dropout:
            net.add(nn.Dropout(dropout))
        net.add(nn.Dense(classes))
    return net


XP_ZOO = {"lenet": lenet}


def _gluoncv_zoo():
    """gluoncv.model_zoo.get_model. GluonCV 0.10's package import refuses an installed torch >= 2 (its own
    PyTorch models want torch < 2; xp uses only its MXNet zoo): it is imported with torch hidden."""
    import sys

    if "gluoncv" not in sys.modules:
        missing = object()
        torch = sys.modules.get("torch", missing)
        sys.modules["torch"] = None  # `import torch` raises ImportError: GluonCV takes MXNet alone
        try:
            import gluoncv  # noqa: F401
        finally:
            if torch is missing:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = torch
    from gluoncv.model_zoo import get_model

    return get_model


def build_net(model: ModelSpec, classes: int):
    """The network with `classes` outputs (logits), parameters not yet initialised."""
    if model.zoo == "xp":
        if model.arch not in XP_ZOO:
            from xp.errors import ConfigError

            raise ConfigError(f"model.arch={model.arch!r}: not in xp's zoo; valid: {', '.join(sorted(XP_ZOO))}")
        return XP_ZOO[model.arch](classes, model.dropout)
    get_model = _gluoncv_zoo()
    try:
        return get_model(model.arch, classes=classes, pretrained=False)
    except ValueError as e:
        from xp.errors import ConfigError

        raise ConfigError(f"model.arch={model.arch!r}: not in the GluonCV model zoo ({e})") from e


def _backbone_and_head_key(net) -> tuple[Any, str]:
    """A classifier's feature extractor and the parameter-name prefix of its last layer.

    GluonCV's classifiers keep the features in .features and the classifier in .output;
    a plain HybridSequential (xp's LeNet) ends with its classifier.
    """
    if hasattr(net, "features") and hasattr(net, "output"):
        return net.features, "output"
    return net[: len(net) - 1], str(len(net) - 1)


def _with_new_head(backbone, classes: int):
    from mxnet.gluon import nn

    net = nn.HybridSequential(prefix="finetune_")
    net.add(backbone)
    with net.name_scope():
        net.add(nn.Dense(classes))
    return net


def load_pretrained(spec: PretrainedSpec, model: ModelSpec, classes: int, contexts):
    """(network with a new `classes`-way classifier, the pretrained backbone block).

    Zoo weights: the zoo's network is built with the saved classifier's size, the file
    loaded, and the classifier replaced. Checkpoints: the symbol is cut at spec.layer and
    wrapped in a SymbolBlock, so every backend still trains one Gluon block.
    """
    import mxnet as mx
    from mxnet.gluon import nn

    if spec.source == LOGGED:  # a model xp logged, for this data set: the whole network, its classifier too
        with warnings.catch_warnings():  # "cannot decide type for data": it is float32
            warnings.simplefilter("ignore")
            return nn.SymbolBlock.imports(spec.symbol, ["data"], spec.params, ctx=contexts), None
    try:
        saved = mx.nd.load(spec.params)
    except mx.base.MXNetError as e:
        raise WeightsError(f"{spec.params}: not an MXNet .params file") from e
    if spec.source in ("zoo", "commit"):  # an xp commit of backend=gluon: the zoo's format
        probe = build_net(model, 1)
        _, head = _backbone_and_head_key(probe)
        if f"{head}.weight" not in saved:
            raise WeightsError(f"{spec.params}: has no classifier {head}.weight, so it is not {model.arch} weights")
        net = build_net(model, int(saved[f"{head}.weight"].shape[0]))
        try:
            net.load_parameters(spec.params, ctx=contexts)
        except (AssertionError, mx.base.MXNetError) as e:
            raise WeightsError(f"{spec.params}: does not fit {model.arch}: {str(e).splitlines()[0][:200]}") from e
        backbone, _ = _backbone_and_head_key(net)
        return _with_new_head(backbone, classes), backbone
    symbol = mx.sym.load(spec.symbol)
    internals = symbol.get_internals()
    features = internals[f"{spec.layer}_output"]
    backbone = nn.SymbolBlock(features, mx.sym.var("data", dtype="float32"))
    needed = set(features.list_arguments()) - {"data"} | set(features.list_auxiliary_states())
    have = {k.split(":", 1)[-1] for k in saved}
    missing = sorted(needed - have)
    if missing:
        raise WeightsError(f"{spec.params}: does not match {spec.symbol}: no values for {', '.join(missing[:5])}"
                           + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    try:
        backbone.collect_params().load(spec.params, ctx=contexts, allow_missing=False, ignore_extra=True)
    except (AssertionError, mx.base.MXNetError) as e:
        raise WeightsError(f"{spec.params}: does not match {spec.symbol}: {str(e).splitlines()[0][:200]}") from e
    return _with_new_head(backbone, classes), backbone


def initialize(net, contexts, seed: int, image_shape: tuple[int, ...]) -> None:
    """Initialise parameters deterministically (MSRA/He init) on every context.

    Parameters are drawn once on the CPU and copied to each context, so N
    devices start from exactly the weights one device would. One forward pass
    of a dummy sample resolves Gluon's deferred shapes now, so backends can
    read, export or broadcast real parameters before training.
    """
    import mxnet as mx

    import warnings

    mx.random.seed(seed)
    with warnings.catch_warnings():  # pretrained parameters are already initialised: they are kept
        warnings.simplefilter("ignore")
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=contexts)
    net(mx.nd.zeros((1, *image_shape), ctx=contexts[0]))
