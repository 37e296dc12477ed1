"""A user's factories that go wrong, each in one way (tests/test_bad_input.py's rows through --config-dir=tests/own/conf)."""

import numpy as np

from xp.plugin import Data, Network


def wrong_type(task):
    return "a network"  # neither a HybridBlock nor an nn.Module


def _torch_dense(task, outputs, channels=None):
    from torch import nn

    c, h, w = task.input_shape
    return nn.Sequential(nn.Conv2d(channels or c, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * h * w, outputs))


def wrong_classes(task):
    if task.framework == "torch":
        return _torch_dense(task, 3)
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    net.add(nn.Dense(3))
    return net


def wants_rgb(task):
    return _torch_dense(task, task.classes, channels=3)  # the digits have 1 channel


torch_only = Network(torch=lambda task: _torch_dense(task, task.classes))


def _arrays(n, labels):
    return np.zeros((n, 1, 8, 8), np.float32), np.asarray(labels[:n] if len(labels) else [], np.int64)


def empty_data(task):
    return Data(train=(np.zeros((0, 1, 8, 8), np.float32), np.zeros(0, np.int64)), val=_arrays(4, [0, 1, 2, 3]),
                classes=4, input_shape=(1, 8, 8))


def bad_labels(task):
    return Data(train=_arrays(8, [0, 1, 2, 3, 0, 1, 7, 3]), val=_arrays(4, [0, 1, 2, 3]), classes=4,
                input_shape=(1, 8, 8))
