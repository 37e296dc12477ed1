"""Where pretrained weights come from: resolved to files on disk, never downloaded.

`pretrained=` is either
  - a model-zoo name, looked up in MXNet's model cache ($MXNET_HOME/models, default
    ~/.mxnet/models) under GluonCV's naming NAME-HASH.params (or NAME.params), or
  - an MXNet checkpoint PREFIX (PREFIX-symbol.json + PREFIX-0000.params, the format of
    MXNet's model zoo), given as a path or as a name in the same cache.
With backend=torch, `pretrained=` is a torchvision weights file (a .pth path, or a name found
in $TORCH_HOME/hub/checkpoints). Training clusters often have no network: a missing file is one line naming every path
tried and where such a file comes from. Framework-agnostic: file names and JSON only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from xp.errors import ConfigError


@dataclass(frozen=True)
class PretrainedSpec:
    source: str  # zoo | checkpoint (MXNet) | torchvision (a .pth state dict)
    name: str  # as given
    params: str  # the .params file
    symbol: str | None  # checkpoint: PREFIX-symbol.json
    layer: str | None  # checkpoint: the symbol is cut at this layer's output
    freeze_backbone: bool
    backbone_lr_mult: float
    raw_pixels: bool  # the network normalises its input itself (MXNet zoo ResNets start with BatchNorm)


def cache_dir() -> Path:
    return Path(os.environ.get("MXNET_HOME") or "~/.mxnet").expanduser() / "models"


def torch_cache() -> Path:
    """Where torchvision keeps downloaded weights: $TORCH_HOME/hub/checkpoints (default ~/.cache/torch)."""
    home = os.environ.get("TORCH_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "torch")
    return Path(home).expanduser() / "hub" / "checkpoints"


def resolve_torchvision(name: str, freeze: bool, lr_mult: float) -> PretrainedSpec:
    """backend=torch: a torchvision weights file, given as a path or found as NAME-HASH.pth / NAME.pth in
    torch's cache (what torchvision downloads); one clear line naming the paths tried if absent."""
    if os.sep in name or name.endswith((".pth", ".pt")):
        path = Path(name).expanduser()
        if path.is_file():
            return PretrainedSpec("torchvision", name, str(path), None, None, freeze, lr_mult, raw_pixels=False)
        raise ConfigError(f"pretrained={name}: weights not found; tried {path}")
    cache = torch_cache()
    found = sorted(cache.glob(f"{name}-*.pth"))
    plain = cache / f"{name}.pth"
    if found or plain.is_file():
        return PretrainedSpec("torchvision", name, str(found[-1] if found else plain), None, None, freeze, lr_mult,
                              raw_pixels=False)
    raise ConfigError(f"pretrained={name}: weights not found; tried {cache / (name + '-<hash>.pth')}, {plain}. "
                      f"torchvision's weights are NAME-HASH.pth files (e.g. resnet50-0676ba61.pth): download one "
                      f"where there is network and copy it to {cache} (or give pretrained=/path/to/file.pth)")


def _layers(symbol_file: str) -> list[str]:
    try:
        nodes = json.loads(Path(symbol_file).read_text())["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"pretrained: {symbol_file} is not an MXNet symbol file ({type(e).__name__})") from e
    return [n["name"] for n in nodes if n.get("op") != "null"]


def resolve(value: str, epoch: int, layer: str | None, freeze: bool, lr_mult: float) -> PretrainedSpec:
    cache = cache_dir()
    tried: list[str] = []
    is_path = os.sep in value or value.startswith(".")
    prefixes = [os.path.expanduser(value)] if is_path else [str(cache / value)]
    for prefix in prefixes:
        symbol, params = f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"
        tried += [symbol, params]
        have = os.path.isfile(symbol), os.path.isfile(params)
        if all(have):
            layers = _layers(symbol)
            if layer is not None and layer.removesuffix("_output") not in layers:
                raise ConfigError(f"pretrained_layer={layer}: no layer of that name in {symbol}; "
                                  f"its last layers: {', '.join(layers[-6:])}")
            return PretrainedSpec("checkpoint", value, params, symbol, layer and layer.removesuffix("_output"),
                                  freeze, lr_mult,
                                  raw_pixels="bn_data" in layers)
        if any(have):
            missing = params if have[0] else symbol
            raise ConfigError(f"pretrained={value}: {missing} is missing (a checkpoint needs both "
                              f"PREFIX-symbol.json and PREFIX-{epoch:04d}.params)")
    if not is_path:
        # GluonCV's cache naming: NAME-<first 8 hex digits of the file's sha1>.params
        found = sorted(p for p in cache.glob(f"{value}-*.params") if re.fullmatch(rf"{re.escape(value)}-[0-9a-f]{{8}}\.params", p.name))
        tried.append(str(cache / f"{value}-<sha1 prefix>.params"))
        plain = cache / f"{value}.params"
        tried.append(str(plain))
        if found or plain.is_file():
            return PretrainedSpec("zoo", value, str(found[-1] if found else plain), None, None, freeze, lr_mult,
                                  raw_pixels=False)
    raise ConfigError(
        f"pretrained={value}: weights not found; tried {', '.join(tried)}. Model-zoo weights are GluonCV's "
        f"NAME-HASH.params files; checkpoints are MXNet model-zoo PREFIX-symbol.json + PREFIX-{epoch:04d}.params. "
        f"Download one where there is network and put it in {cache} with: python -m xp.weights add FILE_OR_PREFIX")
