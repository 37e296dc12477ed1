"""Where a study's trials run: slots of GPUs (a fake NVML of 8) and of cores, disjoint, each trial pinned."""

import os
import sys
from types import SimpleNamespace

import pytest

from xp.errors import ConfigError
from xp.launching.slots import Slot, host_slots, plan_slots, span


@pytest.fixture
def eight_gpus(monkeypatch):
    """NVML as a machine with 8 GPUs shows it (as the telemetry tests fake it)."""
    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 8,
                           nvmlDeviceGetHandleByUUID=lambda u: int(u.split("-")[1]), nvmlDeviceGetIndex=lambda h: h)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml


def visible(slots):
    return [s.env()["CUDA_VISIBLE_DEVICES"] for s in slots]


def test_one_gpu_trials_get_eight_distinct_gpus(eight_gpus):
    slots = plan_slots(1, None, cores=list(range(16)))
    assert visible(slots) == [str(i) for i in range(8)]
    assert all(len(s.cores) == 2 for s in slots)  # the cores shared out: 16 / 8
    assert len({c for s in slots for c in s.cores}) == 16  # disjoint
    assert "OMP_NUM_THREADS" not in slots[0].env()  # set by pin(), in the worker, from the cores it gets


def test_two_gpu_trials_get_four_disjoint_pairs(eight_gpus):
    slots = plan_slots(2, None, cores=list(range(8)))
    pairs = [set(v.split(",")) for v in visible(slots)]
    assert len(pairs) == 4 and all(len(p) == 2 for p in pairs)
    assert set().union(*pairs) == {str(i) for i in range(8)}  # every GPU once


def test_trials_per_gpu_packs_sixteen_trials_two_to_a_gpu(eight_gpus):
    slots = plan_slots(1, None, trials_per_gpu=2, cores=list(range(16)))
    devices = visible(slots)
    assert len(devices) == 16 and all(devices.count(str(g)) == 2 for g in range(8))
    assert all(len(s.cores) == 1 for s in slots) and len({s.cores for s in slots}) == 16


