"""Reaching other hosts: hosts files, the `Transport` interface (how a command runs on a host: ssh here, srun in
xp/launching/slurm.py, a test's nsenter), probing the hosts before a job starts (xp.launching.remote probe), and
ending what a job left there (xp.launching.remote reap).

`python -m xp.launching.hosts as-ssh MODULE:CLASS JSON [SSH OPTIONS] HOST COMMAND...` runs COMMAND on HOST
through the transport CLASS(**JSON): what a runner that reaches hosts itself with ssh (horovodrun) runs as its
`ssh` when the transport is not ssh.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import psutil

from xp.errors import ConfigError
from xp.interrupts import CTRL_C_ONCE_HANDLED
from xp.run import spot

if TYPE_CHECKING:
    from xp.run.plan import Plan


NO_CHECKOUT = 97  # exit code of the remote probe command when the checkout or its Python is missing


@dataclass(frozen=True)
class HostSlots:
    name: str  # an address or a name ssh resolves
    slots: int  # processes it takes


def parse_hosts(text: str, what: str) -> list[HostSlots]:
    """`HOST`, `HOST:SLOTS` or `HOST slots=N` a line (# comments); a host listed twice adds its slots."""
    hosts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([^\s:]+)(?::(\d+)|\s+slots=(\d+))?", line)
        if not m or int(m.group(2) or m.group(3) or 1) < 1:
            raise ConfigError(f"{what}: {line!r} is not HOST, HOST:SLOTS or 'HOST slots=N' (slots >= 1)")
        hosts[m.group(1)] = hosts.get(m.group(1), 0) + int(m.group(2) or m.group(3) or 1)
    return [HostSlots(h, n) for h, n in hosts.items()]


def read_hosts(path: str, key: str = "launcher.hosts_file") -> list[HostSlots]:
    try:
        hosts = parse_hosts(Path(path).expanduser().read_text(), f"{key}={path}")
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot read it ({e.strerror})") from None
    if not hosts:
        raise ConfigError(f"{key}={path}: lists no hosts (HOST or HOST:SLOTS a line)")
    return hosts


def discovered_hosts(source: str, timeout_s: float = 10.0) -> list[HostSlots]:
    """The hosts and slots the discovery source lists now."""
    path = Path(source).expanduser()
    if os.access(path, os.X_OK) and path.is_file():
        try:
            out = subprocess.run([str(path)], capture_output=True, text=True, timeout=timeout_s, check=True).stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise ConfigError(f"elastic.discovery={source}: the script failed ({type(e).__name__})") from None
    else:
        try:
            out = path.read_text()
        except OSError as e:
            raise ConfigError(f"elastic.discovery={source}: cannot read it ({e.strerror})") from None
    return parse_hosts(out, f"elastic.discovery={source}")


class Transport(ABC):
    """How a shell command runs on one host. A transport is a dataclass: `as_ssh` rebuilds it in another
    process from its fields."""
    name: ClassVar[str]
    connect_timeout_s: float

    @abstractmethod
    def argv(self, host: str, command: str) -> list[str]:
        """The command line that runs the shell command `command` on `host`, its stdin and stdout joined to ours."""

    def as_ssh(self) -> str:
        """A shell command that takes ssh's arguments ([OPTIONS] HOST COMMAND...) and runs COMMAND on HOST through
        this transport: what runners that start remote processes themselves with ssh (horovodrun) are given."""
        cls = type(self)
        return shlex.join([sys.executable, "-m", "xp.launching.hosts", "as-ssh", f"{cls.__module__}:{cls.__qualname__}",
                           json.dumps(asdict(self))])  # type: ignore[call-overload]  # a dataclass


def ssh_arguments(args: list[str]) -> tuple[str, str]:
    """(host, command) of ssh's arguments: options come before and after the host (horovodrun puts some after)."""
    def options(i: int) -> int:
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in ("-o", "-p", "-i", "-F", "-l", "-E") else 1
        return i

    i = options(0)
    if i >= len(args):
        raise SystemExit("as-ssh: no host given")
    return args[i], " ".join(args[options(i + 1):]) or "true"


@dataclass(frozen=True)
class SSH(Transport):
    name: ClassVar[str] = "ssh"
    config: str | None = None  # ssh_config file (ssh -F)
    identity: str | None = None  # private key (ssh -i)
    connect_timeout_s: float = 10.0

    def options(self) -> list[str]:
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(self.connect_timeout_s))}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if self.config:
            opts[:0] = ["-F", self.config]
        if self.identity:
            opts += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        return opts

    def argv(self, host: str, command: str) -> list[str]:
        return ["ssh", *self.options(), host, command]

    def as_ssh(self) -> str:
        real = shutil.which("ssh") or "/usr/bin/ssh"  # the real one, not a shim earlier on PATH
        return shlex.join([real, *self.options()])


