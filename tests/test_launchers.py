"""Launchers are plugins as backends are: found through entry points, refused with one line when unknown,
and every registered one runs the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import nsenter_launcher
from conformance import missing
from xp.errors import ConfigError, PluginError
from xp.launching.hosts import Transport
from xp.launching.launcher import Launcher, launcher_for, launchers


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """The fixture launcher registered as a third party's would be, visible to this process."""
    nsenter_launcher.register(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_shipped_launchers_are_registered_through_entry_points():
    assert {"local", "ssh", "slurm"} <= set(launchers().names())
    assert all(issubclass(launchers().load(n), Launcher) for n in ("local", "ssh", "slurm"))


def test_every_registered_launcher_runs_the_conformance_suite(third_party):
    registered = launchers().names()
    assert "nsenter" in registered  # the test's own launcher is found like any plugin
    assert missing(registered) == {}, "launchers the conformance suite does not run (tests/conformance.py)"
    # a launcher someone registers without adding it to the suite fails it
    assert missing([*registered, "k8s"]) == {"exact": ["k8s"], "killed": ["k8s"], "study": ["k8s"],
                                                  "population": ["k8s"]}


def test_a_launcher_registered_twice_is_refused(third_party):
    nsenter_launcher.register(third_party, "nsenter = nsenter_launcher:NsenterLauncher\n"
                                           "ssh = nsenter_launcher:NsenterLauncher\n")
    with pytest.raises(PluginError, match="launcher 'ssh' is registered twice in xp.launchers"):
        launchers()


def test_an_unknown_launcher_is_one_line_naming_the_registered_ones():
    from dataclasses import replace

    from conftest import compose_config
    from xp.run.backend_plan import plan_and_backend

    plan, _ = plan_and_backend(compose_config("kvstore=dist_sync", "workers=2"))
    plan = replace(plan, launch=replace(plan.launch, launcher="k8s"))  # (the command line refuses it earlier)
    with pytest.raises(ConfigError, match=r"launcher='k8s': not supported; valid: local, ssh, slurm, ray$"):
        launcher_for(plan)


def test_each_shipped_launchers_config_file_holds_exactly_its_settings():
    """conf/launcher/NAME.yaml documents the settings the launcher reads (its Options dataclass), and defaults
    them as the dataclass does: the one place a user reads them says what the code does."""
    import yaml
    from dataclasses import fields

    from conftest import CONF

    for name in ("local", "ssh", "slurm", "ray"):
        options = launchers().load(name).Options
        documented = yaml.safe_load((CONF / "launcher" / f"{name}.yaml").read_text())
        assert documented.pop("name") == name
        assert documented == {f.name: f.default for f in fields(options)}, name


@pytest.mark.parametrize("key, value, message", [
    ("runtime_env", "pip", r"launcher.runtime_env='pip': a mapping of Ray's runtime environment"),
    ("grow_every_s", -1, r"launcher.grow_every_s"),
])
def test_a_bad_ray_setting_is_one_line(key, value, message):
    with pytest.raises(ConfigError, match=message):
        launchers().load("ray").read_options({key: value})


def test_a_third_partys_launcher_brings_its_own_config_group(third_party, monkeypatch):
    """launcher=nsenter (no file in xp's conf/): its settings are offered from its Options dataclass, composed
    under launcher.*, read and checked by the launcher; a key it lacks, or a setting of another launcher, is one
    line; the settings launchers had before they brought their own are refused naming the key now."""
    from hydra.core.config_store import ConfigStore

    from xp import preflight
    from xp.launching.launcher import offer_options

    monkeypatch.setenv(nsenter_launcher.HOSTS_ENV, str(third_party / "nsenter-hosts"))
    offer_options()
    try:
        configs = preflight.preflight(["kvstore=dist_sync", "workers=2", "launcher=nsenter",
                                       "launcher.hosts_file=/the/hosts", "launcher.connect_timeout_s=3"]).configs
        assert configs[0]["launcher"] == {"name": "nsenter", "hosts_file": "/the/hosts", "connect_timeout_s": 3}
        for args, message in [
            (["launcher.identity=/k"], "launcher.identity=/k: unknown key 'launcher.identity'; the chosen launcher "
                                       "has no such key"),
            (["launcher.hosts_file=/h", "+launcher.nodes=2"], "launcher.nodes: launcher=nsenter has no such setting; "
                                                             "its settings: hosts_file, connect_timeout_s"),
            (["hosts_file=/h"], "hosts_file=/h: now a setting of launcher=ssh: write launcher=ssh "
                                "launcher.hosts_file=/h"),
            (["slurm.time_min=5"], "slurm.time_min=5: now a setting of launcher=slurm: write launcher=slurm "
                                   "launcher.time_min=5"),
        ]:
            with pytest.raises(ConfigError) as e:
                preflight.preflight(["kvstore=dist_sync", "workers=2", "launcher=nsenter", *args])
            assert str(e.value).startswith(message), str(e.value)
    finally:
        ConfigStore.instance().repo.get("launcher", {}).pop("nsenter.yaml", None)


@dataclass(frozen=True)
class Here(Transport):
    """A transport that runs the command on this machine, whatever the host: enough to see `as_ssh` work."""
    name: ClassVar[str] = "here"
    connect_timeout_s: float = 5.0
    tag: str = ""

    def argv(self, host: str, command: str) -> list[str]:
        return ["sh", "-c", f"echo {self.tag}@{host}; {command}"]


def test_any_transport_stands_in_for_ssh_for_runners_that_call_ssh(tmp_path):
    """What horovodrun is given as `ssh`: its options before and after the host are ssh's, the rest is the
    command, and it runs through the transport (rebuilt from its fields in a new process)."""
    shim = Here(tag="rebuilt").as_ssh()
    r = subprocess.run(f"{shim} -o StrictHostKeyChecking=no node7 -p 22 echo hello there", shell=True,
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={"PYTHONPATH": str(Path(__file__).parent), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["rebuilt@node7", "hello there"]


def test_ctrl_c_while_a_hosts_command_starts_is_no_traceback_and_leaves_nothing_running():
    """A study's workers share its terminal's Ctrl-C. One that came while the host side's interpreter was still
    starting (xp.launching.remote importing) printed a KeyboardInterrupt traceback on the study's terminal: it is
    ignored there until remote handles it; handled, it ends what remote started. Sent at moments from the
    interpreter's start (the process already python) to past it; the host's command then ends with its launcher's
    session (stdin closed), as a study ends its workers."""
    import signal
    import sys
    import time

    import psutil

    from xp.launching.hosts import start_there

    def running(token: str) -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if token in (p.info["cmdline"] or [])]

    for attempt in range(8):
        token = f"xp-test-argv-{os.getpid()}-{attempt}"
        proc = start_there(Here(), "h", {"argv": [sys.executable, "-c", "import time; time.sleep(60)", token]},
                           output=True, own_session=True)
        deadline = time.monotonic() + 30
        remote = [sys.executable.encode(), b"-m", b"xp.launching.remote"]  # its shell exec'd the interpreter
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[:3] != remote:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=10)
        time.sleep(attempt * 0.015)
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)  # stdin closed: what is still running ends
        assert "Traceback" not in out, (attempt, out)
        assert proc.returncode == 143, (attempt, proc.returncode, out)
        assert not running(token), attempt


@pytest.mark.parametrize("launcher", ["slurm", "ssh", "ray"])
def test_gpus_on_other_hosts_are_not_refused_for_this_machines_lack_of_them(launcher):
    """A login node or a Ray head without GPUs asks for its hosts' GPUs: the plan takes them (the launcher and the
    hosts check them); on this machine (launcher=local) they are still refused in one line. (No GPU here.)"""
    from conftest import compose_config
    from xp.launching.launcher import gpus_here
    from xp.run.gpu import visible_gpus
    from xp.run.backend_plan import plan_and_backend

    for backend in ("gluon", "torch"):
        config = compose_config(f"launcher={launcher}", f"backend={backend}", "gpus=2", "workers=2",
                                *(["kvstore=dist_sync"] if backend == "gluon" else []))
        assert not gpus_here(config)
        plan, _ = plan_and_backend(config, gpus_here=False)
        assert plan.devices == ("gpu(0)", "gpu(1)")
        here = compose_config(f"backend={backend}", "gpus=2")
        assert gpus_here(here)
        if (seen := visible_gpus()) < 2:
            with pytest.raises(ConfigError, match=f"gpus=2: 2 GPUs asked for, {seen} visible on this machine"):
                plan_and_backend(here, gpus_here=True)
