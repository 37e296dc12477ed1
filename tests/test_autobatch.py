"""batch=auto: doubling and bisecting, and MXNet's memory estimate on the CPU."""

import pytest

from conftest import compose_config
from xp.run.autobatch import largest_fitting
from xp.errors import ConfigError
from xp.run.backend_plan import plan_and_backend
from xp.run.plan import build_plan


def test_doubling_then_bisecting_finds_the_seeds_1408():
    batch, tried = largest_fitting(lambda b: b <= 1408, limit=65536)
    assert batch == 1408
    assert tried[:12] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert len(tried) < 25  # logarithmic, not a scan


def test_limit_and_nothing_fits():
    assert largest_fitting(lambda b: True, limit=300)[0] == 300
    with pytest.raises(ConfigError, match="batch=auto: not even batch=1 fits"):
        largest_fitting(lambda b: False, limit=100)


SYNTH = ["model=resnet18", "dataset=synthetic", "dataset.image_shape=[3,32,32]", "dataset.num_classes=10",
         "dataset.train_size=8192", "auto_batch_memory_mb=200"]


def test_auto_batch_is_the_largest_within_the_memory_bound():
    config = compose_config("batch=auto", *SYNTH)
    plan, backend = plan_and_backend(config, resolve_auto=True)
    b = plan.batch
    assert 8 < b < 8192 and config["batch"] == b
    assert backend.fits(build_plan(compose_config(f"batch={b}", *SYNTH), visible_gpus=0))
    assert not backend.fits(build_plan(compose_config(f"batch={b + 1}", *SYNTH), visible_gpus=0))
    bigger, _ = plan_and_backend(compose_config("batch=auto", *SYNTH[:-1], "auto_batch_memory_mb=400"),
                                 resolve_auto=True)
    assert bigger.batch > 3 * b  # 134 MB of weights, gradients, momentum; the rest grows with the batch


def test_auto_batch_validates_without_resolving():
    plan, _ = plan_and_backend(compose_config("batch=auto", *SYNTH))
    assert plan.batch == 1  # preflight checks everything else without building networks
