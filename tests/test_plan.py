"""Plan derivation, validation and the learning-rate schedule."""

import math

import pytest

from conftest import compose_config
from xp.errors import ConfigError
from xp.run.plan import build_plan, learning_rate


def plan_for(*overrides, visible_gpus=0, workers=1):
    return build_plan(compose_config(*overrides), visible_gpus=visible_gpus, workers=workers)


def test_default_plan_derives_batch_lr_and_epoch_size():
    p = plan_for()
    assert p.devices == ("cpu(0)",)
    assert (p.batch, p.worker_batch, p.global_batch) == (32, 32, 32)
    assert p.effective_lr == pytest.approx(p.lr)  # global batch == reference batch
    assert p.dataset.train_size + p.dataset.val_size == 1797
    assert p.steps_per_epoch == p.dataset.train_size // 32
    assert p.samples_per_epoch == p.steps_per_epoch * 32


def test_linear_scaling_follows_the_global_batch():
    p = plan_for("cpu_devices=4", "batch=16", "lr=0.1", "lr_ref_batch=32", "kvstore=dist_sync", workers=2)
    assert p.devices == ("cpu(0)", "cpu(1)", "cpu(2)", "cpu(3)")
    assert (p.worker_batch, p.global_batch) == (64, 128)
    assert p.effective_lr == pytest.approx(0.1 * 128 / 32)
    assert p.derived()["global_batch"] == 128 and p.derived()["effective_lr"] == pytest.approx(0.4)


def test_gpus_select_gpu_devices_when_visible():
    p = plan_for("gpus=2", visible_gpus=4)
    assert p.device_type == "gpu" and p.devices == ("gpu(0)", "gpu(1)")


def test_gpus_beyond_the_instance_are_refused():
    with pytest.raises(ConfigError, match=r"gpus=4: hardware=tiny has 2 GPUs"):
        build_plan({**compose_config("gpus=4"), "hardware": {"name": "tiny", "gpus": 2, "price_per_hour": 1.0}},
                   visible_gpus=8)


@pytest.mark.parametrize("override, message", [
    ("batch=0", "batch=0: must be an integer from 1"),
    ("batch=abc", "batch='abc': must be an integer"),
    ("batch=2000", "batch=2000: the global batch"),
    ("epochs=0", "epochs=0: must be an integer"),
    ("lr=0", "lr=0: must be a number > 0"),
    ("lr=nan", "lr=nan: must be a number"),
    ("gpus=-1", "gpus=-1: must be an integer from 0"),
    ("gpus=4", "gpus=4: 4 GPUs asked for, 0 visible"),
    ("cpu_devices=0", "cpu_devices=0: must be an integer from 1"),
    ("data_nthreads=0", "data_nthreads=0: must be an integer from 1 to 256"),
    ("data_nthreads=1000", "data_nthreads=1000: must be an integer from 1 to 256"),
    ("momentum=1.0", "momentum=1.0: must be a number >= 0.0 and < 1.0"),
    ("warmup_epochs=11", "warmup_epochs=11: must be a number >= 0.0 and <= 10.0"),
    ("lr_schedule=poly", "lr_schedule='poly': not supported; valid: constant, step, cosine"),
    ("optimizer=adamw", "optimizer='adamw': not supported; valid: sgd, nag"),
    ("lr_steps=[0]", "lr_steps=[0]: must be a list of epochs"),
    ("dataset.val_fraction=1.5", "dataset.val_fraction=1.5: must be a number between 0 and 1"),
    ("seed=-3", "seed=-3: must be an integer from 0"),
])
def test_bad_values_name_key_value_and_what_is_valid(override, message):
    with pytest.raises(ConfigError) as e:
        plan_for(override)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_warmup_ramps_linearly_to_the_effective_lr():
    p = plan_for("warmup_epochs=2", "lr_schedule=constant", "cpu_devices=2", "lr=0.01")
    spe = p.steps_per_epoch
    warm = 2 * spe
    assert learning_rate(p, 0) == pytest.approx(p.effective_lr / warm)
    assert learning_rate(p, warm // 2 - 1) == pytest.approx(p.effective_lr / 2)
    assert learning_rate(p, warm) == pytest.approx(p.effective_lr)
    assert learning_rate(p, 5 * spe) == pytest.approx(p.effective_lr)


def test_step_schedule_decays_at_the_given_epochs():
    p = plan_for("lr_steps=[2,3]", "lr_decay=0.5", "epochs=4")
    spe = p.steps_per_epoch
    lrs = [learning_rate(p, e * spe) for e in range(4)]
    assert lrs == pytest.approx([p.effective_lr, p.effective_lr, p.effective_lr * 0.5, p.effective_lr * 0.25])
    assert learning_rate(p, 2 * spe - 1) == pytest.approx(p.effective_lr)  # last step of epoch 2


def test_cosine_schedule_ends_near_zero():
    p = plan_for("lr_schedule=cosine", "epochs=4")
    total = p.epochs * p.steps_per_epoch
    assert learning_rate(p, 0) == pytest.approx(p.effective_lr)
    assert learning_rate(p, total // 2) == pytest.approx(p.effective_lr / 2, rel=0.05)
    assert learning_rate(p, total - 1) < 0.01 * p.effective_lr
    assert all(not math.isnan(learning_rate(p, s)) for s in range(total))
