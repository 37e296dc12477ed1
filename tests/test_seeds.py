"""The seeds' reference commands compose valid plans (and say clearly when GPUs are missing)."""

import pytest

from conftest import compose_config, plan_for, run_xp
from xp.errors import ConfigError


@pytest.fixture(scope="module")
def caltech(tmp_path_factory):
    """The shape of 256_ObjectCategories: 001.x ... 256.x and 257.clutter, 80 (empty) images each."""
    root = tmp_path_factory.mktemp("caltech") / "256_ObjectCategories"
    for i in range(1, 258):
        d = root / (f"{i:03d}.class{i}" if i < 257 else "257.clutter")
        d.mkdir(parents=True)
        for j in range(80):
            (d / f"{i:03d}_{j:04d}.jpg").touch()
    return root


@pytest.fixture(scope="module")
def mxnet_home(tmp_path_factory):
    """Small real checkpoints named like the MXNet model zoo's: BatchNorm on the raw input, flatten0."""
    import mxnet as mx

    home = tmp_path_factory.mktemp("mxnet_home")
    (home / "models").mkdir()
    data = mx.sym.var("data")
    x = mx.sym.BatchNorm(data, name="bn_data", fix_gamma=True)
    x = mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), name="conv0")
    x = mx.sym.Flatten(mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type="avg"), name="flatten0")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=11221, name="fc1"), name="softmax")
    mod = mx.mod.Module(net)
    mod.bind(data_shapes=[("data", (1, 3, 32, 32))], label_shapes=[("softmax_label", (1,))])
    mod.init_params()
    for name in ("imagenet11k-resnet-152", "imagenet1k-resnet-50"):
        mod.save_checkpoint(str(home / "models" / name), 0)
    return home


def seed_plan(caltech, visible_gpus, *overrides):
    return plan_for(compose_config("dataset=caltech256", f"dataset.root={caltech}", *overrides),
                      visible_gpus=visible_gpus)


def test_caltech256_split_is_60_per_class_without_clutter(caltech):
    p = seed_plan(caltech, 0)
    assert p.dataset.num_classes == 256 and p.dataset.train_size == 256 * 60 and p.dataset.val_size == 256 * 20


def test_caltech_with_missing_classes_is_one_line(caltech, tmp_path):
    import shutil

    broken = tmp_path / "256_ObjectCategories"
    shutil.copytree(caltech, broken)
    shutil.rmtree(broken / "017.class17")
    shutil.rmtree(broken / "130.class130")
    with pytest.raises(ConfigError, match=r"254 classes with images, caltech256 has 256; missing or empty: 017, 130$"):
        seed_plan(broken, 0)


def test_resnet152_imagenet11k_8_gpus_batch_256_lr_002(caltech, mxnet_home, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(mxnet_home))
    cmd = ["model=resnet152", "pretrained=imagenet11k-resnet-152", "gpus=8", "batch=32", "lr=0.02",
           "lr_ref_batch=256", "epochs=1", "num_classes=256"]
    with pytest.raises(ConfigError, match=r"gpus=8: 8 GPUs asked for, 0 visible on this machine"):
        seed_plan(caltech, 0, *cmd)
    p = seed_plan(caltech, 8, *cmd)
    assert (p.global_batch, p.effective_lr, p.epochs, p.dataset.num_classes) == (256, 0.02, 1, 256)
    assert p.pretrained.source == "checkpoint" and p.pretrained.layer == "flatten0" and p.pretrained.raw_pixels
    # the MXNet zoo's ResNets normalise raw 0-255 pixels themselves (bn_data): no mean/std applied
    assert p.dataset.options["mean"] == (0.0, 0.0, 0.0) and p.dataset.image_shape == (3, 224, 224)


def test_resnet152_imagenet11k_1_gpu_batch_16_is_the_same_rule(caltech, mxnet_home, monkeypatch):
    """The seeds' lr 0.00125 at batch 16 is the linear scaling of 0.02 at batch 256."""
    monkeypatch.setenv("MXNET_HOME", str(mxnet_home))
    p = seed_plan(caltech, 1, "pretrained=imagenet11k-resnet-152", "gpus=1", "batch=16", "lr=0.02",
                  "lr_ref_batch=256")
    assert p.global_batch == 16 and p.effective_lr == pytest.approx(0.00125)


