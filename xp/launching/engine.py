"""What a launch engine is: the spec of a job (what to run, where), the processes (roles) it starts, and the
small `Engine` interface each engine implements beside its framework (xp/mx/pslite.py, xp/mx/horovodrun.py,
xp/pt/torchrun.py). Where the roles go is the launcher's (xp/launching/launcher.py): an engine reads the
spec's hosts, transport and bind address, never the launcher's name. `xp.launching.job.Job` starts the roles
and watches them.
"""

from __future__ import annotations

import socket
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from xp.errors import ConfigError
from xp.launching.hosts import HostSlots, Transport, hosts_for
from xp.launching.launcher import Launcher, Local

if TYPE_CHECKING:
    from xp.run.plan import Plan


class JobHandle(Protocol):
    """What an engine knows of the job starting its roles (xp.launching.job.Job is one): its id, which every process
    carries, and its folder of files on this machine."""

    id: str
    folder: str

LOOPBACK = "127.0.0.1"


@dataclass
class Spec:
    """What to launch and where: built from the run's plan and its launcher (xp.launching.job.prepared)."""
    worker_argv: list[str]  # python -m MODULE arguments for every worker
    workers: int  # worker processes (torchrun: one per device and worker)
    servers: int = 1
    launcher: Launcher = field(default_factory=Local)  # where the processes go (placement, transport, checks)
    port: int | None = None  # the scheduler's / rendezvous port, None: a free one
    hosts: list[HostSlots] = field(default_factory=list)  # a remote launcher's hosts, with their slots
    host_ip: str | None = None  # a remote launcher: this machine's address as the hosts reach it
    interface: str | None = None  # a remote launcher: the network interface workers talk over
    transport: Transport | None = None  # a remote launcher: how a command runs on a host (ssh, srun, ...)
    timeout_s: float = 300.0  # a worker without progress for this long fails the job
    env: dict[str, str] = field(default_factory=dict)  # extra variables for every worker
    module: str = "xp"  # what the workers run (python -m MODULE): xp, or a benchmark's program

    @property
    def remote(self) -> bool:
        """The processes go to the hosts (through the transport), not only this machine."""
        return self.launcher.remote

    @property
    def to_hosts(self) -> Transport:
        """The transport of a job on other hosts (xp.launching.job.prepared gives every remote launcher's job its
        launcher's)."""
        if self.transport is None:
            raise RuntimeError("a job on other hosts was prepared without its transport")
        return self.transport

    @property
    def via(self) -> str:
        """How a command reaches the hosts: the transport's name (ssh, srun, ...; "local": this machine)."""
        return self.transport.name if self.transport is not None else "local"

    @property
    def bind(self) -> str:
        """The address this machine's servers (scheduler, rendezvous, progress) listen on."""
        return self.host_ip if self.remote and self.host_ip else LOOPBACK

    def used_hosts(self) -> list[str]:
        """The hosts the job's processes go to (a remote launcher), in placement order. Hosts of fewer slots than
        the workers (only an elastic job gets here so: prepared() refuses a fixed one): all of them, of which the
        job takes what it can use."""
        if self.remote and sum(h.slots for h in self.hosts) < self.workers:
            return [h.name for h in self.hosts]
        return [h for h, _ in self.placement()] if self.remote else []

    def placement(self, n: int | None = None) -> list[tuple[str, int]]:
        """(host, processes) for n processes (default: workers), filling each host's slots in order."""
        left, out = self.workers if n is None else n, []
        for h in self.hosts:
            take = min(left, h.slots)
            if take:
                out.append((h.name, take))
            left -= take
        if left > 0:
            have = sum(h.slots for h in self.hosts)
            raise ConfigError(f"workers: {self.workers} processes need {self.workers} slots; the hosts list "
                              f"{have} ({', '.join(f'{h.name}:{h.slots}' for h in self.hosts)})")
        return out


