"""Transfer learning works: pretrain on digits 0-4, fine-tune on 5-9, beat training from scratch.

Both weight formats (a zoo-cache file placed by `python -m xp.weights add`, and an MXNet
checkpoint exported by Gluon), both backends, the loaded backbone equal to what was saved.
"""

import numpy as np
import pytest

from conftest import compose_config, plan_for
from xp.errors import ConfigError
from xp.run.entry_points import Registry
from xp.run.train import fit

# few training images of 5-9 (a 90% hold-out leaves 87) and few steps: where pretrained features
# matter. With plenty of data these easy digits are learnt from scratch in 3 epochs as well.
FINETUNE = ["dataset.classes=[5,6,7,8,9]", "dataset.val_fraction=0.9", "epochs=2", "batch=16", "lr_schedule=constant"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """LeNet trained on digits 0-4, saved as a zoo-cache file and as a checkpoint."""

    from xp.mx.weights import add

    home = tmp_path_factory.mktemp("mxnet_home")
    mp = pytest.MonkeyPatch()
    mp.setenv("MXNET_HOME", str(home))
    plan = plan_for(compose_config("dataset.classes=[0,1,2,3,4]", "epochs=6"), visible_gpus=0)
    backend = Registry().load("gluon")()
    history = fit(plan, backend, [])
    assert history[-1]["val_accuracy"] > 0.95
    raw = home / "lenet-trained.params"
    backend.net.save_parameters(str(raw))
    [zoo_file] = add(str(raw), "lenet", 0)
    backend.net.export(str(home / "digits04"), 0)
    weights = [p.data().asnumpy() for p in backend.net.collect_params().values()]
    yield {"home": home, "zoo_file": zoo_file, "prefix": str(home / "digits04"), "backbone": weights[:-2]}
    mp.undo()


def finetune(backend_name, *overrides):
    plan = plan_for(compose_config(*FINETUNE, *overrides), visible_gpus=0)
    backend = Registry().load(backend_name)()
    backend.setup(plan)
    loaded = [p.data().asnumpy() for p in backend.backbone.collect_params().values()] if backend.backbone else None
    fit_history = fit(plan, _Prepared(backend), [])
    return backend, loaded, fit_history


class _Prepared:
    """fit() calls setup(); this backend is already set up so its loaded weights could be read first."""

    def __init__(self, backend):
        self.b = backend

    def setup(self, plan):
        pass

    def __getattr__(self, name):  # everything else is the backend's
        return getattr(self.b, name)


def weights_sources(p):
    return {"zoo": ["pretrained=lenet"],
            "checkpoint": [f"pretrained={p['prefix']}", "pretrained_layer=lenet_dense0_relu_fwd"]}


@pytest.mark.parametrize("backend", ["gluon", "module"])
@pytest.mark.parametrize("source", ["zoo", "checkpoint"])
def test_finetuning_beats_training_from_scratch(pretrained, monkeypatch, backend, source):
    monkeypatch.setenv("MXNET_HOME", str(pretrained["home"]))
    _, _, scratch = finetune(backend)
    b, loaded, tuned = finetune(backend, *weights_sources(pretrained)[source])
    assert b.plan.pretrained.source == source and b.plan.dataset.num_classes == 5
    assert len(loaded) == len(pretrained["backbone"])
    for got, saved in zip(loaded, pretrained["backbone"]):
        np.testing.assert_array_equal(got, saved)  # the backbone is what was saved, before training
    assert tuned[-1]["val_accuracy"] >= scratch[-1]["val_accuracy"] + 0.15, (tuned[-1], scratch[-1])


@pytest.mark.parametrize("backend", ["gluon", "module"])
def test_frozen_backbone_stays_as_loaded(pretrained, monkeypatch, backend):
    monkeypatch.setenv("MXNET_HOME", str(pretrained["home"]))
    b, loaded, history = finetune(backend, "pretrained=lenet", "freeze_backbone=true", "lr=0.2", "epochs=4")
    after = b.get_params()
    names = list(b.net.collect_params())
    backbone_names = list(b.backbone.collect_params())
    for name, value in zip(backbone_names, loaded):
        np.testing.assert_array_equal(after[name], value)
    head = [n for n in names if n not in backbone_names]
    assert head and all(not np.allclose(after[n], 0) for n in head if n.endswith("weight"))
    assert history[-1]["val_accuracy"] > 0.6  # a linear classifier on 0-4's features; chance is 0.2


def test_backbone_lr_mult_scales_the_backbone_update(pretrained, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(pretrained["home"]))
    moved = {}
    for mult in (1.0, 0.1):
        b, loaded, _ = finetune("gluon", "pretrained=lenet", f"backbone_lr_mult={mult}", "epochs=1", "momentum=0")
        after = b.get_params()
        moved[mult] = sum(float(np.abs(after[n] - v).sum()) for n, v in zip(b.backbone.collect_params(), loaded))
    assert 0.02 < moved[0.1] / moved[1.0] < 0.3


def test_missing_weights_name_every_path_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        plan_for(compose_config("model=resnet50", "pretrained=resnet50_v1"), visible_gpus=0)
    msg = str(e.value)
    for fragment in (f"{tmp_path}/models/resnet50_v1-symbol.json", f"{tmp_path}/models/resnet50_v1-<sha1 prefix>.params",
                     "python -m xp.weights add"):
        assert fragment in msg
    assert "\n" not in msg


def test_checkpoint_errors(pretrained, monkeypatch, tmp_path):
    monkeypatch.setenv("MXNET_HOME", str(pretrained["home"]))
    with pytest.raises(ConfigError, match=r"pretrained_layer=flatten0: no layer of that name in .*digits04-symbol.json"):
        plan_for(compose_config(*FINETUNE, f"pretrained={pretrained['prefix']}"), visible_gpus=0)
    with pytest.raises(ConfigError, match=r"pretrained=lenet: these are weights of lenet, but model=resnet18"):
        plan_for(compose_config(*FINETUNE, "pretrained=lenet", "model=resnet18"), visible_gpus=0)
    with pytest.raises(ConfigError, match=r"num_classes=7: dataset=digits has 5 classes"):
        plan_for(compose_config(*FINETUNE, "num_classes=7"), visible_gpus=0)
    # params that do not match the symbol
    import shutil

    import mxnet as mx

    shutil.copy(f"{pretrained['prefix']}-symbol.json", tmp_path / "bad-symbol.json")
    params = mx.nd.load(f"{pretrained['prefix']}-0000.params")
    del params["arg:lenet_conv1_weight"]
    mx.nd.save(str(tmp_path / "bad-0000.params"), params)
    plan = plan_for(compose_config(*FINETUNE, f"pretrained={tmp_path}/bad", "pretrained_layer=lenet_dense0_relu_fwd"),
                      visible_gpus=0)
    from xp.mx.models import WeightsError

    with pytest.raises(WeightsError, match=r"bad-0000.params: does not match .*bad-symbol.json: no values for lenet_conv1_weight"):
        Registry().load("gluon")().setup(plan)


@pytest.mark.slow
def test_finetune_from_the_command_line_logs_its_source(pretrained, tmp_path, store):
    from conftest import mlflow_runs, run_xp

    proc = run_xp(tmp_path, store, *FINETUNE, "pretrained=lenet", "backend=module",
                  env={"MXNET_HOME": str(pretrained["home"])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = mlflow_runs(store)[1][0]
    assert run.data.params["pretrained"] == "lenet" and run.data.metrics["val_accuracy"] > 0.6
