"""The network in PyTorch: xp's LeNet, or torchvision's network of the same name."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xp.errors import ConfigError
from xp.run.plan import ModelSpec


def lenet(classes: int, image_shape: tuple[int, int, int], dropout: float = 0.0) -> nn.Sequential:
    """The LeNet of xp.mx.models, layer for layer (3x3 convolutions, 2x2 max pooling, He-normal init)."""
    c, h, w = image_shape
    layers: list[nn.Module] = [
        nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 128), nn.ReLU(),
    ]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(128, classes))
    net = nn.Sequential(*layers)
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            # MXNet's Xavier(gaussian, in, magnitude 2): normal with std sqrt(2 / fan_in)
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return net


def build_model(model: ModelSpec, classes: int, image_shape: tuple[int, int, int]) -> nn.Module:
    """The network with `classes` outputs (logits) for images of `image_shape`, freshly initialised."""
    if model.zoo == "xp":
        if model.arch != "lenet":
            raise ConfigError(f"model.arch={model.arch!r}: not in xp's zoo; valid: lenet")
        return lenet(classes, image_shape, model.dropout)
    name = model.options.get("torchvision")  # the model's name in torchvision, from its conf/model file
    if not name:
        raise ConfigError(f"model={model.name}: has no torchvision network for backend=torch; set "
                          "model.torchvision=NAME (a torchvision.models name)")
    import torchvision

    try:
        net = torchvision.models.get_model(name, weights=None, num_classes=classes)
    except ValueError as e:
        raise ConfigError(f"model.torchvision={name!r}: not a torchvision model ({e})") from None
    channels = image_shape[0]
    conv1 = getattr(net, "conv1", None)
    if channels != 3 and isinstance(conv1, nn.Conv2d):  # e.g. 1-channel digits: a stem for that many channels
        net.conv1 = nn.Conv2d(channels, conv1.out_channels, conv1.kernel_size, conv1.stride, conv1.padding,
                              bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    elif channels != 3:
        raise ConfigError(f"model={model.name}: torchvision's {name} takes 3-channel images; "
                          f"dataset images have {channels}")
    return net


def load_pretrained(net: nn.Module, path: Path, freeze_backbone: bool, lr_mult: float) -> list[dict]:
    """Load a torchvision state dict into `net` except its classifier (the data set's own); return the
    optimizer's parameter groups: the backbone (frozen or at lr_mult) and the new classifier."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise ConfigError(f"pretrained: {path} is not a PyTorch weights file ({type(e).__name__})") from None
    head = "fc" if hasattr(net, "fc") else "classifier"
    own = net.state_dict()
    body = {k: v for k, v in state.items() if not k.startswith(head + ".")}
    wrong = [k for k, v in body.items() if k not in own or own[k].shape != v.shape]
    missing = [k for k in own if not k.startswith(head + ".") and k not in body]
    if wrong or missing:
        raise ConfigError(f"pretrained: {path} does not fit this network: "
                          + ", ".join((wrong + missing)[:4]) + (" ..." if len(wrong + missing) > 4 else ""))
    net.load_state_dict(body, strict=False)
    backbone = [p for n, p in net.named_parameters() if not n.startswith(head + ".")]
    for p in backbone:
        p.requires_grad_(not freeze_backbone)
    return [{"params": backbone, "lr_mult": 0.0 if freeze_backbone else lr_mult},
            {"params": [p for n, p in net.named_parameters() if n.startswith(head + ".")], "lr_mult": 1.0}]
