"""Pretrained weights, as the plan holds them: what was asked for, and the files it resolved to.

`pretrained=` names weights; each backend's package resolves the name to files on disk
(never downloaded from the internet; a model xp logged, models:/NAME@best or runs:/RUN_ID/model, comes from
the MLflow store: xp.tracking.models.fetch): xp.mx.pretrained for MXNet's model zoo and checkpoints,
xp.pt.pretrained for torchvision's weights files (Backend.resolve_pretrained). Training
clusters often have no network: a missing file is one line naming every path tried and
where such a file comes from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PretrainedRequest:
    """The pretrained_* settings, checked, before a backend resolves them."""
    name: str  # pretrained=: a name the backend looks up, or a path
    epoch: int  # pretrained_epoch: a checkpoint's epoch
    layer: str | None  # pretrained_layer: a checkpoint is cut at this layer
    freeze_backbone: bool
    backbone_lr_mult: float
    tracking_uri: str = ""  # the MLflow store a models:/ or runs:/ URI is looked up in


@dataclass(frozen=True)
class PretrainedSpec:
    source: str  # how the backend found them (MXNet: zoo | checkpoint; PyTorch: torchvision)
    name: str  # as given
    params: str  # the weights file
    symbol: str | None  # an MXNet checkpoint's PREFIX-symbol.json
    layer: str | None  # checkpoint: the symbol is cut at this layer's output
    freeze_backbone: bool
    backbone_lr_mult: float
    raw_pixels: bool  # the network normalises its input itself (MXNet zoo ResNets start with BatchNorm)
    # the weights were trained on ImageNet's input (3x224x224, its mean/std, or raw pixels): with
    # pretrained_input=auto, image data sets are fed that way
    imagenet_input: bool = False
    described: dict | None = None  # a model xp logged (source "logged"): its input (xp_input.json)
