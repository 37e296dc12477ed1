"""Pretrained weights for the PyTorch backend: torchvision's weights files, never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

from xp.errors import ConfigError
from xp.run.pretrained import PretrainedRequest, PretrainedSpec
from xp.readback.registry import LOGGED, fetch, flavors, is_model_uri


def torch_cache() -> Path:
    """Where torchvision keeps downloaded weights: $TORCH_HOME/hub/checkpoints (default ~/.cache/torch)."""
    home = os.environ.get("TORCH_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "torch")
    return Path(home).expanduser() / "hub" / "checkpoints"


def resolve(request: PretrainedRequest) -> PretrainedSpec:
    """A torchvision weights file, given as a path or found as NAME-HASH.pth / NAME.pth in torch's cache (what
    torchvision downloads), or a model xp logged (models:/..., runs:/...); one clear line if absent."""
    name, freeze, lr_mult = request.name, request.freeze_backbone, request.backbone_lr_mult
    if is_model_uri(name):  # a model xp logged: a PyTorch one, fine-tuned whole
        local, described = fetch(name, request.tracking_uri)
        if "pytorch" not in flavors(local):
            raise ConfigError(f"pretrained={name}: an MXNet model (backend=gluon, module or horovod fine-tunes it); "
                              "backend=torch fine-tunes PyTorch models")
        return PretrainedSpec(LOGGED, name, str(local), None, None, freeze, lr_mult, raw_pixels=False,
                              described=described)
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