@dataclass
class Role:
    """One process the job starts."""
    name: str  # "scheduler", "worker 1", "torchrun on 10.0.0.2", ...
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    host: str | None = None  # None: this machine
    worker: bool = True  # the job has succeeded when every worker role exited 0
    runner: bool = False  # a runner (horovodrun, torchrun) that reports which of its processes failed
    service: bool = False  # serves the others until the workers finish (then ended, not waited for)


class Engine(ABC):
    """How one distributed engine starts its processes; one small object per engine, beside its framework."""
    name: ClassVar[str]
    interface_here: ClassVar[bool] = False  # across hosts: network_interface must exist on this machine too
    per_device: ClassVar[bool] = False  # a process per device and worker (torchrun), not one per worker
    forwarded: ClassVar[tuple[str, ...]] = ()  # prefixes of this process's variables remote processes get too
    not_inherited: ClassVar[tuple[str, ...]] = ()  # prefixes a local role takes from its Role.env only

    def __init__(self, spec: Spec):
        self.spec = spec

    @abstractmethod
    def roles(self, job: JobHandle) -> list[Role]:
        """The processes to start, in order."""

    @abstractmethod
    def describe(self) -> str:
        """One line: what runs where."""

    @classmethod
    def env_for(cls, plan: Plan) -> dict[str, str]:
        """Variables every process of a job of this plan gets."""
        return {}

    def check(self) -> None:
        """Refuse, before anything starts, what this engine cannot launch (ConfigError)."""

    def hosts(self) -> list[str]:
        """The hosts this job starts processes on (a remote launcher)."""
        return self.spec.used_hosts()

    def failed(self, line: str, exits: dict[int, int], state: dict[str, Any]) -> None:
        """Note in `exits` (rank -> exit code) what a runner's output line says failed."""

    def elastic_policy(self, plan: Plan, tracker: Any, launched: Any) -> Any:
        """How this engine's job follows elastic membership (elastic.enabled=true), if its runner restarts its
        workers itself (torchrun's elastic agent); None: xp relaunches the processes at epoch boundaries from the
        last commit (xp.launching.elastic.Elastic)."""
        return None


def prepared(plan: Plan, argv: list[str], engine_cls: type[Engine], launcher: Launcher, env: dict[str, str],
             elastic: bool = False, reached: Callable[[list[str], str | None], None] | None = None) -> Engine:
    """The plan's engine, placed and checked before anything starts. Placement: the launcher's hosts (elastic:
    the discovery source's), transport and address, and enough slots (torchrun starts a process per device and
    worker; the other engines a process per worker). Checks: the engine's own, then the launcher's (a remote
    one: this machine's address and interface, `reached(hosts, address)` (what the hosts must reach, such as
    the tracking store), and every host through the transport: those the job uses; elastic: every listed
    host)."""
    ls, forwarded = plan.launch, {**engine_cls.env_for(plan), **env}
    hosts = hosts_for(launcher, plan, elastic)
    processes = len(plan.devices) * plan.workers if engine_cls.per_device else plan.workers
    spec = Spec(argv, processes, plan.servers, launcher, ls.port, hosts, launcher.address(), ls.interface,
                launcher.transport(), ls.timeout_s, forwarded)
    if spec.remote and not elastic:
        spec.placement()  # enough slots
    engine = engine_cls(spec)
    engine.check()
    used = [h.name for h in hosts] if elastic else spec.used_hosts()
    before_probe = (lambda: reached([h.name for h in hosts], spec.host_ip)) if reached else None
    spec.env.update(launcher.env(processes))  # the launcher's own (local: each worker's share of the cores)
    launcher.check(used, ls.interface, engine.interface_here, before_probe)
    if spec.remote and not elastic:
        launcher.reserve(spec.placement())
    return engine


def python() -> str:
    return sys.executable


def worker_command(spec: Spec) -> list[str]:
    return [python(), "-m", spec.module, *spec.worker_argv]


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(port: int, host: str = LOOPBACK) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"port={port}: {host}:{port} is not free ({e.strerror}); "
                              "choose another port or leave port=null for a free one") from e
