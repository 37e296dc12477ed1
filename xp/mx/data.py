"""Data iterators on the mx.io.DataIter contract, sharded by worker rank."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from xp import datasets
from xp.plan import Plan


class ArrayIter(mx.io.DataIter):
    """Deterministic iterator over in-memory arrays, sharded by worker.

    Each epoch's order is a function of (seed, epoch) and identical on every
    worker; at each step a worker reads its share of the global batch
    (xp.datasets.worker_slice). Every worker runs exactly `steps` steps: an
    uneven shard would make distributed kvstores wait forever at epoch end.

    For evaluation (shuffle=False, pad_last=True) the last batch is filled up
    with samples from the start and reports how many via DataBatch.pad.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, global_batch: int, workers: int = 1, rank: int = 0,
                 shuffle: bool = True, seed: int = 0, pad_last: bool = False):
        super().__init__(global_batch // workers)
        self.x, self.y = x, y.astype(np.float32)
        self.global_batch, self.workers, self.rank = global_batch, workers, rank
        self.shuffle, self.seed, self.pad_last = shuffle, seed, pad_last
        n = len(x)
        self.steps = -(-n // global_batch) if pad_last else n // global_batch
        self.epoch = 0
        self._order = datasets.epoch_order(n, seed, 0, shuffle)
        self._step = 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", (self.batch_size, *self.x.shape[1:]), np.float32)]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", (self.batch_size,), np.float32)]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.reset()

    def reset(self) -> None:
        self._order = datasets.epoch_order(len(self.x), self.seed, self.epoch, self.shuffle)
        self._step = 0

    def next(self) -> mx.io.DataBatch:
        if self._step >= self.steps:
            raise StopIteration
        sl = datasets.worker_slice(self._step, self.global_batch, self.rank, self.workers)
        idx = np.arange(sl.start, sl.stop)
        pad = int(max(0, sl.stop - len(self.x))) if self.pad_last else 0
        idx = self._order[idx % len(self.x)]
        self._step += 1
        return mx.io.DataBatch([mx.nd.array(self.x[idx])], [mx.nd.array(self.y[idx])], pad=pad,
                               provide_data=self.provide_data, provide_label=self.provide_label)


class SyntheticIter(mx.io.DataIter):
    """One random batch, served `steps` times: measures compute without an input pipeline."""

    def __init__(self, shape: tuple[int, ...], classes: int, batch: int, steps: int, seed: int):
        super().__init__(batch)
        rng = np.random.RandomState(seed)
        self.data = mx.nd.array(rng.uniform(-1, 1, (batch, *shape)).astype(np.float32))
        self.label = mx.nd.array(rng.randint(0, classes, batch).astype(np.float32))
        self.steps, self._step = steps, 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", self.data.shape, np.float32)]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", self.label.shape, np.float32)]

    def set_epoch(self, epoch: int) -> None:
        self.reset()

    def reset(self) -> None:
        self._step = 0

    def next(self) -> mx.io.DataBatch:
        if self._step >= self.steps:
            raise StopIteration
        self._step += 1
        return mx.io.DataBatch([self.data], [self.label], pad=0,
                               provide_data=self.provide_data, provide_label=self.provide_label)


def make_iters(plan: Plan) -> tuple[mx.io.DataIter, mx.io.DataIter]:
    """(train, val) iterators for this worker."""
    d = plan.dataset
    if d.name == "synthetic":
        train = SyntheticIter(d.image_shape, d.num_classes, plan.worker_batch, plan.steps_per_epoch, plan.seed)
        val = SyntheticIter(d.image_shape, d.num_classes, plan.worker_batch,
                            max(1, d.val_size // plan.global_batch), plan.seed + 1)
        return train, val
    tx, ty, vx, vy = datasets.load_arrays(d)
    train = ArrayIter(tx, ty, plan.global_batch, plan.workers, plan.rank, shuffle=True, seed=plan.seed)
    # Every worker scores the whole validation set; batches padded, padding not scored.
    val = ArrayIter(vx, vy, plan.worker_batch, shuffle=False, pad_last=True)
    return train, val
