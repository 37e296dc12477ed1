"""TinyNet: one network, written for Gluon and for PyTorch, registered in xp.models (pyproject.toml).

xp calls a factory with the task (classes, input shape, framework, model.dropout) and trains what it returns.
"""

from __future__ import annotations

from xp.plugin import Network, Task


def _gluon(task: Task, batchnorm: bool):
    from mxnet.gluon import nn

    net = nn.HybridSequential(prefix="tinynet_")
    with net.name_scope():
        net.add(nn.Conv2D(16, kernel_size=3, padding=1))
        if batchnorm:
            net.add(nn.BatchNorm())
        net.add(nn.Activation("relu"), nn.MaxPool2D(pool_size=2, strides=2), nn.Flatten(),
                nn.Dense(32, activation="relu"))
        if task.dropout:
            net.add(nn.Dropout(task.dropout))
        net.add(nn.Dense(task.classes))
    return net


def _torch(task: Task, batchnorm: bool):
    from torch import nn

    c, h, w = task.input_shape
    layers = [nn.Conv2d(c, 16, 3, padding=1)]
    if batchnorm:
        layers.append(nn.BatchNorm2d(16))
    layers += [nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(16 * (h // 2) * (w // 2), 32), nn.ReLU()]
    if task.dropout:
        layers.append(nn.Dropout(task.dropout))
    layers.append(nn.Linear(32, task.classes))
    net = nn.Sequential(*layers)
    # initialised as xp initialises a Gluon network (He-normal weights, zero biases): the same network trains the same
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return net


tinynet = Network(mxnet=lambda t: _gluon(t, False), torch=lambda t: _torch(t, False),
                  about="TinyNet: conv, pool and two dense layers")
tinynet_bn = Network(mxnet=lambda t: _gluon(t, True), torch=lambda t: _torch(t, True),
                     about="TinyNet with BatchNorm after its convolution")
