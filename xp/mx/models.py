"""The network: one Gluon HybridBlock per model, built in xp or taken from the GluonCV zoo."""

from __future__ import annotations

from xp.plan import ModelSpec


def lenet(classes: int):
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
            nn.Dense(classes),
        )
    return net


XP_ZOO = {"lenet": lenet}


def build_net(model: ModelSpec, classes: int):
    """The network with `classes` outputs (logits), parameters not yet initialised."""
    if model.zoo == "xp":
        if model.arch not in XP_ZOO:
            from xp.errors import ConfigError

            raise ConfigError(f"model.arch={model.arch!r}: not in xp's zoo; valid: {', '.join(sorted(XP_ZOO))}")
        return XP_ZOO[model.arch](classes)
    from gluoncv.model_zoo import get_model

    try:
        return get_model(model.arch, classes=classes, pretrained=False)
    except ValueError as e:
        from xp.errors import ConfigError

        raise ConfigError(f"model.arch={model.arch!r}: not in the GluonCV model zoo ({e})") from e


def initialize(net, contexts, seed: int, image_shape: tuple[int, ...]) -> None:
    """Initialise parameters deterministically (MSRA/He init) on every context.

    Parameters are drawn once on the CPU and copied to each context, so N
    devices start from exactly the weights one device would. One forward pass
    of a dummy sample resolves Gluon's deferred shapes now, so backends can
    read, export or broadcast real parameters before training.
    """
    import mxnet as mx

    mx.random.seed(seed)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=contexts)
    net(mx.nd.zeros((1, *image_shape), ctx=contexts[0]))
