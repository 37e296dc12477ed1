"""Your own network and data (issue 57): the example package (examples/xp-example: TinyNet in Gluon and in PyTorch,
the generated Shapes data set, registered through entry points) goes where xp's own networks go."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT, mlflow_runs, run_xp, said
from test_distributed import assert_same_params, distributed, one_process

OWN = ["model=tinynet", "dataset=shapes"]


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xp.check", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_xps_own_networks_and_a_packages_register_in_one_registry():
    from xp import models
    from xp.data import plugins

    eps = models.entry_points(models.GROUP, "model")
    assert {n: eps[n].value for n in ("lenet", "resnet18", "resnet50", "resnet152")} == {
        "lenet": "xp_plugins.zoo:lenet", "resnet18": "xp_plugins.zoo:resnet18", "resnet50": "xp_plugins.zoo:resnet50",
        "resnet152": "xp_plugins.zoo:resnet152"}
    assert eps["tinynet"].value == "xp_example.nets:tinynet" and "shapes" in plugins.names()
    r = check("--list")
    assert r.returncode == 0 and "lenet, resnet152, resnet18, resnet50, tinynet, tinynet_bn" in r.stdout, r.stdout


def test_the_name_in_tables_runs_and_params_is_the_network_that_trains():
    from xp.models import trained_name

    assert trained_name("resnet18", "xp", "resnet18", None) == "resnet18"
    assert trained_name("resnet18", "gluoncv", "mobilenetv2_0.25", None) == "mobilenetv2_0.25"
    assert trained_name("resnet18", "gluoncv", "resnet18_v1", None) == "resnet18"
    assert trained_name("lenet", "xp", "tinynet", None) == "tinynet"  # model=lenet model.arch=tinynet
    assert trained_name("mine", "xp", "mine", "pkg.nets:mine") == "mine"
    assert trained_name("mynet", "xp", "lenet", None) == "mynet"  # a user's own name for a registered network


def test_timm_is_a_zoo_of_backend_torch_by_architecture_with_the_data_sets_channels_and_classes():
    import torch

    from xp.errors import ConfigError
    from xp.pt.models import build_model
    from xp.run.plan import ModelSpec

    net = build_model(ModelSpec("resnet10t", "timm", "resnet10t"), 4, (1, 16, 16))
    assert tuple(net.eval()(torch.zeros(2, 1, 16, 16)).shape) == (2, 4)  # architecture only: nothing downloaded
    with pytest.raises(ConfigError, match="model.arch='resnet10x': not one of timm's architectures; did you mean"):
        build_model(ModelSpec("resnet10x", "timm", "resnet10x"), 4, (1, 16, 16))
    with pytest.raises(ConfigError, match=r"model.zoo=gluoncv: not one of backend=torch's; valid: xp, torchvision, "
                                          r"timm \(gluoncv is MXNet's"):
        build_model(ModelSpec("resnet18", "gluoncv", "resnet18_v1"), 4, (1, 16, 16))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gluon", "module", "horovod", "torch"])
def test_the_examples_network_and_data_train_on_each_backend(tmp_path, store, backend):
    r = run_xp(tmp_path, store, *OWN, f"backend={backend}", "epochs=2")
    assert r.returncode == 0, said(r)
    _, runs = mlflow_runs(store)
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.params["model.name"] == "tinynet"
    assert run.data.tags["xp.dataset"] == "shapes" and run.data.metrics["val_accuracy"] > 0.5  # 4 classes
    assert "| tinynet |" in r.stdout


@pytest.mark.slow
def test_a_gluon_network_renamed_by_its_arch_says_so(tmp_path, store):
    """model=resnet18 model.zoo=gluoncv model.arch=mobilenetv2_0.25 trains a MobileNet: the table, the run's name
    and its params say mobilenetv2_0.25."""
    r = run_xp(tmp_path, store, "model=resnet18", "model.zoo=gluoncv", "model.arch=mobilenetv2_0.25",
               "dataset=synthetic", "dataset.train_size=64", "dataset.val_size=32", "batch=16", "epochs=1")
    assert r.returncode == 0, said(r)
    run = mlflow_runs(store)[1][0]
    assert run.data.params["model.name"] == "mobilenetv2_0.25" and run.data.tags["xp.model"] == "mobilenetv2_0.25"
    assert "| mobilenetv2_0.25 |" in r.stdout and "| resnet18 |" not in r.stdout


PREDICT = """
import json, sys
import mlflow, numpy as np
from xp_example.data import image, transform
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
x = np.stack([transform(image(i, 7)[0]) for i in range(800, 808)])
print(json.dumps([int(k) for k in np.asarray(model.predict(x)).argmax(1)]))
"""


@pytest.mark.slow
def test_its_logged_model_predicts_images_through_the_data_sets_transform_and_fine_tunes(tmp_path, store):
    import cv2

    from xp_example.data import CLASSES, image

    r = run_xp(tmp_path, store, *OWN, "epochs=2")
    assert r.returncode == 0, r.stderr[-3000:]
    run = mlflow_runs(store)[1][0]
    uri = f"runs:/{run.info.run_id}/model"
    files = []
    for i in range(800, 808):  # the validation set's first images, as PNG files
        files.append(tmp_path / f"{i}.png")
        cv2.imwrite(str(files[-1]), image(i, 7)[0][0])
    said = subprocess.run([sys.executable, "-m", "xp.predict", uri, *map(str, files), "--tracking-uri", store],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert said.returncode == 0, said.stderr[-3000:]
    names = [line.split("\t")[1] for line in said.stdout.splitlines()]
    # the same classes as the model gives the data set's own samples: the files went through its transform
    direct = subprocess.run([sys.executable, "-c", PREDICT, store, uri], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert names == [CLASSES[k] for k in eval(direct.stdout.strip().splitlines()[-1])], said.stdout
    tuned = run_xp(tmp_path / "tuned", store, *OWN, f"pretrained={uri}", "epochs=1")
    assert tuned.returncode == 0, tuned.stderr[-3000:]


@pytest.mark.slow
def test_a_study_of_the_example_fills_two_slots(tmp_path, store):
    from test_scheduler import study_env, trials_of

    r = run_xp(tmp_path, store, "-m", "sweep=tiny", *OWN, "epochs=1", "sweep.parallel=2",
               env=study_env(tmp_path, 6), timeout=600)
    assert r.returncode == 0, said(r)
    assert [t.state.name for t in trials_of(tmp_path)] == ["COMPLETE"] * 6
    _, runs = mlflow_runs(store)
    trials = [x for x in runs if "optuna.trial_number" in x.data.tags]
    assert len(trials) == 6 and {x.data.params["model.name"] for x in trials} == {"tinynet"}
    assert {x.data.tags.get("xp.slot") for x in trials} == {"0", "1"}
    parent = next(x for x in runs if x.data.tags.get("xp.sweep") == "true")
    rep = subprocess.run([sys.executable, "-m", "xp.report", "--tracking-uri", store, "--parent", parent.info.run_id,
                          "--out", str(tmp_path / "report")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert (tmp_path / "report" / "report.md").read_text().count("| tinynet |") == 6


@pytest.mark.slow
def test_two_dist_sync_workers_train_the_examples_network_as_one_process(tmp_path, store):
    common = [*OWN, "epochs=1", "lr_schedule=constant"]
    want = one_process("gluon", *common, "batch=32")
    got, _ = distributed(tmp_path, store, "kvstore=dist_sync", *common, "batch=16", "workers=2")
    assert_same_params(got, want)


@pytest.mark.slow
def test_the_check_passes_the_example_and_names_the_batchnorm_that_makes_n_workers_differ():
    ok = check(*OWN)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == "xp.check model=tinynet dataset=shapes backend=gluon", ok.stdout
    assert [ln.split()[:2] for ln in lines[1:]] == [["output", "ok"], ["trains", "ok"], ["export", "ok"],
                                                    ["N", "workers"], ["samples/s", "ok"]], ok.stdout
    assert "(32, 4) for a batch of 32, 4 classes" in ok.stdout and "2 x B/2 = 1 x B for all 6" in ok.stdout
    for backend, layer in (("gluon", "tinynet_batchnorm0 (BatchNorm)"), ("torch", "1 (BatchNorm2d)")):
        bn = check("model=tinynet_bn", "dataset=shapes", f"backend={backend}")
        assert bn.returncode == 1, bn.stdout + bn.stderr
        row = next(ln for ln in bn.stdout.splitlines() if ln.lstrip().startswith("N workers"))
        assert "FAIL" in row and f"from BatchNorm without sync: {layer}" in row, bn.stdout
    torch = check(*OWN, "backend=torch", "model.dropout=0.5")
    assert torch.returncode == 1 and "from dropout: 6 (Dropout)" in torch.stdout, torch.stdout
    bad = check("model=tinynett")
    assert bad.returncode == 2 and bad.stderr.strip() == ("xp: error: model=tinynett: no such model; did you mean "
                                                          "model=tinynet? valid: lenet, resnet152, resnet18, resnet50, "
                                                          "tinynet, tinynet_bn"), bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gluon", "torch"])
def test_the_check_calls_a_slow_learner_slow_and_a_network_that_cannot_learn_a_failure(backend):
    """A user's small network (one 3x3 convolution, ReLU, global pooling, a dense layer: tests/own/smallnets.py)
    learns, slowly at first: a warning, exit 0, not a failure; one whose output layer is zeroed and frozen cannot:
    FAIL, naming what was tried and what the loss did."""
    own = ROOT / "tests" / "own"
    env = dict(os.environ, PYTHONPATH=str(own))

    def run(model):
        return subprocess.run([sys.executable, "-m", "xp.check", "--config-dir", str(own / "conf"), f"model={model}",
                               "dataset=three_bars", f"backend={backend}"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env=env)

    slow = run("slow_conv")
    assert slow.returncode == 0, slow.stdout + slow.stderr
    trains = next(ln for ln in slow.stdout.splitlines() if ln.lstrip().startswith("trains"))
    assert trains.split()[1] in ("ok", "warn") and "learns" in trains and "does not learn" not in trains, trains
    dead = run("dead_output")
    assert dead.returncode == 1, dead.stdout + dead.stderr
    trains = next(ln for ln in dead.stdout.splitlines() if ln.lstrip().startswith("trains"))
    assert trains.split()[1] == "FAIL" and "does not learn: in " in trains, trains  # (steps: as its time allows)
    assert all(f"at lr {lr} loss flat at 1.0986" in trains for lr in ("0.02", "0.2", "0.002")), trains  # ln 3


def test_what_the_check_says_a_loss_did():
    from xp.check import _reached, _saw

    assert _reached([1.0, 0.95, 0.89, 0.5]) == 2 and _reached([1.0, float("nan"), 0.1]) is None
    assert _saw([1.0, 2.0, float("nan")]) == "loss NaN after 2 steps"
    assert _saw([1.0, 1.2, 1.5]) == "loss rising 1.0000 -> 1.5000"
    assert _saw([1.0986, 1.0985]) == "loss flat at 1.0986"
    assert _saw([1.0, 0.95]) == "loss 1.0000 -> 0.9500, not below 0.9x"
