"""Batches for the PyTorch backend, on the sample order and sharding of the MXNet iterators.

Every process reads its share of each global batch (xp.datasets.worker_slice, with the
process's rank among all processes), so N processes x B/N see the samples one process
with B sees. In-memory data sets are sliced directly; RecordIO files (those xp prepares
from image folders, or given) are decoded and augmented in DataLoader worker processes,
with per-sample randomness seeded by (seed, epoch, record), so it does not depend on
which worker decodes which sample.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator

import numpy as np
import torch

from xp import datasets
from xp.plan import Plan


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
    shorter side resized (dataset.resize), then a random-resized, random or centre crop to the
    image shape, random mirroring, and (pixel - mean) / std on the 0-255 scale. Items are (record
    number, epoch) pairs; a record's random draws are a function of (seed, epoch, record)."""

    def __init__(self, rec: str, options: dict[str, Any], image_shape: tuple[int, int, int], train: bool, seed: int):
        from xp.recordio import RecordFile

        self.file = RecordFile(rec[:-4] + ".idx", rec)
        self.keys = list(self.file.keys)
        self.options, self.shape, self.train, self.seed = options, image_shape, train, seed
        self.mean = np.asarray(options["mean"][: image_shape[0]], np.float32)
        self.std = np.asarray(options["std"][: image_shape[0]], np.float32)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        import cv2

        from xp.recordio import DataError, unpack_image

        i, epoch = item
        key = self.keys[i]
        try:
            label, jpeg = unpack_image(self.file.read(key))
        except (OSError, ValueError) as e:
            raise DataError(f"{self.file.rec_path}: record {key} is corrupt ({e})") from None
        c, h, w = self.shape
        img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR)
        if img is None:
            raise DataError(f"{self.file.rec_path}: record {key} holds no decodable image")
        img = img[:, :, None] if img.ndim == 2 else img[:, :, ::-1]  # OpenCV's BGR to RGB
        rng = np.random.RandomState(zlib.crc32(f"{self.seed}:{epoch}:{key}".encode()))
        o = self.options
        if o.get("resize"):
            img = _resize_shorter(img, int(o["resize"]))
        if self.train and o.get("random_resized_crop"):
            img = _random_resized_crop(img, rng, float(o.get("min_random_area", 0.08)), (h, w))
        else:
            img = _crop(img, (h, w), rng if self.train and o.get("rand_crop") else None)
        if self.train and o.get("rand_mirror") and rng.rand() < 0.5:
            img = img[:, ::-1]
        x = (img.astype(np.float32) - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), int(label)


def _resize_shorter(img: np.ndarray, size: int) -> np.ndarray:
    import cv2

    h, w = img.shape[:2]
    if min(h, w) == size:
        return img
    scale = size / min(h, w)
    out = cv2.resize(img, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_LINEAR)
    return out[:, :, None] if out.ndim == 2 else out


def _crop(img: np.ndarray, size: tuple[int, int], rng: np.random.RandomState | None) -> np.ndarray:
    """A crop of `size`: at a random place with rng, else centred; images smaller than `size` are resized up."""
    import cv2

    h, w = img.shape[:2]
    if h < size[0] or w < size[1]:
        out = cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
        return out[:, :, None] if out.ndim == 2 else out
    y = rng.randint(0, h - size[0] + 1) if rng is not None else (h - size[0]) // 2
    x = rng.randint(0, w - size[1] + 1) if rng is not None else (w - size[1]) // 2
    return img[y:y + size[0], x:x + size[1]]


def _random_resized_crop(img: np.ndarray, rng: np.random.RandomState, min_area: float,
                         size: tuple[int, int]) -> np.ndarray:
    """Inception-style crop: a random area (min_area..1) and aspect ratio (3/4..4/3), resized to `size`."""
    import cv2

    h, w = img.shape[:2]
    for _ in range(10):
        area = rng.uniform(min_area, 1.0) * h * w
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = int(round(np.sqrt(area * ratio))), int(round(np.sqrt(area / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            y, x = rng.randint(0, h - ch + 1), rng.randint(0, w - cw + 1)
            img = img[y:y + ch, x:x + cw]
            break
    out = cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
    return out[:, :, None] if out.ndim == 2 else out


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
    """A .rec file through a DataLoader: data_nthreads worker processes decode and augment."""

    def __init__(self, rec: str, plan: Plan, shards: int, shard: int, train: bool, pin: bool):
        d = plan.dataset
        self.images = RecordImages(rec, d.options, d.image_shape, train, plan.seed)
        batch = plan.global_batch if train else plan.batch
        self.sampler = _Steps(len(self.images), batch, shards, shard, plan.steps_per_epoch, plan.seed, train)
        self.loader = torch.utils.data.DataLoader(self.images, batch_sampler=self.sampler,
                                                  num_workers=plan.data_nthreads, pin_memory=pin,
                                                  persistent_workers=False)

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.epoch, self.sampler.skip = epoch, skip
        return iter(self.loader)


def make_batches(plan: Plan, shards: int, shard: int, pin: bool, device: Any = "cpu") -> tuple[Any, Any]:
    """(train, val) batch sources for process `shard` of `shards`; no val source for test_io runs.
    Synthetic batches are made on `device`; the others are read into (pinned, with pin) host memory."""
    d = plan.dataset
    if d.options.get("kind", d.name) in ("rec", "folder"):
        from xp.recordio import record_files

        train_rec, val_rec = record_files(plan)
        val = None if plan.test_io else RecordBatches(val_rec, plan, shards, shard, train=False, pin=pin)
        return RecordBatches(train_rec, plan, shards, shard, train=True, pin=pin), val
    if d.name == "synthetic":
        per = plan.global_batch // shards
        return (SyntheticBatches(d.image_shape, d.num_classes, per, plan.steps_per_epoch, plan.seed, device),
                SyntheticBatches(d.image_shape, d.num_classes, per, max(1, d.val_size // plan.global_batch),
                                 plan.seed + 1, device))
    tx, ty, vx, vy = datasets.load_arrays(d)
    return (ArrayBatches(tx, ty, plan.global_batch, shards, shard, plan.steps_per_epoch, plan.seed, train=True),
            ArrayBatches(vx, vy, plan.batch, 1, 0, 0, plan.seed, train=False))
