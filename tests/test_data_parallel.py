"""Data parallelism over several CPU contexts in one process (kvstore local/device).

N devices with batch B each must produce the same parameters as 1 device with
batch N x B: the split, the gradient sum and the 1/batch rescaling are right.
"""

import numpy as np
import pytest

from conftest import compose_config
from xp.run.plan import build_plan
from xp.run.train import fit
from xp_plugins.gluon import GluonBackend


def train(*overrides):
    plan = build_plan(compose_config("epochs=1", "dataset.val_fraction=0.8", *overrides), visible_gpus=0)
    backend = GluonBackend()
    history = fit(plan, backend, [])
    return plan, backend, history


def params(backend, ctx_index=0):
    return {k.split("_", 1)[1]: p.list_data()[ctx_index].asnumpy() for k, p in backend.net.collect_params().items()}


@pytest.mark.parametrize("kvstore", ["local", "device"])
def test_two_cpu_devices_equal_one_device_with_double_batch(kvstore):
    plan1, one, _ = train("cpu_devices=1", "batch=32", f"kvstore={kvstore}")
    plan2, two, hist = train("cpu_devices=2", "batch=16", f"kvstore={kvstore}")
    assert plan2.devices == ("cpu(0)", "cpu(1)") and plan2.global_batch == plan1.global_batch == 32
    assert plan2.effective_lr == plan1.effective_lr
    assert plan1.steps_per_epoch == plan2.steps_per_epoch >= 10
    p1, p2a, p2b = params(one), params(two, 0), params(two, 1)
    for name in p1:
        np.testing.assert_array_equal(p2a[name], p2b[name])  # replicas stay identical
        np.testing.assert_allclose(p2a[name], p1[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # and the training moved the weights: equal because both trained, not because neither did
    fresh = GluonBackend()
    fresh.setup(plan1)
    assert any(not np.allclose(params(fresh)[n], p1[n]) for n in p1)
    assert hist[0]["train_accuracy"] > 0.15  # 11 steps; chance is 0.1


def test_imperative_and_hybridized_gluon_agree():
    _, hybrid, h1 = train("backend.hybridize=true")
    _, imperative, h2 = train("backend.hybridize=false")
    for name, value in params(hybrid).items():
        np.testing.assert_allclose(params(imperative)[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