def test_resnet50_imagenet1k_8_gpus_batch_128_6_epochs(caltech, mxnet_home, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(mxnet_home))
    p = seed_plan(caltech, 8, "model=resnet50", "pretrained=imagenet1k-resnet-50", "gpus=8", "batch=16",
                  "lr=0.01", "lr_ref_batch=128", "epochs=6")
    assert (p.global_batch, p.effective_lr, p.epochs) == (128, 0.01, 6)


def test_resnet50_from_scratch_on_imagenet_rec_16_gpus_batch_1408(tmp_path):
    for part, n in (("train", 2 * 1408), ("val", 100)):
        (tmp_path / f"{part}.rec").touch()
        (tmp_path / f"{part}.idx").write_text("".join(f"{i}\t{i * 100}\n" for i in range(n)))
    cmd = ["model=resnet50", "dataset=rec", f"dataset.train_rec={tmp_path}/train.rec",
           f"dataset.val_rec={tmp_path}/val.rec", "dataset.num_classes=1000", "gpus=16", "batch=88",
           "data_nthreads=32", "lr=0.1", "lr_ref_batch=256"]
    with pytest.raises(ConfigError, match=r"gpus=16: 16 GPUs asked for, 0 visible"):
        plan_for(compose_config(*cmd), visible_gpus=0)
    p = plan_for(compose_config(*cmd), visible_gpus=16)
    assert (p.global_batch, p.data_nthreads, p.steps_per_epoch) == (1408, 32, 2)
    assert p.effective_lr == pytest.approx(0.1 * 1408 / 256)


@pytest.mark.slow
def test_missing_pretrained_weights_on_the_command_line(tmp_path, store):
    proc = run_xp(tmp_path, store, "model=resnet50", "pretrained=resnet50_v1", env={"MXNET_HOME": str(tmp_path)})
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "weights not found; tried" in err and f"{tmp_path}/models" in err
    assert "Traceback" not in proc.stdout + proc.stderr


def test_folder_with_a_zoo_model_takes_the_pretrained_input(tmp_path, monkeypatch):
    from images import make_folder

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "resnet18_v1-a0666292.params").touch()  # the plan only needs to find it
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    root = make_folder(tmp_path / "imgs", per_class=4, with_photos=False)
    auto = plan_for(compose_config("dataset=folder", f"dataset.root={root}", "model=resnet18",
                                     "pretrained=resnet18_v1", "batch=4"), visible_gpus=0)
    assert auto.dataset.image_shape == (3, 224, 224)
    assert auto.dataset.options["mean"] == (123.68, 116.28, 103.53)
    own = plan_for(compose_config("dataset=folder", f"dataset.root={root}", "model=resnet18", "pretrained=resnet18_v1",
                                    "pretrained_input=dataset", "batch=4"), visible_gpus=0)
    assert own.dataset.image_shape == (3, 64, 64)


def test_weights_command_places_checkpoints_and_zoo_files(tmp_path, monkeypatch):
    import subprocess
    import sys

    from conftest import ROOT

    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "home"))
    (tmp_path / "resnet-152-symbol.json").write_text('{"nodes": [{"op": "null", "name": "data"}]}')
    (tmp_path / "resnet-152-0000.params").write_bytes(b"x")
    (tmp_path / "resnet50_v1-cc729d95.params").write_bytes(b"y")
    env = dict(__import__("os").environ)
    run = lambda *a: subprocess.run([sys.executable, "-m", "xp.weights", *a], cwd=ROOT, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    assert run("add", str(tmp_path / "resnet-152"), "--name", "imagenet11k-resnet-152").returncode == 0
    assert run("add", str(tmp_path / "resnet50_v1-cc729d95.params")).returncode == 0
    listed = run("list").stdout
    assert "imagenet11k-resnet-152-symbol.json" in listed and "imagenet11k-resnet-152-0000.params" in listed
    assert "resnet50_v1-" in listed  # renamed to the sha1 of its content, GluonCV's naming
    bad = run("add", str(tmp_path / "nothing"))
    assert bad.returncode != 0 and "no such file" in bad.stderr