def test_the_visible_gpus_are_the_ones_placed(eight_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,GPU-7,2")
    assert visible(plan_slots(1, None, cores=[0])) == ["5", "7", "2"]


def test_more_slots_than_the_gpus_make_is_one_line(eight_gpus):
    with pytest.raises(ConfigError, match=r"sweep.parallel=5: 4 groups of 2 GPUs x 1 trials each make 4 slots"):
        plan_slots(2, 5, cores=[0, 1])
    with pytest.raises(ConfigError, match="gpus=16 per trial: this machine shows xp 8 GPUs"):
        plan_slots(16, None, cores=[0])


def test_cpu_slots_are_disjoint_cores_and_share_only_when_asked_for_more(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no driver: import fails
    slots = plan_slots(0, None, cores=[0, 1, 2, 3])
    assert [s.cores for s in slots] == [(0,), (1,), (2,), (3,)] and all("CUDA_VISIBLE_DEVICES" not in s.env()
                                                                        for s in slots)
    assert [s.cores for s in plan_slots(0, 2, cores=[0, 1, 2, 3])] == [(0, 1), (2, 3)]
    assert [s.cores for s in plan_slots(0, 4, cores=[0, 1])] == [(0,), (1,), (0,), (1,)]


def test_a_slot_says_where_it_is():
    s = Slot(3, (4, 5), (0, 1, 2, 3, 8))
    assert s.describe() == "slot 3: GPU 4,5 and cores 0-3,8 on this machine"
    assert s.tags() == {"xp.slot": "3", "xp.slot.gpus": "4,5", "xp.slot.cores": "0-3,8", "xp.slot.host": "local"}
    assert span((7,)) == "7"


def test_the_hosts_file_gives_the_slots_of_other_hosts():
    from xp.launching.hosts import HostSlots

    hosts = [HostSlots("a", 4), HostSlots("b", 2)]
    cpu = host_slots(hosts, 0, None)
    assert [(s.index, s.host, s.rank, s.of) for s in cpu] == [(0, "a", 0, 4), (1, "b", 0, 2), (2, "a", 1, 4),
                                                              (3, "b", 1, 2), (4, "a", 2, 4), (5, "a", 3, 4)]
    assert [s.host for s in host_slots(hosts, 0, 2)] == ["a", "b"]  # every host in turn
    two = host_slots(hosts, 2, None)  # a:4 is two pairs of GPUs, b:2 one
    assert sorted((s.host, s.gpus) for s in two) == [("a", (0, 1)), ("a", (2, 3)), ("b", (0, 1))]
    assert len(host_slots(hosts, 1, None, trials_per_gpu=2)) == 12
    assert cpu[1].describe() == "slot 1: share 1 of 2 of the cores on b"
    with pytest.raises(ConfigError, match="sweep.parallel=7: the hosts offer 6 slots"):
        host_slots(hosts, 0, 7)
    with pytest.raises(ConfigError, match="no host of the hosts file has that many slots"):
        host_slots(hosts, 8, None)


def test_a_remote_slot_pins_its_worker_to_its_share_of_the_hosts_cores(monkeypatch):
    pinned = {}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr("os.sched_setaffinity", lambda pid, cores: pinned.update(cores=tuple(cores)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert Slot(1, (), (), "b", rank=1, of=3).pin() == (2, 3) == pinned["cores"]
    assert os.environ["OMP_NUM_THREADS"] == "2"
    assert Slot(0, (), (), "b", rank=4, of=8).pin() == (4,)  # more slots than cores: they share
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert Slot(0, (), (), "b", rank=0, of=1).pin() == (0, 1, 2, 3, 4, 5)  # the whole host: as a plain run has it
    assert "OMP_NUM_THREADS" not in os.environ


def test_where_a_studys_trials_run_is_one_choice_from_its_scheduler_its_hydra_launcher_and_the_launcher():
    from xp.launching.placement import InBatches, OnSlots, choose
    from xp.studies.study import spec_from

    def spec(**fields):
        return spec_from({"n_trials": 4, "params": {"lr": {"type": "float", "low": 0.01, "high": 0.1}}, **fields}, "s")

    ssh = SimpleNamespace(name="ssh", remote=True)
    for hydra in ("", "basic", "joblib"):  # Hydra's launchers that run jobs on this machine: xp's slots
        assert choose(spec(parallel=3, trials_per_gpu=2), hydra, ssh, 1) == OnSlots(ssh, 1, 3, 2)
    assert choose(spec(), "submitit_slurm", None, 0) == InBatches(None)  # a cluster's Hydra launcher: its jobs
    assert choose(spec(scheduler="hydra", parallel=2), "", None, 0) == InBatches(2)
    assert isinstance(choose(spec(scheduler="hydra"), "joblib", ssh, 0), InBatches)


def test_sweep_parallel_and_the_scheduler_are_read_only_where_the_spec_is_made_and_the_placement_chosen():
    """sweep.parallel and sweep.scheduler go from the study's node into its spec (xp/studies/study.py), and
    from there into the placement's one choice (xp/launching/placement.py): no other code of xp reads them."""
    import ast
    from pathlib import Path

    xp = Path(__file__).resolve().parents[1] / "xp"
    keys = {"parallel", "scheduler"}

    def reads(tree):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in keys:  # spec.parallel, choice.parallel
                yield node
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys:
                yield node  # node.get("parallel")
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in keys:
                yield node  # node["parallel"]

    found = sorted(str(p.relative_to(xp)) for p in xp.rglob("*.py") if any(reads(ast.parse(p.read_text()))))
    assert found == ["launching/placement.py", "studies/sweeper.py"], found  # (study.py reads its fields by name)
    sweeper = ast.parse((xp / "studies" / "sweeper.py").read_text())
    assert [ast.unparse(n) for n in reads(sweeper)] == ["where.parallel"]  # InBatches': so many jobs at a time


def test_a_studys_spec_is_read_once_by_the_preflight_and_its_slots_asked_once(tmp_path, monkeypatch):
    """The command line's preflight reads the study (its file, sweep.* settings, the search space given on the
    command line) into one spec; the placement keeps it with the choice, and the launcher is asked for its slots
    once: the sweeper's pool is made from what `decide` was offered."""
    from xp import preflight
    from xp.launching.launcher import Local
    from xp.launching.placement import OnSlots, Placement, choose
    from xp.studies import studyfile
    from xp.studies.study import StudySpec

    studyfile.register(typed=["lr_batch"])
    checked = preflight.preflight(["-m", "sweep=lr_batch", "sweep.parallel=2", "lr=interval(0.01,0.1)",
                                   f"tracking_uri=sqlite:///{tmp_path}/mlflow.db"])
    spec = checked.study
    assert isinstance(spec, StudySpec) and spec.parallel == 2
    assert [p.name for p in spec.params if p.name == "lr"] == ["lr"] and spec.params[-1].name == "lr"
    assert preflight.preflight(["epochs=1"]).study is None  # no study, no spec

    asked = []

    class Counted(Local):
        def slots(self, *args):
            asked.append(args)
            return super().slots(*args)

    monkeypatch.setattr("xp.launching.placement.Placement._pool", lambda self, config, slots, uri: slots)
    choice = choose(spec, "", Counted(), 0)
    assert isinstance(choice, OnSlots)
    placement = Placement()
    placement.decide(checked.configs[0], choice, spec, "postgresql://nowhere/db")  # (no workers started ahead)
    assert placement.spec is spec and len(asked) == 1
    assert len(placement.pool(checked.configs[0], 5)) == 2 and len(asked) == 1


def test_a_study_no_preflight_read_is_read_from_its_composed_config():
    """A command whose config tree xp did not compose (--config-path) has no preflight: its sweeper reads the spec
    from the composed config, with the search space on the command line winning over the file's."""
    from omegaconf import OmegaConf

    from xp.studies.study import Param
    from xp.studies.sweeper import _spec_here

    config = OmegaConf.create({"sweep": {"n_trials": 3, "parallel": 2, "params": {"lr": {"type": "float", "low": 0.01,
                                                                                         "high": 0.1}}},
                               "hydra": {"runtime": {"choices": {"sweep": "mine"}}}})
    spec = _spec_here(config, (Param("lr", "float", 0.001, 0.002, False),), [])
    assert (spec.name, spec.n_trials, spec.parallel) == ("mine", 3, 2)
    assert [(p.name, p.low, p.high) for p in spec.params] == [("lr", 0.001, 0.002)]
