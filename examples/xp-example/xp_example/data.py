"""Shapes: a data set generated from a seed (no download), registered in xp.datasets (pyproject.toml).

Four classes of 16 x 16 grey images: a square, a cross, a ring and a bar, at a random place and size, on noise.
The factory gives the framework's own Dataset type; each item is made when it is read (in xp's loader workers),
with the data set's own transform: pixels scaled to [0, 1].
"""

from __future__ import annotations

import numpy as np

from xp.plugin import Data, DataTask

CLASSES = ("square", "cross", "ring", "bar")
SIZE = 16


def image(index: int, seed: int) -> tuple[np.ndarray, int]:
    """Sample `index`: its pixels (0-255, uint8, 1 x 16 x 16) and its class, a function of (seed, index)."""
    rng = np.random.RandomState((seed * 1_000_003 + index) % 2**32)
    label = index % len(CLASSES)
    img = rng.randint(0, 60, (SIZE, SIZE)).astype(np.uint8)
    r = rng.randint(3, 6)
    cy, cx = rng.randint(r, SIZE - r), rng.randint(r, SIZE - r)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    if label == 0:
        mask = (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
    elif label == 1:
        mask = ((abs(yy - cy) <= r) & (abs(xx - cx) <= 1)) | ((abs(xx - cx) <= r) & (abs(yy - cy) <= 1))
    elif label == 2:
        d = np.hypot(yy - cy, xx - cx)
        mask = (d <= r) & (d >= r - 1.5)
    else:
        mask = (abs(yy - cy) <= 1) & (abs(xx - cx) <= r)
    img[mask] = 255
    return img[None], label


def transform(pixels: np.ndarray) -> np.ndarray:
    """The data set's own transform: uint8 pixels to float32 in [0, 1]."""
    return pixels.astype(np.float32) / 255.0


class _Shapes:
    def __init__(self, first: int, count: int, seed: int):
        self.first, self.count, self.seed = first, count, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        if not 0 <= i < self.count:
            raise IndexError(i)
        pixels, label = image(self.first + i, self.seed)
        return transform(pixels), label


def shapes(task: DataTask) -> Data:
    """800 training and 200 validation images (dataset.train_size / val_size in a config file change that)."""
    train_size = int(task.options.get("train_size", 800))
    val_size = int(task.options.get("val_size", 200))
    seed = int(task.options.get("seed", 7))
    if task.framework == "torch":
        import torch.utils.data

        class Shapes(_Shapes, torch.utils.data.Dataset):
            pass
    else:
        import mxnet.gluon.data

        class Shapes(_Shapes, mxnet.gluon.data.Dataset):
            pass
    return Data(train=Shapes(0, train_size, seed), val=Shapes(train_size, val_size, seed),
                classes=len(CLASSES), input_shape=(1, SIZE, SIZE), class_names=CLASSES, transform=transform)
