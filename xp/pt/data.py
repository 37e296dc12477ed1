"""Batches for the PyTorch backend, on the sample order and sharding of the MXNet iterators.

Every process reads its share of each global batch (xp.data.datasets.worker_slice, with the
process's rank among all processes), so N processes x B/N see the samples one process
with B sees. In-memory data sets are sliced directly; RecordIO files (those xp prepares
from image folders, or given) are decoded and augmented in DataLoader worker processes
(dataset.decode=cpu), or read there and decoded and augmented on the GPU by nvJPEG
(dataset.decode=gpu), with per-sample randomness seeded by (seed, epoch, record), so it
depends neither on which worker reads a sample nor on where it is decoded.
"""

from __future__ import annotations

import logging
import math
import random
import zlib
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch

from xp.data import datasets
from xp.run.plan import Plan

log = logging.getLogger("xp")


class ArrayBatches:
    """In-memory arrays: an epoch is `steps` batches of this process's shard (training), or the whole
    set in order (evaluation: every process scores all of it)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, global_batch: int, shards: int, shard: int, steps: int,
                 seed: int, train: bool):
        self.x, self.y = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64))
        self.global_batch, self.shards, self.shard, self.steps, self.seed, self.train = \
            global_batch, shards, shard, steps, seed, train

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.train:
            for i in range(0, len(self.x), self.global_batch):
                yield self.x[i:i + self.global_batch], self.y[i:i + self.global_batch]
            return
        # this shard's samples of the epoch gathered once; a batch is a view of them (a gather per batch
        # cost about 0.09 ms of a 2 ms LeNet step)
        order = datasets.epoch_order(len(self.x), self.seed, epoch, True)
        size = self.global_batch // self.shards
        idx = torch.from_numpy(order[datasets.shard_positions(self.steps, self.global_batch, self.shard,
                                                              self.shards)])
        x, y = self.x[idx], self.y[idx]
        for step in range(skip, self.steps):
            yield x[step * size:(step + 1) * size], y[step * size:(step + 1) * size]


class DatasetBatches:
    """A registered data set's torch Dataset (xp.data.plugins) in ArrayBatches' order and sharding, its samples
    read by a DataLoader with `nthreads` worker processes; normalised and its labels checked per batch."""

    def __init__(self, dataset: Any, classes: int, global_batch: int, shards: int, shard: int, steps: int, seed: int,
                 train: bool, nthreads: int, norm: Any, where: str):
        self.dataset, self.classes, self.nthreads, self.where = dataset, classes, nthreads, where
        self.norm = None if norm is None else (torch.from_numpy(norm[0]), torch.from_numpy(norm[1]))
        self.global_batch, self.shards, self.shard, self.steps, self.seed, self.train = \
            global_batch, shards, shard, steps, seed, train

    def batches(self, epoch: int, skip: int) -> list[list[int]]:
        n = len(self.dataset)
        if not self.train:
            return [list(range(i, min(i + self.global_batch, n))) for i in range(0, n, self.global_batch)]
        order = datasets.epoch_order(n, self.seed, epoch, True)
        idx = order[datasets.shard_positions(self.steps, self.global_batch, self.shard, self.shards)]
        size = self.global_batch // self.shards
        return [idx[step * size:(step + 1) * size].tolist() for step in range(skip, self.steps)]

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from xp.data.plugins import in_range

        import warnings

        with warnings.catch_warnings():  # data_nthreads beyond the cores is the user's choice, said in the plan
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = iter(torch.utils.data.DataLoader(self.dataset, batch_sampler=self.batches(epoch, skip),
                                                      num_workers=self.nthreads))
        for x, y in loader:
            x, y = torch.as_tensor(x).float(), torch.as_tensor(y)
            if self.norm is not None:
                x = (x - self.norm[0]) / self.norm[1]
            in_range(y.numpy(), self.classes, self.where)
            yield x, y.long()


def plugin_batches(plan: Plan, shards: int, shard: int) -> tuple[Any, Any]:
    """(train, val) batch sources of a registered data set: arrays through ArrayBatches, a torch Dataset through
    DatasetBatches."""
    from xp.data import plugins
    from xp.run.entry_points import Registry

    data, norm, parts = plugins.parts(plan.dataset, Registry().load(plan.backend))
    made: list[ArrayBatches | DatasetBatches] = []
    for p in parts:
        batch, steps = (plan.global_batch, plan.steps_per_epoch) if p.train else (plan.batch, 0)
        shards_here, shard_here = (shards, shard) if p.train else (1, 0)
        if p.labels is not None:
            made.append(ArrayBatches(p.samples, p.labels, batch, shards_here, shard_here, steps, plan.seed,
                                     train=p.train))
        else:
            made.append(DatasetBatches(p.samples, data.classes, batch, shards_here, shard_here, steps, plan.seed,
                                       p.train, plan.data_nthreads, norm, p.where))
    return made[0], made[1]


class SyntheticBatches:
    """One random batch, served `steps` times: compute without an input pipeline."""

    def __init__(self, shape: tuple[int, ...], classes: int, batch: int, steps: int, seed: int, device: Any = "cpu"):
        rng = np.random.RandomState(seed)
        # on the device already: no host-to-device copy per step (a 256 x 3 x 224 x 224 batch is 154 MB)
        self.x = torch.from_numpy(rng.uniform(-1, 1, (batch, *shape)).astype(np.float32)).to(device)
        self.y = torch.from_numpy(rng.randint(0, classes, batch).astype(np.int64))
        self.steps = steps

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(skip, self.steps):
            yield self.x, self.y


class RecordImages(torch.utils.data.Dataset):
    """Images of a .rec file, decoded with OpenCV and augmented as MXNet's ImageRecordIter does:
    shorter side resized (dataset.resize; not before a training random-resized crop, which MXNet
    takes from the stored image), then a random-resized, random or centre crop to the image shape,
    random mirroring, and (pixel - mean) / std on the 0-255 scale. An item is a whole batch, a list of
    (record number, epoch) pairs, written straight into one tensor (in shared memory inside a
    DataLoader worker: no per-sample tensors, no collation copy). A record's random draws are a
    function of (seed, epoch, record)."""

    def __init__(self, rec: str, options: dict[str, Any], image_shape: tuple[int, int, int], train: bool, seed: int):
        from xp.data.recordio import RecordFile

        self.file = RecordFile(rec[:-4] + ".idx", rec)
        self.keys = list(self.file.keys)
        self.options, self.shape, self.train, self.seed = options, image_shape, train, seed
        self.mean = np.asarray(options["mean"][: image_shape[0]], np.float32)
        self.std = np.asarray(options["std"][: image_shape[0]], np.float32)

    def __len__(self) -> int:
        return len(self.keys)

    def record(self, i: int) -> tuple[int, bytes]:
        """(label, encoded image) of record number i."""
        from xp.data.recordio import DataError, unpack_image

        key = self.keys[i]
        try:
            label, jpeg = unpack_image(self.file.read(key))
        except (OSError, ValueError) as e:
            raise DataError(f"{self.file.rec_path}: record {key} is corrupt ({e})") from None
        return int(label), jpeg

    def geometry(self, hw: tuple[int, int], i: int, epoch: int) -> Geometry:
        """The crop of record number i, `hw` pixels decoded, in `epoch`: its draws seeded by (seed, epoch, key)."""
        # random.Random: seeding numpy's RandomState took 120 us a sample, a third of a GPU-decoded image's time
        rng = random.Random(zlib.crc32(f"{self.seed}:{epoch}:{self.keys[i]}".encode()))
        return geometry(hw, self.shape[1:], self.options, self.train, rng)

    def __getitem__(self, items: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import cv2

        from xp.data.recordio import DataError

        c, h, w = self.shape
        x, y = _batch_tensor((len(items), c, h, w)), torch.empty(len(items), dtype=torch.int64)
        out = x.numpy()
        for j, (i, epoch) in enumerate(items):
            label, jpeg = self.record(i)
            img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR)
            if img is None:
                raise DataError(f"{self.file.rec_path}: record {self.keys[i]} holds no decodable image")
            y[j] = label
            g = self.geometry(img.shape[:2], i, epoch)
            if g.resize:
                img = cv2.resize(img, g.resize[::-1], interpolation=cv2.INTER_LINEAR)
            top, left, ch, cw = g.box
            img = img[top:top + ch, left:left + cw]
            if (ch, cw) != (h, w):
                img = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)
            if g.mirror:
                img = cv2.flip(img, 1)
            # (pixel - mean) / std per channel into the batch, OpenCV's BGR to RGB on the way: 0.09 ms a 224 px
            # image, against 0.78 for a float HWC image normalised, transposed and copied per sample
            planes = cv2.split(img) if img.ndim == 3 else [img]
            for k in range(c):
                np.subtract(planes[c - 1 - k], self.mean[k], out=out[j, k], dtype=np.float32)
                out[j, k] /= self.std[k]
        return x, y


class Geometry(NamedTuple):
    """Where a sample's pixels come from: the whole image resized to `resize` (height, width) first, or not;
    then the box (top, left, height, width), resized to the image shape where it differs; mirrored or not."""
    resize: tuple[int, int] | None
    box: tuple[int, int, int, int]
    mirror: bool


def geometry(hw: tuple[int, int], size: tuple[int, int], options: dict[str, Any], train: bool,
             rng: random.Random) -> Geometry:
    """A sample's crop, as MXNet's ImageRecordIter draws it, for an image of `hw` pixels and output `size`."""
    h, w = hw
    resize = None
    rrc = train and bool(options.get("random_resized_crop"))
    short = int(options.get("resize") or 0)
    if short and not rrc and min(h, w) != short:
        scale = short / min(h, w)
        h, w = max(1, round(h * scale)), max(1, round(w * scale))
        resize = (h, w)
    if rrc:
        box = _random_resized_box(h, w, rng, float(options.get("min_random_area", 0.08)))
    elif h < size[0] or w < size[1]:
        box = (0, 0, h, w)  # smaller than the crop: the whole image, resized up
    elif train and options.get("rand_crop"):
        box = (rng.randint(0, h - size[0]), rng.randint(0, w - size[1]), *size)
    else:
        box = ((h - size[0]) // 2, (w - size[1]) // 2, *size)
    return Geometry(resize, box, bool(train and options.get("rand_mirror") and rng.random() < 0.5))


def _random_resized_box(h: int, w: int, rng: random.Random, min_area: float) -> tuple[int, int, int, int]:
    """Inception-style crop: a random area (min_area..1) and aspect ratio (3/4..4/3); the whole image after
    10 misses."""
    for _ in range(10):
        area = rng.uniform(min_area, 1.0) * h * w
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    return 0, 0, h, w


def _batch_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An empty float32 tensor; in shared memory inside a DataLoader worker, so that handing it to the main
    process moves no bytes (share_memory_() on a finished one copies it: about 5 ms a 64 x 3 x 224 x 224 batch)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape)
    try:
        storage = torch.UntypedStorage._new_shared(4 * int(np.prod(shape)))
    except AttributeError:  # a PyTorch without it: shared by a copy when sent
        return torch.empty(shape)
    return torch.empty(0).set_(storage, 0, shape)


def _one_decode_thread(_: int) -> None:
    """DataLoader worker start: one OpenCV thread (its resize would otherwise start a thread per core in every
    worker: 3-4% slower with 2 workers on 2 cores). The objects inherited from the parent are frozen: garbage
    among them (another loader's finished iterator) must not be collected here, where its clean-up would try
    to stop workers that are not this process's children."""
    import gc

    import cv2

    gc.freeze()
    cv2.setNumThreads(1)


class EncodedRecords(RecordImages):
    """dataset.decode=gpu, the workers' part: a batch's records read, not decoded (the encoded images end to end
    in one uint8 tensor, their lengths, labels and record numbers, and the batch's epoch)."""

    def __getitem__(self, items: list[tuple[int, int]]) -> tuple[Any, ...]:
        records = [self.record(i) for i, _ in items]
        blob = torch.frombuffer(bytearray(b"".join(jpeg for _, jpeg in records)), dtype=torch.uint8)
        return (blob, torch.tensor([len(jpeg) for _, jpeg in records]), torch.tensor([label for label, _ in records]),
                torch.tensor([i for i, _ in items]), items[0][1])


class _Steps(torch.utils.data.Sampler):
    """Batch sampler: this process's share of each global batch, for `steps` steps from `skip`."""

    def __init__(self, n: int, global_batch: int, shards: int, shard: int, steps: int, seed: int, train: bool):
        self.n, self.global_batch, self.shards, self.shard, self.steps, self.seed, self.train = \
            n, global_batch, shards, shard, steps, seed, train
        self.epoch, self.skip = 1, 0

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        if not self.train:
            for i in range(0, self.n, self.global_batch):
                yield [(j, 0) for j in range(i, min(self.n, i + self.global_batch))]
            return
        order = datasets.epoch_order(self.n, self.seed, self.epoch, True)
        # the plan counts the folder's images; a few unreadable ones left out: its last batches wrap around
        order = np.resize(order, max(self.n, self.steps * self.global_batch))
        for step in range(self.skip, self.steps):
            yield [(int(j), self.epoch) for j in order[datasets.worker_slice(step, self.global_batch, self.shard,
                                                                              self.shards)]]

    def __len__(self) -> int:
        return self.steps - self.skip if self.train else -(-self.n // self.global_batch)


class RecordBatches:
    """A .rec file through a DataLoader: data_nthreads worker processes decode and augment it (dataset.decode=cpu),
    or read its records for the GPU to decode and augment (`gpu`, a device: dataset.decode=gpu)."""

    def __init__(self, rec: str, plan: Plan, shards: int, shard: int, train: bool, pin: bool, gpu: Any = None):
        d = plan.dataset
        from xp.pt.gpu_decode import GpuDecoder

        self.images = (EncodedRecords if gpu is not None else RecordImages)(rec, d.options, d.image_shape, train,
                                                                            plan.seed)
        self.decoder = GpuDecoder(self.images, gpu) if gpu is not None else None
        batch = plan.global_batch if train else plan.batch
        self.sampler = _Steps(len(self.images), batch, shards, shard, plan.steps_per_epoch, plan.seed, train)
        # batch_size=None: the sampler's items are whole batches, which the data set writes in one piece;
        # workers persist across epochs (as MXNet's decode threads do): starting 2 cost 7-12% of a test_io epoch
        self.loader = torch.utils.data.DataLoader(self.images, sampler=self.sampler, batch_size=None,
                                                  num_workers=plan.data_nthreads, pin_memory=pin and gpu is None,
                                                  worker_init_fn=_one_decode_thread,
                                                  persistent_workers=plan.data_nthreads > 0)
        self.decode = (f"gpu (nvJPEG on {self.decoder.device}, {plan.data_nthreads} record readers)"
                       if self.decoder is not None
                       else f"cpu ({plan.data_nthreads} decode workers)")

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.epoch, self.sampler.skip = epoch, skip
        if self.decoder is None:
            return iter(self.loader)
        return ((self.decoder(blob, sizes, numbers, batch_epoch), labels)
                for blob, sizes, labels, numbers, batch_epoch in self.loader)


def make_batches(plan: Plan, shards: int, shard: int, pin: bool, device: Any = "cpu") -> tuple[Any, Any]:
    """(train, val) batch sources for process `shard` of `shards`; no val source for test_io runs.
    Synthetic batches are made on `device`; the others are read into (pinned, with pin) host memory."""
    d = plan.dataset
    if datasets.is_plugin(d):
        return plugin_batches(plan, shards, shard)
    if d.options.get("kind", d.name) in ("rec", "folder"):
        from xp.data.recordio import record_files

        train_rec, val_rec = record_files(plan)
        gpu, fallback = None, ""
        if d.options.get("decode", "cpu") == "gpu":
            from xp.pt.gpu_decode import gpu_decode_problem

            problem = gpu_decode_problem(device)
            if problem:
                log.warning(f"dataset.decode=gpu: this torchvision cannot decode JPEGs on {device} ({problem}); "
                            f"the {plan.data_nthreads} decode workers decode them on the CPU")
                fallback = f"; dataset.decode=gpu fell back: {problem}"
            else:
                gpu = device
        val = None if plan.test_io else RecordBatches(val_rec, plan, shards, shard, train=False, pin=pin, gpu=gpu)
        train = RecordBatches(train_rec, plan, shards, shard, train=True, pin=pin, gpu=gpu)
        train.decode += fallback
        return train, val
    if d.name == "synthetic":
        per = plan.global_batch // shards
        return (SyntheticBatches(d.image_shape, d.num_classes, per, plan.steps_per_epoch, plan.seed, device),
                SyntheticBatches(d.image_shape, d.num_classes, per, max(1, d.val_size // plan.global_batch),
                                 plan.seed + 1, device))
    tx, ty, vx, vy = datasets.load_arrays(d)
    return (ArrayBatches(tx, ty, plan.global_batch, shards, shard, plan.steps_per_epoch, plan.seed, train=True),
            ArrayBatches(vx, vy, plan.batch, 1, 0, 0, plan.seed, train=False))
