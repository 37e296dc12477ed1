"""The network in PyTorch: a registered network's (xp.models: xp's LeNet and ResNets, a package's own), or an
architecture of torchvision's or timm's."""

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


ZOOS = ("xp", "torchvision", "timm")  # the registered networks (xp.models), torchvision's, timm's


def torchvision_net(name: str, classes: int, image_shape: tuple[int, int, int], where: str) -> nn.Module:
    """torchvision's network `name` with `classes` outputs, no weights; a first convolution for the images'
    channels where they are not 3."""
    import torchvision

    try:
        net = torchvision.models.get_model(name, weights=None, num_classes=classes)
    except ValueError as e:
        raise ConfigError(f"{where}: not a torchvision model ({e})") from None
    channels = image_shape[0]
    conv1 = getattr(net, "conv1", None)
    if channels != 3 and isinstance(conv1, nn.Conv2d):  # e.g. 1-channel digits: a stem for that many channels
        net.conv1 = nn.Conv2d(channels, conv1.out_channels, conv1.kernel_size, conv1.stride, conv1.padding,
                              bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    elif channels != 3:
        raise ConfigError(f"{where}: torchvision's {name} takes 3-channel images; dataset images have {channels}")
    return net


def timm_net(arch: str, classes: int, image_shape: tuple[int, int, int]) -> nn.Module:
    """timm's architecture `arch` (timm.create_model, no weights) with `classes` outputs and the images' channels."""
    try:
        import timm
    except ImportError:
        raise ConfigError("model.zoo=timm: timm is not installed (pip install timm)") from None
    if not timm.is_model(arch):
        import difflib

        close = difflib.get_close_matches(arch, timm.list_models(), n=1)
        raise ConfigError(f"model.arch={arch!r}: not one of timm's architectures"
                          + (f"; did you mean {close[0]}?" if close else "") + " (timm.list_models() lists them)")
    return timm.create_model(arch, pretrained=False, num_classes=classes, in_chans=image_shape[0])


def build_model(model: ModelSpec, classes: int, image_shape: tuple[int, int, int]) -> nn.Module:
    """The network with `classes` outputs (logits) for images of `image_shape`, freshly initialised: the
    registered network's PyTorch factory (xp.models), or torchvision's or timm's architecture model.arch."""
    from xp import models

    if model.zoo not in ZOOS:
        raise ConfigError(f"model.zoo={model.zoo}: not one of backend=torch's; valid: {', '.join(ZOOS)}"
                          + (" (gluoncv is MXNet's: backend=gluon, module or horovod)" if model.zoo == "gluoncv" else ""))
    if model.zoo == "torchvision":
        return torchvision_net(model.arch, classes, image_shape, f"model.arch={model.arch}")
    if model.zoo == "timm":
        return timm_net(model.arch, classes, image_shape)
    net = models.offered(model, "torch", "torch")
    return models.built(models.call(net, models.task(model, "torch", classes, image_shape), model), nn.Module,
                        "a torch.nn.Module", model, "torch", "torch")


def probe(net: nn.Module, model: ModelSpec, classes: int, image_shape: tuple[int, int, int]) -> None:
    """One batch of 2 zero images through the network (evaluation mode, no gradients): it must take the input
    and give (2, classes)."""
    from xp.models import where_it_failed

    was = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(torch.zeros(2, *image_shape))
    except Exception as e:
        raise ConfigError(f"model={model.name}: refuses the data set's input (2, {', '.join(map(str, image_shape))}): "
                          f"{where_it_failed(e)}") from None
    finally:
        net.train(was)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model={model.name}: gives {got} for 2 images; the data set has {classes} classes, so "
                          f"(2, {classes}) was expected")


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
