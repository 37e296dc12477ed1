"""Data sets by name: the entry-point group `xp.datasets` (types in xp.plugin).

A factory (DataTask) -> xp.plugin.Data gives the training and validation samples in its framework's own type
(its Dataset class, or arrays) with the classes and the input shape. xp keeps the rest, as for its
own data sets: the epoch's order from (seed, epoch), each rank's share of the global batch, batching, the loader's
workers (data_nthreads), normalisation (dataset.mean/std, when the config gives them), the loop.

A data set is loaded once per process and checked as it is: samples in both parts, integer labels in
[0, classes) (all of them for arrays; the first CHECKED of a Dataset, and each batch as it is read).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Sequence

import numpy as np

from xp.errors import ConfigError
from xp.models import entry_points, imported, unknown, where_it_failed
from xp.plugin import Data, DataTask

GROUP = "xp.datasets"
CHECKED = 2048  # a Dataset's samples whose labels are read when it is loaded
OWN_KEYS = ("name", "kind", "factory")  # keys of the config that xp reads, not the factory

_loaded: dict[str, Data] = {}


def names() -> list[str]:
    return sorted(entry_points(GROUP, "dataset"))


def _factory(name: str, options: dict[str, Any], builtin: list[str]) -> Any:
    if options.get("factory"):
        path = str(options["factory"])
        return imported(path, f"dataset.factory={path}")
    eps = entry_points(GROUP, "dataset")
    kind = str(options.get("kind") or name)
    ep = eps.get(kind)
    if ep is None:
        raise unknown("dataset", kind, sorted({*eps, *builtin}), GROUP)
    try:
        return ep.load()
    except Exception as e:  # the user's package: its import error in one line
        raise ConfigError(f"dataset={kind}: {ep.value} failed to import: {where_it_failed(e)}") from None


def load(name: str, options: dict[str, Any], backend: Any, builtin: Sequence[str] = ()) -> Data:
    """The data set, loaded for the backend's framework (`backend`: its class) once per process, and checked
    (`builtin`: xp's own data sets' names, for the line that says a name is unknown)."""
    key = json.dumps([name, options, backend.framework], sort_keys=True, default=str)
    if key not in _loaded:
        factory = _factory(name, options, list(builtin))
        task = DataTask(backend.framework, {k: v for k, v in options.items() if k not in OWN_KEYS})
        try:
            data = factory(task)
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"dataset={name}: its factory failed: {where_it_failed(e)}") from None
        _loaded[key] = checked(data, name, backend)
    return _loaded[key]


def _kind(part: Any, backend: Any) -> str:
    """arrays or dataset: what a part of the data is; a ConfigError if it is neither arrays nor the backend's
    framework's Dataset."""
    if isinstance(part, (tuple, list)) and len(part) == 2 and all(hasattr(a, "shape") for a in part):
        return "arrays"
    wanted, described = backend.dataset_type()
    if isinstance(part, wanted):
        return "dataset"
    raise ConfigError(f"a {type(part).__module__}.{type(part).__qualname__}, where backend={backend.name} reads "
                      f"{described} or a pair of arrays (x, y)")


def labels(part: Any, kind: str, limit: int | None = None) -> np.ndarray:
    if kind == "arrays":
        return np.asarray(part[1])
    n = len(part) if limit is None else min(len(part), limit)
    return np.asarray([_number(part[i][1]) for i in range(n)])


def _number(v: Any) -> Any:
    """A label as a Python number, from an int, a NumPy value, an NDArray or a tensor."""
    for convert in ("asnumpy", "numpy"):
        if hasattr(v, convert):
            v = getattr(v, convert)()
    return np.asarray(v).reshape(-1)[0].item()


