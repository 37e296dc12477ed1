"""Data sets as numbers and arrays, independent of any training framework.

`describe()` answers what the plan needs (classes, image shape, sizes) without
loading pixels; `load_arrays()` returns the images of in-memory data sets as
numpy arrays. Turning them into batches is the job of a framework module
(xp.mx.data for MXNet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xp.errors import ConfigError

# sklearn.datasets.load_digits() always holds 1,797 images; checked when loading.
DIGITS_TOTAL = 1797
# The split must not move when the run's seed changes, or runs would not be comparable.
_DIGITS_SPLIT_SEED = 20240601


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # channels, height, width
    train_size: int
    val_size: int
    options: dict[str, Any] = field(default_factory=dict)


def _digits(options: dict[str, Any]) -> DatasetSpec:
    frac = options.get("val_fraction", 0.2)
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
        raise ConfigError(f"dataset.val_fraction={frac!r}: must be a number between 0 and 1 (exclusive)")
    val = int(round(DIGITS_TOTAL * frac))
    return DatasetSpec("digits", 10, (1, 8, 8), DIGITS_TOTAL - val, val, {"val_fraction": float(frac)})


def _synthetic(options: dict[str, Any]) -> DatasetSpec:
    shape = options.get("image_shape")
    if (not isinstance(shape, (list, tuple)) or len(shape) != 3
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)):
        raise ConfigError(f"dataset.image_shape={shape!r}: must be [channels, height, width], positive integers")
    sizes = {}
    for key in ("num_classes", "train_size", "val_size"):
        v = options.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"dataset.{key}={v!r}: must be an integer >= 1")
        sizes[key] = v
    return DatasetSpec("synthetic", sizes["num_classes"], tuple(shape), sizes["train_size"], sizes["val_size"], {})


_CATALOGUE = {"digits": _digits, "synthetic": _synthetic}


def names() -> list[str]:
    return sorted(_CATALOGUE)


def describe(name: str, options: dict[str, Any]) -> DatasetSpec:
    if name not in _CATALOGUE:
        raise ConfigError(f"dataset={name!r}: unknown data set; valid: {', '.join(names())}")
    return _CATALOGUE[name](options)


def load_arrays(spec: DatasetSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, val_x, val_y) as float32 NCHW images and int labels."""
    if spec.name != "digits":
        raise ValueError(f"{spec.name} is not an in-memory data set")
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.images.astype(np.float32)
    y = digits.target.astype(np.int64)
    if len(x) != DIGITS_TOTAL:
        raise RuntimeError(f"sklearn's digits has {len(x)} images, expected {DIGITS_TOTAL}")
    order = np.random.RandomState(_DIGITS_SPLIT_SEED).permutation(len(x))
    train, val = order[: spec.train_size], order[spec.train_size:]
    # Pixels are 0..16; standardise with training-set statistics only.
    mean, std = x[train].mean(), x[train].std()
    x = ((x - mean) / std)[:, None, :, :]
    return x[train], y[train], x[val], y[val]


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Sample order of one epoch: the same on every worker, a function of (seed, epoch) only."""
    if not shuffle:
        return np.arange(num_samples)
    return np.random.RandomState((seed * 1_000_003 + epoch) % 2**32).permutation(num_samples)


def worker_slice(step: int, global_batch: int, rank: int, workers: int) -> slice:
    """Positions in the epoch order that worker `rank` reads at `step`.

    Step t covers the global batch order[t*G:(t+1)*G]; each worker takes its
    contiguous G/workers share. Sharding the global batch (not the data set)
    makes N workers x B/N see exactly the samples 1 worker x B sees.
    """
    per_worker = global_batch // workers
    start = step * global_batch + rank * per_worker
    return slice(start, start + per_worker)
