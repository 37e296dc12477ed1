"""xp's own networks, registered in the entry-point group `xp.models` (pyproject.toml) as another package's are
(xp_plugins.zoo).

Each is offered for both frameworks: LeNet is xp's, layer for layer the same in Gluon and PyTorch; the ResNets
(v1, He et al. 2015) are GluonCV's for MXNet and torchvision's for PyTorch.
"""

from __future__ import annotations

from typing import Any, Callable

from xp.plugin import Network, Task


def _mx_lenet(t: Task) -> Any:
    from xp.mx.models import lenet

    return lenet(t.classes, t.dropout)


def _pt_lenet(t: Task) -> Any:
    from xp.pt.models import lenet

    return lenet(t.classes, t.input_shape, t.dropout)


def _fixed_dropout(t: Task) -> None:
    if t.dropout:
        from xp.errors import ConfigError

        raise ConfigError(f"model.dropout={t.dropout:g}: the ResNets' architecture fixes their dropout")


def _gluoncv(arch: str) -> Callable[[Task], Any]:
    def build(t: Task) -> Any:
        from xp.mx.models import gluoncv_net

        _fixed_dropout(t)
        return gluoncv_net(arch, t.classes)
    return build


def _torchvision(name: str) -> Callable[[Task], Any]:
    def build(t: Task) -> Any:
        from xp.pt.models import torchvision_net

        _fixed_dropout(t)
        return torchvision_net(name, t.classes, t.input_shape, f"model={name}")
    return build


def _resnet(depth: int) -> Network:
    return Network(mxnet=_gluoncv(f"resnet{depth}_v1"), torch=_torchvision(f"resnet{depth}"),
                   about=f"ResNet-{depth} v1: GluonCV's (MXNet), torchvision's (PyTorch)",
                   weights={"mxnet": f"resnet{depth}_v1", "torch": f"resnet{depth}"})


lenet = Network(mxnet=_mx_lenet, torch=_pt_lenet, about="LeNet-style CNN (two conv + pool stages, two dense layers)")
resnet18, resnet50, resnet152 = _resnet(18), _resnet(50), _resnet(152)
