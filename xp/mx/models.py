"""The network: one Gluon HybridBlock per model, built in xp or taken from the GluonCV zoo."""

from __future__ import annotations

import warnings
from typing import Any

from xp.errors import XPError
from xp.run.plan import ModelSpec
from xp.run.pretrained import PretrainedSpec
from xp.readback.registry import LOGGED


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


def gluoncv_net(arch: str, classes: int):
    """GluonCV's network `arch` with `classes` outputs, no weights."""
    from xp.errors import ConfigError

    try:
        return _gluoncv_zoo()(arch, classes=classes, pretrained=False)
    except ValueError as e:
        raise ConfigError(f"model.arch={arch!r}: not in the GluonCV model zoo ({e})") from e


def build_net(model: ModelSpec, classes: int, image_shape: tuple[int, int, int], backend: str = "gluon"):
    """The network with `classes` outputs (logits), parameters not yet initialised: GluonCV's architecture
    (model.zoo=gluoncv) or the registered network's MXNet factory (xp.models)."""
    from mxnet.gluon import HybridBlock

    from xp import models

    if model.zoo == "gluoncv":
        return gluoncv_net(model.arch, classes)
    net = models.offered(model, "mxnet", backend)
    return models.built(models.call(net, models.task(model, "mxnet", classes, image_shape), model), HybridBlock,
                        "a Gluon HybridBlock (mxnet.gluon.HybridBlock)", model, "mxnet", backend)


def probe(net, model: ModelSpec, classes: int, image_shape: tuple[int, int, int]) -> None:
    """One batch of 2 zero images through a fresh copy's symbol (shapes inferred, nothing initialised): it must
    take the input and give (2, classes)."""
    import mxnet as mx

    from xp.errors import ConfigError
    from xp.models import where_it_failed

    try:
        _, out, _ = net(mx.sym.var("data")).infer_shape(data=(2, *image_shape))
    except Exception as e:
        raise ConfigError(f"model={model.name}: refuses the data set's input (2, {', '.join(map(str, image_shape))}): "
                          f"{where_it_failed(e).splitlines()[0][:300]}") from None
    if len(out) != 1 or tuple(out[0]) != (2, classes):
        got = tuple(out[0]) if len(out) == 1 else f"{len(out)} outputs"
        raise ConfigError(f"model={model.name}: gives {got} for 2 images; the data set has {classes} classes, so "
                          f"(2, {classes}) was expected")


ZOOS = ("xp", "gluoncv")  # where networks come from: the registered (xp.models), or GluonCV's model zoo


def check_network(plan) -> None:
    """The model config names a network the MXNet backends can build: from one of their zoos; a registered one
    offered for MXNet, checked on 2 images (output, input) when it is a package's."""
    from xp import models
    from xp.errors import ConfigError

    model = plan.model
    if model.zoo not in ZOOS:
        other = " (it is backend=torch's)" if model.zoo in ("torchvision", "timm") else ""
        raise ConfigError(f"model.zoo={model.zoo!r}: not one of backend={plan.backend}'s; valid: {', '.join(ZOOS)}"
                          + other)
    if model.zoo == "xp":
        models.offered(model, "mxnet", plan.backend)  # no such name, or offered for torch only: now
        if not models.own(model):
            probe(build_net(model, plan.dataset.num_classes, plan.dataset.image_shape, plan.backend), model,
                  plan.dataset.num_classes, plan.dataset.image_shape)


def fits(plan) -> bool:
    """One device's training step at plan.batch: a real step on a GPU (out of memory caught);
    on the CPU, the memory MXNet's executor plans for forward and backward, plus weights,
    gradients and momentum, against plan.auto_batch_memory_mb."""
    import mxnet as mx

    net = build_net(plan.model, plan.dataset.num_classes, plan.dataset.image_shape, plan.backend)
    symbol = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    shape = (plan.batch, *plan.dataset.image_shape)
    ctx = mx.gpu(0) if plan.device_type == "gpu" else mx.cpu()
    try:
        exe = symbol.simple_bind(ctx, grad_req="write", data=shape)
        if plan.device_type == "gpu":
            exe.arg_dict["data"][:] = 1
            exe.forward(is_train=True)
            exe.backward()
            mx.nd.waitall()
            return True
    except mx.base.MXNetError as e:
        if "out of memory" in str(e).lower():
            return False
        raise
    finally:
        mx.nd.waitall()
    planned = next(int(line.split()[1]) for line in exe.debug_str().splitlines()
                   if line.startswith("Total") and "MB allocated" in line)
    weights = sum(a.size for n, a in exe.arg_dict.items() if n not in ("data", "softmax_label")) * 4 / 2**20
    return planned + 3 * weights <= plan.auto_batch_memory_mb


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


def load_pretrained(spec: PretrainedSpec, model: ModelSpec, classes: int, image_shape: tuple[int, int, int],
                    contexts, backend: str = "gluon"):
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
        probe = build_net(model, 1, image_shape, backend)
        _, head = _backbone_and_head_key(probe)
        if f"{head}.weight" not in saved:
            raise WeightsError(f"{spec.params}: has no classifier {head}.weight, so it is not {model.arch} weights")
        net = build_net(model, int(saved[f"{head}.weight"].shape[0]), image_shape, backend)
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
