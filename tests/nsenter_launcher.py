"""A launcher written as a test fixture, as a third party would write one: `launcher=nsenter` starts each
host's processes by entering the test hosts' namespaces (tests/hosts.py) with nsenter instead of ssh.

It is the whole of what a site needs: its settings (`NsenterOptions`: the config group `launcher`, offered from
the dataclass, launcher.hosts_file=... launcher.connect_timeout_s=...), where the processes may go (`hosts`: the
hosts file), how a command runs on a host (`transport`: a `Transport`), and what it refuses when the run is
planned (`check_plan`).
Probing the hosts before the job, reaping them after it, and handing horovodrun an `ssh` come from the
interface (`OnHosts`, `Transport.as_ssh`); ps-lite, Horovod and torchrun run on it unchanged.

The hosts: a file of `ADDRESS PID` lines (PID: a process in the host's network, mount and UTS namespaces),
named by $XP_NSENTER_HOSTS. `install(root)` writes the distribution that registers it (entry point group
xp.launchers), as tests/plugin_fixtures.py does for backends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from xp.errors import ConfigError
from xp.launching.hosts import HostSlots, Transport, read_hosts
from xp.launching.launcher import OnHosts

HOSTS_ENV = "XP_NSENTER_HOSTS"
UNREACHABLE = 255  # what ssh exits with when it cannot reach a host: the job names the host as lost


@dataclass(frozen=True)
class Nsenter(Transport):
    name: ClassVar[str] = "nsenter"
    hosts_file: str = ""  # ADDRESS PID a line
    connect_timeout_s: float = 10.0

    def pid(self, host: str) -> str | None:
        for line in Path(self.hosts_file).read_text().splitlines():
            address, _, pid = line.partition(" ")
            if address == host and Path(f"/proc/{pid.strip()}").exists():
                return pid.strip()
        return None

    def argv(self, host: str, command: str) -> list[str]:
        pid = self.pid(host)
        if pid is None:  # the host is gone (or was never there): as ssh says it
            return ["sh", "-c", f"echo 'nsenter: host {host} is not there' >&2; exit {UNREACHABLE}"]
        return ["nsenter", "-t", pid, "-n", "-m", "-u", "sh", "-c", command]


@dataclass(frozen=True)
class NsenterOptions:
    hosts_file: str | None = None  # HOST or HOST:SLOTS a line
    connect_timeout_s: float = 10.0  # a host whose namespaces are gone answers at once; kept for the interface


class NsenterLauncher(OnHosts):
    name = "nsenter"
    Options = NsenterOptions

    def check_plan(self, plan: Any) -> None:
        if not self.options.hosts_file:
            raise ConfigError("launcher=nsenter: needs launcher.hosts_file=PATH (HOST or HOST:SLOTS a line)")
        if not os.environ.get(HOSTS_ENV):
            raise ConfigError(f"launcher=nsenter: needs ${HOSTS_ENV}, a file of ADDRESS PID lines")

    def hosts(self) -> list[HostSlots]:
        return read_hosts(self.options.hosts_file)

    def transport(self) -> Nsenter:
        return Nsenter(os.environ[HOSTS_ENV], float(self.options.connect_timeout_s))


def register(root: Path, entry_points: str = "nsenter = nsenter_launcher:NsenterLauncher\n") -> Path:
    """The distribution that registers the launcher (entry point group xp.launchers), under `root`."""
    info = root / "xp_nsenter-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xp-nsenter\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[xp.launchers]\n" + entry_points)
    return root


def install(root: Path, cluster: Any) -> dict[str, str]:
    """Register the launcher under `root` and write the cluster's hosts for it; returns the variables a process
    needs to find both."""
    register(root)  # (a launcher, as any plugin, is installed on every host: `root` must be seen there too)
    hosts = root / "nsenter-hosts"
    hosts.write_text("".join(f"{h.address} {h.holder.pid}\n" for h in cluster.workers))
    tests = str(Path(__file__).resolve().parent)
    return {"PYTHONPATH": os.pathsep.join([str(root), tests]), HOSTS_ENV: str(hosts)}
