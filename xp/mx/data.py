"""Data iterators on the mx.io.DataIter contract, sharded by worker rank."""

from __future__ import annotations

import logging
import os

import mxnet as mx
import numpy as np

from xp.data import datasets
from xp.run.plan import Plan

log = logging.getLogger("xp")


class ArrayIter(mx.io.DataIter):
    """Deterministic iterator over in-memory arrays, sharded by worker.

    Each epoch's order is a function of (seed, epoch) and identical on every
    worker; at each step a worker reads its share of the global batch
    (xp.data.datasets.worker_slice). Every worker runs exactly `steps` steps: an
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
        # every batch carries them (Module checks them per step): made once
        self._provide_data = [mx.io.DataDesc("data", (self.batch_size, *x.shape[1:]), np.float32)]
        self._provide_label = [mx.io.DataDesc("softmax_label", (self.batch_size,), np.float32)]
        self.reset()

    @property
    def provide_data(self):
        return self._provide_data

    @property
    def provide_label(self):
        return self._provide_label

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.reset()

    def indices(self, n: int) -> np.ndarray:
        """This worker's samples of the epoch, in order; and each step's pad (evaluation: the last batch wraps
        around to the start, and its pad says by how many samples)."""
        order = datasets.epoch_order(n, self.seed, self.epoch, self.shuffle)
        positions = datasets.shard_positions(self.steps, self.global_batch, self.rank, self.workers)
        last = positions.reshape(self.steps, self.batch_size)[:, -1]
        self._pads = np.maximum(0, last + 1 - n) if self.pad_last else np.zeros(self.steps, dtype=np.int64)
        return order[positions % n]

    def reset(self) -> None:
        # This worker's samples of the whole epoch, gathered into one NDArray once: a batch is then a view of
        # it (a copy per batch, two mx.nd.array calls, cost about 0.35 ms: a quarter of a LeNet step)
        idx = self.indices(len(self.x))
        self._data, self._label = mx.nd.array(self.x[idx]), mx.nd.array(self.y[idx])
        self._step = 0

    def next(self) -> mx.io.DataBatch:
        if self._step >= self.steps:
            raise StopIteration
        step, size = self._step, self.batch_size
        self._step += 1
        return mx.io.DataBatch([self._data[step * size:(step + 1) * size]],
                               [self._label[step * size:(step + 1) * size]], pad=int(self._pads[step]),
                               provide_data=self.provide_data, provide_label=self.provide_label)


class DatasetIter(ArrayIter):
    """A registered data set's Gluon Dataset (xp.data.plugins) in ArrayIter's order and sharding, its samples
    read by a Gluon DataLoader with `nthreads` worker threads; normalised and its labels checked per batch."""

    def __init__(self, dataset, classes: int, shape: tuple[int, ...], global_batch: int, workers: int = 1,
                 rank: int = 0, shuffle: bool = True, seed: int = 0, pad_last: bool = False, nthreads: int = 0,
                 norm=None, where: str = ""):
        self.dataset, self.classes, self.nthreads, self.norm, self.where = dataset, classes, nthreads, norm, where
        probe = np.zeros((1, *shape), np.float32)  # ArrayIter's descriptions from the shape; samples read later
        super().__init__(probe, np.zeros(1), global_batch, workers, rank, shuffle, seed, pad_last)

    def reset(self) -> None:
        from mxnet import gluon

        n = len(self.dataset)
        self.steps = -(-n // self.global_batch) if self.pad_last else n // self.global_batch
        idx = self.indices(n).reshape(self.steps, self.batch_size)
        # threads: a forked worker process making NDArrays hangs in MXNet's engine, which the parent started
        self._batches = iter(gluon.data.DataLoader(self.dataset, batch_sampler=idx.tolist(),
                                                   num_workers=self.nthreads, thread_pool=True))
        self._step = 0

    def next(self) -> mx.io.DataBatch:
        from xp.data.plugins import in_range

        if self._step >= self.steps:
            raise StopIteration
        x, y = next(self._batches)
        x = x.astype(np.float32)
        if self.norm is not None:
            x = (x - mx.nd.array(self.norm[0])) / mx.nd.array(self.norm[1])
        in_range(y.asnumpy(), self.classes, self.where)
        step, self._step = self._step, self._step + 1
        return mx.io.DataBatch([x], [y.astype(np.float32)], pad=int(self._pads[step]),
                               provide_data=self.provide_data, provide_label=self.provide_label)


def plugin_iters(plan: Plan) -> tuple[mx.io.DataIter, mx.io.DataIter]:
    """(train, val) iterators of a registered data set: arrays through ArrayIter, a Gluon Dataset through
    DatasetIter."""
    from xp.data import plugins
    from xp.run.entry_points import Registry

    d = plan.dataset
    data, norm, parts = plugins.parts(d, Registry().load(plan.backend))
    made = []
    for p in parts:
        batch, workers, rank = (plan.global_batch, plan.workers, plan.rank) if p.train else (plan.worker_batch, 1, 0)
        if p.labels is not None:
            made.append(ArrayIter(p.samples, p.labels, batch, workers, rank, shuffle=p.train, seed=plan.seed,
                                  pad_last=not p.train))
        else:
            made.append(DatasetIter(p.samples, data.classes, d.image_shape, batch, workers, rank, shuffle=p.train,
                                    seed=plan.seed, pad_last=not p.train, nthreads=plan.data_nthreads, norm=norm,
                                    where=p.where))
    return made[0], made[1]


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


class EpochIter(mx.io.DataIter):
    """Gives an iterator xp's epoch interface and a fixed number of batches per epoch.

    MXNet's RecordIO readers split the file into num_parts; parts can differ by a
    batch, and a worker that runs out early leaves the others waiting forever in
    a distributed kvstore. Every worker therefore runs exactly `steps` batches
    (the seeds' tooling wraps the iterator in mx.io.ResizeIter for the same reason).
    """

    def __init__(self, inner: mx.io.DataIter, steps: int, keep_ahead: bool = True):
        super().__init__(inner.batch_size)
        self.inner = mx.io.ResizeIter(inner, steps)
        # keep_ahead=False (test_io): the first epoch starts from a reset reader, so that its time includes
        # the decoding done ahead, as every later epoch's does
        self._used = not keep_ahead

    @property
    def provide_data(self):
        return self.inner.provide_data

    @property
    def provide_label(self):
        return self.inner.provide_label

    def set_epoch(self, epoch: int) -> None:
        # A fresh reader has been decoding ahead since it was created; resetting it would throw
        # that work away (about 4 batches, 6% of a 64-batch epoch in benchmarks/pipeline_overhead.py).
        if self._used:
            self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self._used = False

    def next(self) -> mx.io.DataBatch:
        self._used = True
        return self.inner.next()


def record_iter(rec: str, plan: Plan, train: bool) -> mx.io.DataIter:
    """MXNet's C++ ImageRecordIter: decode threads = data_nthreads, augmentation on training only."""
    d = plan.dataset
    o = d.options
    channels = d.image_shape[0]
    norm = {}
    for i, c in enumerate("rgb"[:channels]):
        norm[f"mean_{c}"], norm[f"std_{c}"] = float(o["mean"][i]), float(o["std"][i])
    kwargs = dict(path_imgrec=str(rec), path_imgidx=str(rec)[:-4] + ".idx", data_shape=d.image_shape,
                  batch_size=plan.worker_batch, preprocess_threads=plan.data_nthreads, round_batch=True,
                  label_width=1, seed=plan.seed, **norm)
    if o.get("resize"):
        kwargs["resize"] = int(o["resize"])
    if train:
        kwargs.update(shuffle=True, num_parts=plan.workers, part_index=plan.rank,
                      rand_mirror=bool(o.get("rand_mirror", False)))
        if o.get("random_resized_crop"):
            kwargs.update(random_resized_crop=True, min_random_area=float(o.get("min_random_area", 0.08)),
                          max_random_area=1.0, min_aspect_ratio=3 / 4, max_aspect_ratio=4 / 3, resize=-1)
        else:
            kwargs["rand_crop"] = bool(o.get("rand_crop", False))
    try:
        it = mx.io.ImageRecordIter(**kwargs)
    except mx.base.MXNetError as e:
        from xp.data.recordio import DataError

        raise DataError(f"{rec}: MXNet cannot read it ({_mx_reason(e)})") from e
    return EpochIter(it, plan.steps_per_epoch, keep_ahead=not plan.test_io) if train else it


def _mx_reason(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith(("File", "["))]
    return (lines[-1] if lines else type(e).__name__)[:300]


def make_iters(plan: Plan) -> tuple[mx.io.DataIter, mx.io.DataIter | None]:
    """(train, val) iterators for this worker; no val iterator for test_io runs."""
    d = plan.dataset
    if datasets.is_plugin(d):
        return plugin_iters(plan)
    if d.options.get("kind", d.name) in ("rec", "folder"):
        from xp.data.recordio import record_files

        train_rec, val_rec = record_files(plan)
        cores = len(os.sched_getaffinity(0))
        cap = max(cores // 2 - 1, 1)  # MXNet's own limit on ImageRecordIter's decode threads
        if plan.data_nthreads > cap and plan.rank == 0:
            log.warning(f"data_nthreads={plan.data_nthreads}: MXNet's ImageRecordIter decodes with at most {cap} "
                        f"thread{'s' if cap > 1 else ''} on {cores} cores (its cap: cores / 2 - 1); backend=torch "
                        "decodes with data_nthreads worker processes")
        # test_io never evaluates; a validation reader would prefetch on the same cores
        val_iter = None if plan.test_io else record_iter(val_rec, plan, train=False)
        return record_iter(train_rec, plan, train=True), val_iter
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