def on_hosts(ssh: Transport, hosts: list[str], command: str, timeout: float,
             command_for: Callable[[str], str] | None = None) -> dict[str, subprocess.CompletedProcess]:
    """Run `command` (or command_for(host)) on every host at once through the transport; a host that does not
    answer in time gets code 255."""
    def one(host: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(ssh.argv(host, command_for(host) if command_for else command),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 255, "", f"no answer within {timeout:g} s")

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
        return dict(zip(hosts, pool.map(one, hosts)))


def reap(ssh: Transport, hosts: list[str], job: str) -> None:
    """End, on every host, whatever carries the job's id; a host that cannot be reached is noted."""
    command = f"{shlex.quote(sys.executable)} -m xp.launching.remote reap {job}"
    for host, r in on_hosts(ssh, hosts, command, ssh.connect_timeout_s + 20).items():
        if r.returncode != 0:
            print(f"xp: could not reach {host} to end the job's processes there ({_ssh_error(r)})", flush=True)


def _ssh_error(r: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (r.stderr or "").splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {r.returncode}"


def local_addresses() -> dict[str, list[str]]:
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def check_here(host_ip: str | None, interface: str | None, interface_here: bool = False) -> None:
    """launcher=ssh, on this machine: host_ip is one of its addresses (and the interface is here, where the
    engine needs it). One line each (ConfigError)."""
    here = local_addresses()
    if not host_ip:
        raise ConfigError("launcher=ssh: needs host_ip=ADDRESS, this machine's address as the hosts reach it "
                          f"(its addresses: {', '.join(a for v in here.values() for a in v)})")
    if not any(host_ip in v for v in here.values()):
        raise ConfigError(f"host_ip={host_ip}: not an address of this machine (its addresses: "
                          f"{', '.join(a for v in here.values() for a in v)})")
    if interface and interface_here and interface not in here:
        raise ConfigError(f"network_interface={interface}: this machine has no such interface "
                          f"(it has: {', '.join(sorted(here))})")


def probe(ssh: Transport, interface: str | None, hosts: list[str]) -> None:
    """launcher=ssh: every host at once, over ssh: reachable, the key accepted, the checkout and its Python at
    this path, the interface there, its own name resolving. One line each (ConfigError)."""
    py, cwd = shlex.quote(sys.executable), shlex.quote(os.getcwd())
    command = f"cd {cwd} 2>/dev/null && test -x {py} && exec {py} -m xp.launching.remote probe; exit {NO_CHECKOUT}"
    for host, r in on_hosts(ssh, hosts, command, ssh.connect_timeout_s + 20).items():
        if r.returncode == NO_CHECKOUT or (r.returncode == 1 and "No module named" in r.stderr):
            raise ConfigError(f"host {host}: no xp checkout at {os.getcwd()} with its Python {sys.executable} (the "
                              "checkout and its .venv must be at the same path on every host)")
        if r.returncode == 255:
            why = _ssh_error(r)
            hint = ("check launcher.identity / launcher.config" if "denied" in why.lower()
                    else "check the hosts file and that sshd runs there")
            raise ConfigError(f"host {host}: ssh failed ({why}); {hint}")
        if r.returncode != 0:
            raise ConfigError(f"host {host}: the probe failed ({_ssh_error(r)})")
        info = json.loads(r.stdout.strip().splitlines()[-1])
        if not info.get("resolves", True):
            raise ConfigError(f"host {host}: its own name {info['hostname']!r} does not resolve there (gloo and "
                              "ps-lite look it up); add the hosts' names to DNS or /etc/hosts")
        if interface and interface not in info["interfaces"]:
            raise ConfigError(f"network_interface={interface}: host {host} has no such interface (it has: "
                              f"{', '.join(sorted(info['interfaces']))})")


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[0] != "as-ssh":
        raise SystemExit("usage: python -m xp.launching.hosts as-ssh MODULE:CLASS JSON [OPTIONS] HOST COMMAND...")
    import importlib

    module, _, name = argv[1].partition(":")
    transport = getattr(importlib.import_module(module), name)(**json.loads(argv[2]))
    command = transport.argv(*ssh_arguments(argv[3:]))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])


