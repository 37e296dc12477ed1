"""Data sets as numbers and arrays, independent of any training framework.

`describe()` answers what the plan needs (classes, image shape, sizes) without
loading pixels; `load_arrays()` returns the images of in-memory data sets as
numpy arrays. Turning them into batches is the job of a framework module
(xp.mx.data for MXNet).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xp.errors import ConfigError

# sklearn.datasets.load_digits() always holds 1,797 images; checked when loading.
DIGITS_TOTAL = 1797
# The split must not move when the run's seed changes, or runs would not be comparable.
_DIGITS_SPLIT_SEED = 20240601


@dataclass(frozen=True)
class FolderListing:
    """An image folder with one sub-folder per class, split into train and val deterministically."""

    root: str
    classes: tuple[str, ...]
    train: tuple[tuple[str, int], ...]  # (path relative to root, label)
    val: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # channels, height, width
    train_size: int
    val_size: int
    options: dict[str, Any] = field(default_factory=dict)
    listing: FolderListing | None = None  # folder data sets: the files and split the sizes came from


def _val_fraction(options: dict[str, Any]) -> float:
    frac = options.get("val_fraction", 0.2)
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
        raise ConfigError(f"dataset.val_fraction={frac!r}: must be a number between 0 and 1 (exclusive)")
    return float(frac)


def _digits(options: dict[str, Any]) -> DatasetSpec:
    frac = _val_fraction(options)
    keep, noise = options.get("classes"), options.get("noise", 0.0)
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not 0 <= noise <= 10:
        raise ConfigError(f"dataset.noise={noise!r}: must be a number from 0 (none) to 10 (pixel standard deviations)")
    if keep is None:
        held = int(round(DIGITS_TOTAL * frac))
        return DatasetSpec("digits", 10, (1, 8, 8), DIGITS_TOTAL - held, held,
                           {"val_fraction": frac, "classes": None, "noise": float(noise)})
    if (not isinstance(keep, (list, tuple)) or len(keep) < 2 or len(set(keep)) != len(keep)
            or not all(isinstance(c, int) and 0 <= c <= 9 for c in keep)):
        raise ConfigError(f"dataset.classes={keep!r}: must list at least 2 different digits from 0 to 9")
    train, val = _digits_split(frac, tuple(keep))
    return DatasetSpec("digits", len(keep), (1, 8, 8), len(train), len(val),
                       {"val_fraction": frac, "classes": list(keep), "noise": float(noise)})


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's (images, targets), read once per process: plans and iterators both need them. Read from the file
    sklearn ships, as its load_digits does, without importing sklearn (1.2 s with pandas and scipy.stats, paid by
    a study's first trial where the framework has not imported them)."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.is_file():
        data = np.loadtxt(path, delimiter=",")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    else:  # another layout of sklearn: its own loader
        from sklearn.datasets import load_digits

        digits = load_digits()
        images, target = digits.images, digits.target
    if len(target) != DIGITS_TOTAL:
        raise RuntimeError(f"sklearn's digits has {len(target)} images, expected {DIGITS_TOTAL}")
    return images, target


def _digits_split(frac: float, keep: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the fixed train/val split, restricted to the digits in `keep`."""
    y = _load_digits()[1]
    order = np.random.RandomState(_DIGITS_SPLIT_SEED).permutation(DIGITS_TOTAL)
    n_val = int(round(DIGITS_TOTAL * frac))
    train, val = order[: DIGITS_TOTAL - n_val], order[DIGITS_TOTAL - n_val:]
    if keep is not None:
        train, val = train[np.isin(y[train], keep)], val[np.isin(y[val], keep)]
    return train, val


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


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def list_folder(root: str, *, val_fraction: float = 0.2, train_per_class: int | None = None,
                exclude: tuple[str, ...] = (), seed: int = 0, key: str = "dataset.root") -> FolderListing:
    """Classes are the sub-folders (sorted), labels their index. The split is per class
    (stratified) and a function of `seed` only: train_per_class images of each class for
    training and the rest for validation, or else a val_fraction share of each class."""
    if not root:
        raise ConfigError(f"{key} is required: the image folder, one sub-folder per class "
                          f"(e.g. dataset=folder {key}=/path/to/images)")
    if not os.path.isdir(root):
        raise ConfigError(f"{key}={root!r}: no such directory; give a folder with one sub-folder per class")
    classes, per_class = [], []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir() or entry.name in exclude or entry.name.startswith("."):
            continue
        files = sorted(os.path.join(dp, f)[len(root.rstrip(os.sep)) + 1:]
                       for dp, _, fs in os.walk(entry.path) for f in fs if f.lower().endswith(IMAGE_EXTENSIONS))
        if files:
            classes.append(entry.name)
            per_class.append(files)
    if not classes:
        raise ConfigError(f"{key}={root!r}: no images ({', '.join(IMAGE_EXTENSIONS)}) in any class sub-folder")
    if len(classes) < 2:
        raise ConfigError(f"{key}={root!r}: only one class ({classes[0]}); a classifier needs at least 2 "
                          "sub-folders with images")
    rng = np.random.RandomState(seed)
    train, val = [], []
    for label, files in enumerate(per_class):
        order = [files[i] for i in rng.permutation(len(files))]
        n_train = (min(train_per_class, len(files)) if train_per_class
                   else len(files) - int(round(len(files) * val_fraction)))
        train += [(f, label) for f in order[:n_train]]
        val += [(f, label) for f in order[n_train:]]
    # Training records are stored shuffled (as im2rec does): RecordIO readers shuffle only
    # within a worker's part, and a class-sorted file would give each part a few classes.
    train = [train[i] for i in rng.permutation(len(train))]
    return FolderListing(root, tuple(classes), tuple(train), tuple(sorted(val)))


