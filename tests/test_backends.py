"""Conformance suite: every backend trains the same experiment to the same result.

Parametrised over the registered backends and a backend written as a test fixture in pure NumPy
(tests/numpy_backend.py, registered through an entry point like any plugin); a registered backend with no
entry in BACKENDS fails test_every_registered_backend_is_in_this_suite.
"""

import numpy as np
import pytest

from conftest import compose_config
from xp.run.plan import build_plan
from xp.run.entry_points import Registry
from xp.run.train import fit, train_epoch

BACKENDS = ["gluon", "module", "horovod", "torch"]
SUITE = [*BACKENDS, "numpy"]  # numpy: the fixture plugin (tests/numpy_backend.py)
# every way a backend aggregates and updates, compared with Gluon's arithmetic (horovod: one device per process)
VARIANTS = [("module", 1), ("module", 2), ("horovod", 1), ("horovod backend.api=module", 1)]


@pytest.fixture(autouse=True)
def numpy_plugin(tmp_path, monkeypatch):
    """The fixture plugin, installed (a distribution with its entry point) on sys.path for every test here."""
    import numpy_backend

    monkeypatch.syspath_prepend(str(numpy_backend.install(tmp_path / "site")))


def train(backend, *overrides):
    backend, *options = backend.split()
    group = ["backend=gluon", f"backend.name={backend}"] if backend == "numpy" else [f"backend={backend}"]
    plan = build_plan(compose_config(*group, *options, *overrides), visible_gpus=0)
    b = Registry().load(backend).for_plan(plan)()
    history = fit(plan, b, [])
    return b, history


def test_every_registered_backend_is_in_this_suite():
    """A backend registered under xp.backends with no entry here fails: every engine passes the same suite."""
    assert set(Registry().names()) <= set(SUITE)
    assert "numpy" in Registry().names()  # the fixture plugin is found like any installed one


@pytest.mark.parametrize("backend", SUITE)
def test_backend_learns_digits_and_logs_the_standard_metrics(backend):
    _, history = train(backend, "epochs=5")
    assert history[-1]["val_accuracy"] > 0.93
    assert set(history[-1]) >= {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "val_top5_accuracy", "lr"}
    assert history[-1]["train_loss"] < history[0]["train_loss"]


@pytest.mark.parametrize("backend, devices", VARIANTS, ids=[f"{b}-{d}dev" for b, d in VARIANTS])
def test_backend_computes_the_same_parameters_as_gluon(backend, devices):
    """Same model, data order, optimizer and schedule: the same arithmetic, to float tolerance.

    Over a few steps only: the two engines round differently in the last bit (SoftmaxOutput's
    gradient vs log-softmax's), and the digits' constant backgrounds put exact ties into max
    pooling; after ~8 steps a 1e-7 difference flips a tie and the runs part at 1e-4. Their
    accuracy over whole runs is compared in test_cli.py.
    """
    # 198 training images: 6 steps of 32
    overrides = ["epochs=1", "dataset.val_fraction=0.89", f"cpu_devices={devices}", f"batch={32 // devices}"]
    ref, h_ref = train("gluon", *overrides)
    other, h_other = train(backend, *overrides)
    p_ref, p_other = ref.get_params(), other.get_params()
    assert set(p_ref) == set(p_other)
    for name in p_ref:
        np.testing.assert_allclose(p_other[name], p_ref[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert h_other[0]["val_accuracy"] == pytest.approx(h_ref[0]["val_accuracy"], abs=0.01)
    assert len(h_ref) == 1 and ref.plan.steps_per_epoch == 6


@pytest.mark.parametrize("backend", SUITE)
def test_test_io_reads_every_batch_and_trains_nothing(backend):
    """test_io through the core's loop: steps_per_epoch batches read, no metrics, parameters untouched."""
    plan = build_plan(compose_config(*(["backend=gluon", "backend.name=numpy"] if backend == "numpy"
                                       else [f"backend={backend}"]), "test_io=true"), visible_gpus=0)
    b = Registry().load(backend).for_plan(plan)()
    b.setup(plan)
    before = b.get_params()
    seen = []
    assert train_epoch(b.plan, b, 1, lambda step, n: seen.append(n)) == {}
    assert len(seen) == plan.steps_per_epoch and set(seen) == {plan.global_batch}
    after = b.get_params()
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("backend", SUITE)
def test_get_params_is_a_copy_that_later_steps_leave_alone(backend):
    """What get_params returned stays as it was while training goes on (a view of the live weights made the
    best epoch's logged model the last epoch's): the kept arrays equal their own copies after another epoch,
    which did change the network."""
    b, _ = train(backend, "epochs=1", "dataset.val_fraction=0.89")
    kept = b.get_params()
    frozen = {k: v.copy() for k, v in kept.items()}
    train_epoch(b.plan, b, 2, lambda step, n: None)
    now = b.get_params()
    assert any(not np.array_equal(now[k], frozen[k]) for k in frozen)  # the epoch trained
    for k in frozen:
        np.testing.assert_array_equal(kept[k], frozen[k], err_msg=k)


def test_the_fixture_backend_resumes_from_a_commit_exactly(tmp_path):
    """State out and in through the interface: 1 epoch, committed, resumed for the 2nd == 2 epochs in one go."""
    from xp.run.checkpoint import commit

    whole, _ = train("numpy", "epochs=2")
    part, history = train("numpy", "epochs=1")
    commit(tmp_path, 1, history, part.save_state)
    plan = build_plan(compose_config("backend=gluon", "backend.name=numpy", "epochs=2", f"resume={tmp_path}"),
                      visible_gpus=0)
    resumed = Registry().load("numpy")()
    fit(plan, resumed, [], start_epoch=1)
    for k, v in whole.get_params().items():
        np.testing.assert_array_equal(resumed.get_params()[k], v)


def test_mxnet_is_imported_without_what_xp_never_uses_and_those_import_after():
    """xp.mx keeps scikit-learn and scipy.stats out of mxnet's own import (0.6 s of every MXNet process); mxnet
    falls back for them, and both import as usual afterwards."""
    import subprocess
    import sys

    code = ("import sys, xp.mx, mxnet\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn' or m.startswith('scipy.stats')))\n"
            "print(mxnet.model.BASE_ESTIMATOR.__name__, mxnet.nd.ones((2,)).sum().asscalar())\n"
            "import scipy.stats, sklearn.base\n"
            "print(scipy.stats.norm.cdf(0), sklearn.base.BaseEstimator.__name__)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[]", "object 2.0", "0.5 BaseEstimator"]


@pytest.mark.parametrize("backend", ["gluon", "torch"])
def test_a_resumed_run_goes_on_with_its_own_momentum_not_the_commits(tmp_path, backend):
    """The commit's optimizer state carries the momentum it was trained with; a run resumed from it with another
    momentum (a PBT member that took a donor's weights and explored) trains with its own."""
    from xp.run.checkpoint import commit

    part, history = train(backend, "epochs=1", "momentum=0.9")
    commit(tmp_path, 1, history, part.save_state)
    plan = build_plan(compose_config(f"backend={backend}", "epochs=2", "momentum=0.5", f"resume={tmp_path}"),
                      visible_gpus=0)
    resumed = Registry().load(backend).for_plan(plan)()
    fit(plan, resumed, [], start_epoch=1)
    groups = [resumed.trainer.optimizer.momentum] if backend == "gluon" else \
        [g["momentum"] for g in resumed.optimizer.param_groups]
    assert groups and set(groups) == {0.5}, groups
