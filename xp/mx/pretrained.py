"""Pretrained weights for the MXNet backends: MXNet's model cache, never downloaded.

`pretrained=` is either
  - a model-zoo name, looked up in MXNet's model cache ($MXNET_HOME/models, default
    ~/.mxnet/models) under GluonCV's naming NAME-HASH.params (or NAME.params), or
  - an MXNet checkpoint PREFIX (PREFIX-symbol.json + PREFIX-0000.params, the format of
    MXNet's model zoo), given as a path or as a name in the same cache, or
  - the checkpoint_dir of an xp run of backend=gluon (its latest commit's parameters, which
    are in the zoo's format): fine-tuning from weights xp trained itself.
  - none: no weights (training from scratch; a study's choice beside a path).
  - a model xp logged (models:/NAME@best, runs:/RUN_ID/model): fine-tuned whole, its classifier too.
File names and JSON only: nothing here imports MXNet.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

from xp.errors import ConfigError
from xp.run.plan import ModelSpec
from xp.run.pretrained import PretrainedRequest, PretrainedSpec
from xp.readback.registry import LOGGED, fetch, is_model_uri

SYMBOL, PARAMS = "net-symbol.json", "net-0000.params"  # a logged model's network: MXNet's checkpoint names


def cache_dir() -> Path:
    return Path(os.environ.get("MXNET_HOME") or "~/.mxnet").expanduser() / "models"


def _layers(symbol_file: str) -> list[str]:
    try:
        nodes = json.loads(Path(symbol_file).read_text())["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"pretrained: {symbol_file} is not an MXNet symbol file ({type(e).__name__})") from e
    return [n["name"] for n in nodes if n.get("op") != "null"]


def resolve(request: PretrainedRequest, model: ModelSpec) -> PretrainedSpec:
    """Model-zoo weights or a checkpoint for `model`, checked against it."""
    if is_model_uri(request.name):  # a model xp logged: an MXNet one, fine-tuned whole
        local, described = fetch(request.name, request.tracking_uri)
        if not (local / "artifacts" / SYMBOL).is_file():
            raise ConfigError(f"pretrained={request.name}: a PyTorch model (backend=torch fine-tunes it); "
                              f"backend=gluon, module and horovod fine-tune MXNet models")
        return PretrainedSpec(LOGGED, request.name, str(local / "artifacts" / PARAMS),
                              str(local / "artifacts" / SYMBOL), None, request.freeze_backbone,
                              request.backbone_lr_mult, raw_pixels=False, described=described)
    spec = _find(request.name, request.epoch, request.layer, request.freeze_backbone, request.backbone_lr_mult)
    if spec.source == "commit":  # xp's own weights, of the data they were trained on
        return spec
    from xp.models import zoo_name

    arch = zoo_name(model, "mxnet")  # a zoo's architecture; a registered network's weights carry its name
    if spec.source == "zoo" and spec.name != (arch or model.arch):
        raise ConfigError(f"pretrained={spec.name}: these are weights of {spec.name}, but model={model.name} builds "
                          f"{arch or model.arch}; choose the matching model (or pretrained={arch or model.arch})")
    if spec.source == "checkpoint" and not request.layer:
        raise ConfigError("pretrained_layer=null: a checkpoint is cut at a named layer (e.g. flatten0) "
                          "before the new classifier")
    # a checkpoint and GluonCV's zoo networks were trained on ImageNet's input
    return replace(spec, imagenet_input=spec.source == "checkpoint" or arch is not None)


def _commit(root: Path, freeze: bool, lr_mult: float) -> PretrainedSpec:
    """The latest commit in an xp run's checkpoint_dir, as zoo-format weights (backend=gluon writes them)."""
    from xp.run.checkpoint import latest

    commit = latest(root)
    if commit is None:
        raise ConfigError(f"pretrained={root}: a folder without committed training state (an xp run writes it "
                          "with checkpoint_dir=...)")
    files = {p.name for p in commit.folder.iterdir()}
    if "trainer.states" not in files or "params" not in files:
        wrote = "backend=torch" if "state.pt" in files else "backend=module" if "optimizer.states" in files else "?"
        raise ConfigError(f"pretrained={root}: its commit {commit.folder.name} was written by {wrote}; fine-tuning "
                          "starts from commits of backend=gluon (its parameters are in the model zoo's format)")
    return PretrainedSpec("commit", str(root), str(commit.folder / "params"), None, None, freeze, lr_mult,
                          raw_pixels=False)


def _find(value: str, epoch: int, layer: str | None, freeze: bool, lr_mult: float) -> PretrainedSpec:
    if os.path.isdir(os.path.expanduser(value)):
        return _commit(Path(value).expanduser(), freeze, lr_mult)
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