def hosts_for(launcher: Any, plan: Plan, elastic: bool) -> list[HostSlots]:
    """The hosts a job starts on: the launcher's, or (elastic, remote) those the discovery source lists now."""
    if elastic and launcher.remote:
        assert plan.elastic.discovery is not None  # required with the plan (launcher_for)
        pool = discovered_hosts(plan.elastic.discovery)
        trace = plan.elastic.trace
        if trace and spot.peak(trace) > len(pool):
            raise ConfigError(f"elastic.trace: offers up to {spot.peak(trace)} hosts, but elastic.discovery="
                              f"{plan.elastic.discovery} lists {len(pool)}: the trace's hosts are the first of that "
                              "list, one instance each")
        return pool
    return launcher.hosts()


def exit_words(code: int) -> str:
    """How a process ended, as xp says it. 128+N, what xp.launching.remote run (for a process on another host) and
    shells say of one killed by signal N, reads as that signal."""
    if code == 255:  # ssh's, and a Ray driver's, for a host it could not reach or lost
        return "exited with code 255 (its host unreachable or lost)"
    if code > 128:
        code = 128 - code
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def end_together(procs: list[Any], steps: tuple[tuple[str | None, float], ...]) -> list[Any]:
    """End processes this one started (subprocess.Popen, or a handle with its poll, wait, terminate and kill),
    all at once: each (step, grace_s) is given to those still running ("terminate", "kill"; None: they were told
    to leave already, only wait), then grace_s for all of them together. Returns those that outlived every step."""
    for step, grace_s in steps:
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return []
        if step:
            for p in alive:
                getattr(p, step)()
        deadline = time.monotonic() + grace_s
        for p in alive:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    return [p for p in procs if p.poll() is None]


def start_there(transport: Transport, host: str, command: dict[str, Any], output: bool = False,
                own_session: bool = False) -> subprocess.Popen:
    """Run command["argv"] with the variables command["env"] on `host`, in this folder, through
    xp.launching.remote run:
    what to run goes through the session's stdin, never a command line (the variables may hold a password or a
    slot's secret); stdin then stays open, and when it closes (the caller ends it, or this process dies) the
    host ends the process group. `output`: its output comes back on the handle's stdout (text), else it goes
    where this process's does. `own_session`: Ctrl-C at the terminal does not reach it (a job's processes, which
    the job ends itself); else it does, as it reaches this process (a study's workers: their trials end KILLED)."""
    # Ctrl-C ignored until xp.launching.remote handles it (ends argv's group)
    shell = (f"cd {shlex.quote(os.getcwd())} && {CTRL_C_ONCE_HANDLED} {shlex.quote(sys.executable)} "
             "-m xp.launching.remote run")
    proc = subprocess.Popen(transport.argv(host, shell + (" 2>&1" if output else "")),
                            start_new_session=own_session, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE if output else None,
                            stderr=subprocess.STDOUT if output else None, text=True)
    assert proc.stdin is not None  # a pipe: asked for above
    try:
        proc.stdin.write(json.dumps(command) + "\n")
        proc.stdin.flush()
    except OSError:
        pass  # the transport already gave up: its exit code says why
    return proc