def _folder(options: dict[str, Any]) -> DatasetSpec:
    frac = _val_fraction(options)
    tpc = options.get("train_per_class")
    if tpc is not None and (not isinstance(tpc, int) or isinstance(tpc, bool) or tpc < 1):
        raise ConfigError(f"dataset.train_per_class={tpc!r}: must be an integer >= 1, or null")
    root = options.get("root")
    # absolute and with ~ expanded (Hydra passes dataset.root=~/photos through as typed)
    root = os.path.abspath(os.path.expanduser(str(root))) if root else ""
    listing = list_folder(root, val_fraction=frac, train_per_class=tpc,
                          exclude=tuple(options.get("exclude") or ()), seed=int(options.get("split_seed", 0)))
    expect = options.get("expect_classes")
    if expect is not None and len(listing.classes) != expect:
        numbered = {c.split(".", 1)[0] for c in listing.classes}
        missing = [f"{i:03d}" for i in range(1, expect + 1) if f"{i:03d}" not in numbered]
        raise ConfigError(f"dataset.root={listing.root!r}: {len(listing.classes)} classes with images, "
                          f"{options.get('name')} has {expect}"
                          + (f"; missing or empty: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}"
                             if missing else ""))
    if not listing.val:
        raise ConfigError(f"dataset.root={listing.root!r}: the split leaves no validation images; "
                          "lower dataset.train_per_class or raise dataset.val_fraction")
    opts = _image_options(options)
    return DatasetSpec(str(options.get("name", "folder")), len(listing.classes), opts["image_shape"],
                       len(listing.train), len(listing.val), {**options, **opts}, listing)


def count_lines(path: str) -> int:
    """Non-empty lines of a file (an .idx file's records)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _rec(options: dict[str, Any]) -> DatasetSpec:
    """Prepared RecordIO files: sizes from the .idx files, class count from the config,
    checked against the labels of the .lst files where they lie beside the .rec."""
    sizes = {}
    for part in ("train", "val"):
        rec = options.get(f"{part}_rec")
        if rec is None:
            raise ConfigError(f"dataset.{part}_rec is required: the {part} .rec file, its .idx beside it "
                              f"(e.g. dataset.{part}_rec=/data/{part}.rec)")
        if not isinstance(rec, str) or not rec.endswith(".rec"):
            raise ConfigError(f"dataset.{part}_rec={rec!r}: must be the path of a .rec file")
        for path in (rec, rec[:-4] + ".idx"):
            if not os.path.isfile(path):
                raise ConfigError(f"dataset.{part}_rec: {path}: no such file (make .rec/.idx files with "
                                  "python -m xp.prepare IMAGE_FOLDER OUT_PREFIX)")
            if not os.access(path, os.R_OK):
                raise ConfigError(f"dataset.{part}_rec: {path}: not readable")
        sizes[part] = count_lines(rec[:-4] + ".idx")
        if sizes[part] == 0:
            raise ConfigError(f"dataset.{part}_rec: {rec[:-4]}.idx lists no records")
    classes = options.get("num_classes")
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 2:
        raise ConfigError(f"dataset.num_classes={classes!r}: must be an integer >= 2")
    for part in ("train", "val"):
        lst = options[f"{part}_rec"][:-4] + ".lst"
        if os.path.isfile(lst):
            with open(lst) as f:
                top = max(int(float(line.split("\t")[1])) for line in f if line.strip())
            if top >= classes:
                raise ConfigError(f"dataset.num_classes={classes}: {lst} has label {top}; "
                                  f"the data has at least {top + 1} classes")
    opts = _image_options(options)
    return DatasetSpec(str(options.get("name", "rec")), classes, opts["image_shape"], sizes["train"], sizes["val"],
                       {**options, **opts})


def _image_options(options: dict[str, Any]) -> dict[str, Any]:
    shape = options.get("image_shape")
    if (not isinstance(shape, (list, tuple)) or len(shape) != 3 or shape[0] not in (1, 3)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)):
        raise ConfigError(f"dataset.image_shape={shape!r}: must be [channels (1 or 3), height, width]")
    for key in ("mean", "std"):
        v = options.get(key)
        if not isinstance(v, (list, tuple)) or len(v) != 3 or not all(isinstance(x, (int, float)) for x in v):
            raise ConfigError(f"dataset.{key}={v!r}: must be three numbers (R, G, B) on the 0-255 scale")
        if key == "std" and min(v) <= 0:
            raise ConfigError(f"dataset.std={v!r}: must be positive")
    decode = options.get("decode", "cpu")
    if decode not in ("cpu", "gpu"):
        raise ConfigError(f"dataset.decode={decode!r}: must be cpu (the decode workers) or gpu (on the GPUs, by a "
                          "backend that decodes there)")
    return {"image_shape": tuple(shape)}


def _digits_jpeg(options: dict[str, Any]) -> DatasetSpec:
    """The digits as large JPEGs (xp.data.generated), made on first use, then read as an image folder."""
    from xp.data.generated import digits_jpeg

    size, quality = options.get("size", 256), options.get("quality", 90)
    if not isinstance(size, int) or isinstance(size, bool) or not 16 <= size <= 2048:
        raise ConfigError(f"dataset.size={size!r}: must be an integer from 16 to 2048 (pixels)")
    if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100:
        raise ConfigError(f"dataset.quality={quality!r}: must be an integer from 1 to 100")
    cache = Path(options.get("cache_dir") or os.environ.get("XP_CACHE_DIR") or "~/.cache/xp").expanduser()
    return _folder({**options, "kind": "folder", "root": str(digits_jpeg(cache / "images", size, quality))})


_CATALOGUE = {"digits": _digits, "synthetic": _synthetic, "folder": _folder, "rec": _rec, "digits_jpeg": _digits_jpeg}


def builtin() -> list[str]:
    return sorted(_CATALOGUE)


def is_plugin(spec: DatasetSpec) -> bool:
    """A data set of a package's (xp.datasets), or of a config file's factory."""
    return bool(spec.options.get("factory")) or spec.options.get("kind", spec.name) not in _CATALOGUE


def held_in_memory(spec: DatasetSpec) -> bool:
    """Its samples are arrays in memory (digits, synthetic data): reading it decodes nothing (what test_io times is
    slicing). Files (RecordIO, an image folder) and a registered data set's loader workers read and decode."""
    return spec.options.get("kind", spec.name) not in ("rec", "folder") and not is_plugin(spec)


