"""Every option of every config group composes into a valid plan; every backend has a test entry."""

from pathlib import Path

import pytest

from conftest import CONF, compose_config
from xp.errors import ConfigError
from xp.run.backend_plan import plan_and_backend
from xp.run.plan import build_plan
from xp.run.entry_points import Registry

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]

# Every registered backend must appear here with the test that trains with it end to end.
# A new plugin without an entry fails test_every_backend_has_a_test_entry.
BACKEND_TESTS = {
    "gluon": "tests/test_cli.py::test_default_run_reaches_095_and_logs_everything",
    "module": "tests/test_backends.py::test_backend_computes_the_same_parameters_as_gluon",
    "horovod": "tests/test_distributed.py::test_horovod_workers_compute_what_one_process_computes",
    "torch": "tests/test_torch.py::test_ddp_processes_compute_what_one_process_computes",
}


def test_the_groups_the_product_promises_exist():
    assert {"backend", "model", "dataset", "kvstore", "dtype", "hardware"} <= set(GROUPS)


# Options a CPU-only, single-process run must refuse, with what the message must say;
# each of them builds a plan on a machine with GPUs. (dist_* kvstores compose on their own and train in
# tests/test_distributed.py.)
REFUSED_ON_ONE_CPU = {
    ("kvstore", "nccl"): "kvstore=nccl: NCCL aggregates gradients between GPUs",
    ("dtype", "float16"): "dtype=float16: MXNet 1.9.1 has no float16 CPU kernels",
    ("dtype", "bfloat16"): "dtype=bfloat16: the MXNet backends reach bfloat16 through AMP",
}
# Options with a value only the user can give; they train in tests/test_cli_data.py.
NEEDS_A_VALUE = {
    ("dataset", "folder"): "dataset.root is required",
    ("dataset", "rec"): "dataset.train_rec is required",
    ("dataset", "caltech256"): "dataset.root is required",
}


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_into_a_plan(group, option):
    cfg = compose_config(f"{group}={option}")
    assert cfg[group]["name"] == option  # file name and declared name agree
    if (group, option) in NEEDS_A_VALUE:
        with pytest.raises(ConfigError, match=NEEDS_A_VALUE[group, option]):
            build_plan(cfg, visible_gpus=0)
    elif (group, option) in REFUSED_ON_ONE_CPU:
        with pytest.raises(ConfigError, match=REFUSED_ON_ONE_CPU[group, option]):
            plan_and_backend(cfg)  # the plan, then the backend's own check
        assert build_plan(compose_config(f"{group}={option}", "gpus=1"), visible_gpus=1).devices == ("gpu(0)",)
    else:
        build_plan(cfg, visible_gpus=0)
    if group == "backend":
        assert option in Registry().names()


def test_every_config_field_has_a_comment():
    """Each key in conf/ carries a one-line comment with its meaning (and unit)."""
    missing = []
    for f in sorted(CONF.rglob("*.yaml")):
        in_hydra = False
        for line in f.read_text().splitlines():
            if line.startswith("hydra:") or line.startswith("defaults:"):
                in_hydra = True
            elif line and not line.startswith(" ") and not line.startswith("#"):
                in_hydra = False
            body = line.strip()
            if in_hydra or not body or body.startswith("#") or body.startswith("-") or ":" not in body:
                continue
            if not line.startswith(" ") and "#" not in line:
                missing.append(f"{f.relative_to(CONF)}: {body}")
    assert not missing, "fields without a comment:\n" + "\n".join(missing)


def test_every_backend_has_a_test_entry():
    assert set(Registry().names()) - {"failing", "broken", "notabackend"} <= set(BACKEND_TESTS)
    for target in BACKEND_TESTS.values():
        path, name = target.split("::")
        assert f"def {name}(" in (Path(__file__).parents[1] / path).read_text()
