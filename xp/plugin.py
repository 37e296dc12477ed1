"""What a package gives xp to train its own network and data: the types its factories take and return.

A network registers a name in the entry-point group `xp.models`; a data set in `xp.datasets`:

    [project.entry-points."xp.models"]
    tinynet = "mypkg.nets:tinynet"          # an xp.plugin.Network
    [project.entry-points."xp.datasets"]
    shapes = "mypkg.data:shapes"            # a function (DataTask) -> xp.plugin.Data

Then `python -m xp model=tinynet dataset=shapes` trains them on any backend their framework has: "mxnet" (gluon,
module, horovod: a Gluon HybridBlock) or "torch" (an nn.Module). xp keeps everything else: sharding by rank,
batching, loader workers, the loop, the fixed global batch, tracking, the model it logs. docs/guides/own-code.md
walks through examples/xp-example, a package that does it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

FRAMEWORKS = ("mxnet", "torch")


@dataclass(frozen=True)
class Task:
    """What a network factory is asked for."""
    classes: int  # outputs (logits) the network ends with
    input_shape: tuple[int, int, int]  # one sample: channels, height, width
    framework: str  # "mxnet" (return a Gluon HybridBlock, parameters not initialised) or "torch" (an nn.Module)
    dropout: float = 0.0  # model.dropout
    options: Mapping[str, Any] = field(default_factory=dict)  # the model config's other keys (model.KEY=VALUE)


class Network:
    """One name's network, for each framework it is offered in: `Network(mxnet=f, torch=g)`, each a function
    (Task) -> that framework's network; a backend asks for the factory of its framework."""

    def __init__(self, about: str = "", weights: Mapping[str, str] | None = None,
                 **factories: Callable[[Task], Any]):
        unknown = sorted(set(factories) - set(FRAMEWORKS))
        if unknown:
            raise TypeError(f"Network(): {', '.join(unknown)}: not a framework; factories are given as "
                            f"{' and '.join(f'{f}=...' for f in FRAMEWORKS)}")
        self.about = about  # one line for listings
        # the architecture's name in each framework's model zoo, where it is one: the name pretrained weights
        # files of it carry (pretrained=resnet50_v1)
        self.weights = dict(weights or {})
        self.factories = {f: factories[f] for f in FRAMEWORKS if factories.get(f) is not None}

    @property
    def frameworks(self) -> tuple[str, ...]:
        return tuple(self.factories)

    def build(self, task: Task) -> Any:
        if task.framework not in self.factories:
            raise LookupError(task.framework)
        return self.factories[task.framework](task)


@dataclass(frozen=True)
class DataTask:
    """What a data set factory is asked for."""
    framework: str  # "mxnet" or "torch": the type of data set it may return (arrays suit both)
    # the dataset config's other keys (dataset.KEY=VALUE): the samples are a function of them, the same in every
    # process of a run (xp orders and shards them by its own seed)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Data:
    """A data set's training and validation samples, and what they are.

    `train` and `val` are each a pair of arrays (x: N x C x H x W float32, y: N integer labels), a torch
    `Dataset` (framework "torch") or a Gluon `Dataset` (framework "mxnet") whose items are (image C x H x W,
    label). Any transform of its own happens in the data set (it runs in xp's loader workers); xp batches,
    shards by rank and orders the samples."""
    train: Any
    val: Any
    classes: int
    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...] = ()  # in label order, for predictions (default: the label numbers)
    # how an image file's pixels (uint8, C x H x W, resized to input_shape) become a sample: a module-level
    # function, recorded with the logged model so that `python -m xp.predict` reads images as the data set does
    transform: Callable[[Any], Any] | None = None