def describe(name: str, options: dict[str, Any], backend: Any = None) -> DatasetSpec:
    """The spec of a data set; `options.kind` picks the reader (defaults to the name): xp's own, or a registered
    one's (xp.datasets), loaded for the backend's framework (`backend`: its class) to count it."""
    kind = options.get("kind", name)
    if kind in _CATALOGUE and not options.get("factory"):
        return _CATALOGUE[kind]({"name": name, **options})
    from xp.data import plugins

    if backend is None:
        raise ConfigError(f"dataset={name}: a registered data set is read by a backend; name one (backend=NAME)")
    data = plugins.load(name, options, backend, builtin())
    return DatasetSpec(name, data.classes, data.input_shape, plugins.size(data, "train"), plugins.size(data, "val"),
                       dict(options))


def load_arrays(spec: DatasetSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, val_x, val_y) as float32 NCHW images and int labels."""
    if spec.name != "digits":
        raise ValueError(f"{spec.name} is not an in-memory data set")
    images, target = _load_digits()
    x = images.astype(np.float32)
    y = target.astype(np.int64)
    keep = spec.options.get("classes")
    train, val = _digits_split(spec.options["val_fraction"], tuple(keep) if keep else None)
    if keep:
        # kept digits relabelled 0..n-1 in ascending order
        y = np.array([sorted(keep).index(d) if d in keep else -1 for d in target], dtype=np.int64)
    mean, std = digits_standardisation(spec, x[train])
    x = ((x - mean) / std)[:, None, :, :]
    if spec.options.get("noise"):  # the same noise on an image in every epoch, run and trial (a fixed seed)
        noise = np.random.RandomState(_DIGITS_SPLIT_SEED + 1).normal(0.0, spec.options["noise"], x.shape)
        x = x + noise.astype(x.dtype)
    return x[train], y[train], x[val], y[val]


def digits_standardisation(spec: DatasetSpec, train_x: np.ndarray | None = None) -> tuple[float, float]:
    """(mean, std) the digits' pixels (0..16) are standardised with: the training set's statistics only."""
    if train_x is None:
        images, _ = _load_digits()
        keep = spec.options.get("classes")
        train_x = images[_digits_split(spec.options["val_fraction"], tuple(keep) if keep else None)[0]]
    train_x = train_x.astype(np.float32)
    return float(train_x.mean()), float(train_x.std())


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


def shard_positions(steps: int, global_batch: int, rank: int, workers: int) -> np.ndarray:
    """Positions in the epoch order that worker `rank` reads in `steps` steps, step by step (worker_slice of
    each step, concatenated): gathered once an epoch, a step's batch is a slice of them."""
    per_worker = global_batch // workers
    first = worker_slice(0, global_batch, rank, workers).start
    return (np.arange(steps)[:, None] * global_batch + first + np.arange(per_worker)).ravel()
