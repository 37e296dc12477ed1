"""Networks by name: the entry-point group `xp.models` (types in xp.plugin).

xp's own networks (lenet, resnet18/50/152: plugins/zoo.py) register there as any package's do. A model config
picks one: `model.zoo: xp` (the default) and `model.arch: NAME`, the registered name; a config file in the user's
own config directory may instead name a factory by import path (`model.factory: mypkg.nets:tinynet`), never the
command line. The other zoos take any of their architectures by model.arch: gluoncv (the MXNet backends),
torchvision and timm (backend=torch; architectures only, no weights are downloaded).

Nothing here imports a framework: a network is built by the backend (xp.mx.models.build_net,
xp.pt.models.build_model), which asks `offered()` for the factory and `built()` to check what came back.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import traceback
from importlib import metadata
from typing import Any

from xp.errors import ConfigError, one_line
from xp.plugin import FRAMEWORKS, Network, Task

GROUP = "xp.models"


_found: dict[tuple[str, tuple[str, ...]], list[metadata.EntryPoint]] = {}


def _installed(group: str) -> list[metadata.EntryPoint]:
    """The entry points of `group` on today's sys.path, scanned once per path (a scan reads every installed
    distribution's metadata: ~10 ms, which a study's worker would pay per trial)."""
    key = (group, tuple(sys.path))
    if key not in _found:
        _found[key] = list(metadata.entry_points(group=group))
    return _found[key]


def entry_points(group: str, kind: str) -> dict[str, metadata.EntryPoint]:
    """The group's entry points by name; the same name registered twice to different objects is one line."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in _installed(group):
        seen = found.get(ep.name)
        if seen is not None and seen.value != ep.value:
            raise ConfigError(f"{kind} {ep.name!r} is registered twice in {group}: {seen.value} and {ep.value}; "
                              "uninstall one of the packages")
        found[ep.name] = ep
    return found


def names() -> list[str]:
    return sorted(entry_points(GROUP, "model"))


def where_it_failed(e: BaseException) -> str:
    """The user's own error, one line: its last line and the file and line that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {one_line(e)[:300]}{at}"


def unknown(kind: str, name: str, known: list[str], group: str) -> ConfigError:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return ConfigError(f"{kind}={name}: no installed package registers it in {group}"
                       + (f"; did you mean {kind}={close[0]}?" if close else "")
                       + f" (registered: {', '.join(known) or 'none'})")


def imported(path: str, where: str) -> Any:
    """The object at `module:attribute` (a config file's factory)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"{where}: {path!r} is not an import path MODULE:ATTRIBUTE (mypkg.nets:tinynet)")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # the user's code: any error of theirs, said in one line
        raise ConfigError(f"{where}: {path} failed to import: {where_it_failed(e)}") from None
    return obj


def _as_network(obj: Any, where: str) -> Network:
    if isinstance(obj, Network):
        return obj
    if callable(obj):  # one function for every framework: it reads task.framework
        return Network(**{f: obj for f in FRAMEWORKS})
    raise ConfigError(f"{where}: is a {type(obj).__name__}, not an xp.plugin.Network or a function (Task) -> network")


def network(model: Any) -> Network:
    """The registered (or config file's) network a model config with model.zoo=xp names."""
    if model.options.get("factory"):
        path = str(model.options["factory"])
        return _as_network(imported(path, f"model.factory={path}"), f"model.factory={path}")
    eps = entry_points(GROUP, "model")
    ep = eps.get(model.arch)
    if ep is None:
        raise unknown("model" if model.arch == model.name else "model.arch", model.arch, sorted(eps), GROUP)
    try:
        obj = ep.load()
    except Exception as e:  # the user's package: its import error, in one line
        raise ConfigError(f"model={model.arch}: {ep.value} failed to import: {where_it_failed(e)}") from None
    return _as_network(obj, f"model={model.arch} ({ep.value})")


def offered(model: Any, framework: str, backend: str) -> Network:
    """The network, checked to be offered for `framework`."""
    net = network(model)
    if framework not in net.frameworks:
        backends = entry_points("xp.backends", "backend")
        others = sorted(n for n, ep in backends.items() if getattr(ep.load(), "framework", "") in net.frameworks)
        raise ConfigError(f"model={model.name}: offered for {', '.join(net.frameworks)} only, not for "
                          f"backend={backend}; use backend={' or '.join(others) or '?'}")
    return net


def task(model: Any, framework: str, classes: int, input_shape: tuple[int, int, int]) -> Task:
    extra = {k: v for k, v in model.options.items() if k != "factory"}
    c, h, w = input_shape
    return Task(classes, (c, h, w), framework, model.dropout, extra)


def call(net: Network, t: Task, model: Any) -> Any:
    """The factory's network; its own errors in one line."""
    try:
        return net.build(t)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"model={model.name}: its {t.framework} factory failed: {where_it_failed(e)}") from None


def built(obj: Any, wanted: type, described: str, model: Any, framework: str, backend: str) -> Any:
    """The factory's result, if it is the framework's network (`wanted`, `described` in words)."""
    if not isinstance(obj, wanted):
        raise ConfigError(f"model={model.name}: its {framework} factory returned {type(obj).__module__}."
                          f"{type(obj).__qualname__}; backend={backend} trains {described}")
    return obj


def zoo_name(model: Any, framework: str) -> str | None:
    """The architecture's name in `framework`'s model zoo (GluonCV's, torchvision's, timm's), which pretrained
    weights files carry; None for a network of no zoo (LeNet, a package's own). A zoo other than xp's registry is
    the backend's own (its check says so)."""
    if model.zoo != "xp":
        return model.arch
    if model.options.get("factory"):
        return None
    return network(model).weights.get(framework)


def own(model: Any) -> bool:
    """A network of xp's own zoo (plugins/zoo.py) or of a model zoo: known to build and fit any task; a
    package's is probed first."""
    if model.zoo != "xp" or model.options.get("factory"):
        return model.zoo != "xp"
    ep = entry_points(GROUP, "model").get(model.arch)
    return ep is not None and ep.value.startswith("xp_plugins.zoo:")


def trained_name(name: str, zoo: str, arch: str, factory: str | None) -> str:
    """The network that trains, as tables, run names and params call it: the config's name, unless that names
    another network than the one model.arch chose (model=resnet18 model.zoo=gluoncv model.arch=mobilenetv2_0.25
    trains a MobileNet, and says so; a config file of the user's, mynet with arch lenet, keeps its name)."""
    if factory or arch == name:
        return name
    if zoo == "xp":
        return arch if name in entry_points(GROUP, "model") else name
    return name if arch == f"{name}_v1" else arch
