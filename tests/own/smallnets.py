"""A network that learns, slowly, and one that cannot learn, on a small 3-class data set of 8x8 images: xp.check's
judgement of a learner (tests/test_own_code.py), through --config-dir=tests/own/conf."""

import numpy as np

from xp.plugin import Data, Network


def _gluon(task, dead=False):
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, padding=1, activation="relu"), nn.GlobalAvgPool2D(), nn.Flatten())
    out = nn.Dense(task.classes, weight_initializer="zeros" if dead else None)
    if dead:  # its output layer zeroed and frozen: every image scores every class 0
        out.collect_params().setattr("grad_req", "null")
    net.add(out)
    return net


def _torch(task, dead=False):
    from torch import nn

    out = nn.Linear(16, task.classes)
    if dead:
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
        out.requires_grad_(False)
    return nn.Sequential(nn.Conv2d(task.input_shape[0], 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), out)


# one 3x3 convolution (16 channels), ReLU, global average pooling, a dense layer: it learns, slowly at first
slow_conv = Network(mxnet=_gluon, torch=_torch)
dead_output = Network(mxnet=lambda task: _gluon(task, dead=True), torch=lambda task: _torch(task, dead=True))


def three_bars(task):
    """8x8 images of a horizontal, a vertical or a diagonal bar at a random place, with noise: 3 classes."""
    rng = np.random.RandomState(0)

    def make(n):
        x = rng.normal(0, 0.3, (n, 1, 8, 8)).astype(np.float32)
        y = rng.randint(0, 3, n).astype(np.int64)
        for img, label in zip(x, y):
            at = rng.randint(1, 7)
            if label == 0:
                img[0, at, :] += 1.0
            elif label == 1:
                img[0, :, at] += 1.0
            else:
                img[0, np.arange(8), np.arange(8)] += 1.0
        return x, y

    return Data(train=make(256), val=make(64), classes=3, input_shape=(1, 8, 8))