def checked(data: Any, name: str, backend: Any) -> Data:
    where = f"dataset={name}"
    if not isinstance(data, Data):
        raise ConfigError(f"{where}: its factory returned a {type(data).__name__}, not an xp.plugin.Data")
    shape = tuple(data.input_shape) if isinstance(data.input_shape, (tuple, list)) else ()
    if len(shape) != 3 or not all(isinstance(v, int) and v > 0 for v in shape):
        raise ConfigError(f"{where}: input_shape={data.input_shape!r}: three positive integers (channels, height, "
                          "width)")
    if not isinstance(data.classes, int) or data.classes < 2:
        raise ConfigError(f"{where}: classes={data.classes!r}: an integer >= 2")
    for part_name in ("train", "val"):
        part = getattr(data, part_name)
        try:
            kind = _kind(part, backend)
        except ConfigError as e:
            raise ConfigError(f"{where}: its {part_name} part is {e}") from None
        size = len(part[0]) if kind == "arrays" else len(part)
        if size == 0:
            raise ConfigError(f"{where}: its {part_name} part has no samples")
        if kind == "arrays" and (len(part[1]) != size or tuple(np.shape(part[0])[1:]) != shape):
            raise ConfigError(f"{where}: its {part_name} arrays are {np.shape(part[0])} and {np.shape(part[1])}: "
                              f"x must be (N, {', '.join(map(str, shape))}) and y (N,)")
        try:
            found = labels(part, kind, None if kind == "arrays" else CHECKED)
        except Exception as e:
            raise ConfigError(f"{where}: reading its {part_name} samples failed: {where_it_failed(e)}") from None
        in_range(found, data.classes, f"{where}: its {part_name} part")
    names = tuple(str(n) for n in data.class_names)
    if names and len(names) != data.classes:
        raise ConfigError(f"{where}: {len(names)} class_names for {data.classes} classes")
    if data.transform is not None and not callable(data.transform):
        raise ConfigError(f"{where}: transform={data.transform!r} is not a function")
    return Data(data.train, data.val, data.classes, shape, names, data.transform)


def in_range(y: np.ndarray, classes: int, where: str) -> None:
    if y.size and (not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0)):
        raise ConfigError(f"{where}: labels must be integers (class numbers); found {y[np.mod(y, 1) != 0][0]!r}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        bad = y[(y < 0) | (y >= classes)][0]
        raise ConfigError(f"{where}: label {int(bad)} is out of range for {classes} classes (0 to {classes - 1})")


def size(data: Data, part: str) -> int:
    p = getattr(data, part)
    return len(p[0]) if isinstance(p, (tuple, list)) else len(p)


class Part(NamedTuple):
    """One part of a registered data set as a backend reads it: arrays (x normalised, y) or a Dataset (y None)."""
    samples: Any
    labels: np.ndarray | None
    train: bool
    where: str


def parts(spec: Any, backend: Any) -> tuple[Data, Any, tuple[Part, Part]]:
    """The data set of `spec` for the backend, its normalisation ((1, C, 1, 1) mean and std, or None), and its
    (train, val) parts: arrays normalised here, a Dataset as it is (its batches are normalised as they are read)."""
    data = load(spec.name, spec.options, backend)
    norm = normalisation(spec.options, spec.image_shape[0])
    made = []
    for part, train in ((data.train, True), (data.val, False)):
        where = f"dataset={spec.name}: its {'train' if train else 'val'} part"
        if isinstance(part, (tuple, list)):
            x = np.asarray(part[0], np.float32)
            made.append(Part((x - norm[0]) / norm[1] if norm is not None else x, np.asarray(part[1]), train, where))
        else:
            made.append(Part(part, None, train, where))
    return data, norm, (made[0], made[1])


def normalisation(options: dict[str, Any], channels: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) per channel, shaped (1, C, 1, 1), when the config gives dataset.mean and dataset.std."""
    mean, std = options.get("mean"), options.get("std")
    if mean is None or std is None:
        return None
    m, s = np.asarray(mean, np.float32).reshape(-1), np.asarray(std, np.float32).reshape(-1)
    if m.size != channels or s.size != channels or np.any(s <= 0):
        raise ConfigError(f"dataset.mean={list(mean)} dataset.std={list(std)}: one value per channel ({channels}), "
                          "std > 0")
    return m.reshape(1, -1, 1, 1), s.reshape(1, -1, 1, 1)


def offer_options() -> None:
    """Offer every registered network and data set without a config file of xp's as an option of the config
    groups model and dataset (Hydra's ConfigStore), so model=NAME and dataset=NAME compose for a package's.
    Nothing of the packages is imported: their names are their entry points'."""
    from hydra.core.config_store import ConfigStore

    from xp import models, shipped

    store, conf = ConfigStore.instance(), shipped("conf")
    for name in models.names():
        if not (conf / "model" / f"{name}.yaml").exists():
            store.store(group="model", name=name,
                        node={"name": name, "zoo": "xp", "arch": name, "dropout": 0.0, "log": "best"})
    for name in entry_points(GROUP, "dataset"):
        if not (conf / "dataset" / f"{name}.yaml").exists():
            store.store(group="dataset", name=name, node={"name": name})
