"""Where a run's processes go and how they get there: the `Launcher` interface, and the launchers xp ships.

A launcher owns placement (this machine, the hosts it lists with their slots, a study's slots), the `Transport`
that runs a command on a host (xp/launching/hosts.py), the checks before anything starts, ending what a job left
on its hosts, and, for a batch system, whether this process submits the run or runs inside its allocation. Engines
(ps-lite, horovodrun, torchrun) ask it for hosts and transport; `xp.launching.job.Job` starts what they ask for.

Launchers register in the entry-point group `xp.launchers` (pyproject.toml), as backends do in `xp.backends`:
`launcher=NAME` picks one; a name registered twice is an error (docs/reference/plugins.md: "Adding a
launcher"). Each brings its own settings, the config group `launcher` (launcher.KEY=VALUE): a dataclass `Options`
it reads and checks itself (`read_options`); xp's document theirs in conf/launcher/NAME.yaml, another package's
come from it (`offer_options`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from xp.errors import ConfigError
from xp.launching.hosts import (SSH, HostSlots, Transport, check_here, end_together, exit_words, probe, reap, read_hosts,
                                start_there)
from xp.launching.slots import Slot
from xp.run.settings import LaunchSettings, number, text

if TYPE_CHECKING:
    from xp.run.plan import Plan

GROUP = "xp.launchers"
SHIPPED = ("local", "ssh", "slurm")  # named first where launchers are listed


@dataclass(frozen=True)
class NoOptions:
    """A launcher without settings of its own."""


class JobPlacement:
    """What a job's processes need from their launcher: where they go and how (hosts, address, transport), what
    is refused or checked before anything starts (check_plan, check), the hosts held and freed (reserve, reap),
    the variables it gives them (env), and, for a batch system, the run submitted from here (submits,
    check_submission, submit, submitted_run). The defaults are this machine's."""
    name: ClassVar[str]

    def check_plan(self, plan: Plan) -> None:
        """Refuse, when the run is planned (every job of a sweep before the first starts), what this launcher
        cannot launch (ConfigError, one line)."""

    def hosts(self) -> list[HostSlots]:
        """The hosts processes may go to, with their slots (remote launchers)."""
        return []

    def address(self) -> str | None:
        """This machine's address as the hosts reach it (remote launchers)."""
        return None

    def transport(self) -> Transport | None:
        return None

    def submits(self) -> bool:
        """The run goes to a batch system from here (`submit`) rather than being started by this process."""
        return False

    def check_submission(self) -> None:
        """Before a run is submitted: the batch system takes it (ConfigError, one line)."""

    def submit(self, plan: Plan, argv: list[str], tracker: Any) -> None:
        """Submit the run (`argv`: the command line) as a batch job, follow it to its end; XPError if it did not
        complete. The job's processes log into `tracker`'s run."""
        raise NotImplementedError

    def submitted_run(self) -> str | None:
        """Inside a batch job: the MLflow run the submitting process created."""
        return None

    def check(self, hosts: list[str], interface: str | None, interface_here: bool,
              before_probe: Callable[[], None] | None = None) -> None:
        """Everything checked before anything starts; `before_probe`: checks that need no host."""

    def reserve(self, placement: list[tuple[str, int]]) -> None:
        """Before a job's first process starts: hold each host's share of it, (host, processes) a host, all or
        none (a cluster's scheduler: Ray's placement group); one line (ConfigError) when it cannot. Released by
        `reap`."""

    def reap(self, hosts: list[str], job: str) -> None:
        """End, on every host, whatever carries the job's id."""

    def env(self, workers: int) -> dict[str, str]:
        """Variables every process of a job of `workers` processes gets from this launcher."""
        return {}


class StudySlots:
    """What a study's slots need from their launcher (xp.launching.pool: a long-lived trial worker on each): the
    study checked (check_study), its slots (slots), a worker started elsewhere and how it ended (start_worker,
    worker_ended, worker_lost), and slots that come and go (grow_every_s, grown). The defaults: this machine's
    slots, whose workers the pool starts itself."""
    name: ClassVar[str]

    def check_study(self, tracking_uri: str) -> None:
        """Before a study starts its workers: what its slots need (hosts that answer, a tracking store they reach),
        one line each (ConfigError)."""

    def slots(self, gpus_per_trial: int, parallel: int | None, trials_per_gpu: int) -> list[Slot]:
        """The slots this launcher offers a study whose trials take `gpus_per_trial` GPUs each (0: CPU trials):
        `parallel` of them (None: as many as there are). This machine's, here."""
        from xp.launching.slots import plan_slots

        return plan_slots(gpus_per_trial, parallel, trials_per_gpu)

    def start_worker(self, slot: Slot, command: dict[str, Any]) -> Any:
        """Start a study's worker on `slot`, elsewhere (a remote launcher; this machine's workers the pool starts
        itself): it runs command["argv"] with the variables command["env"], which hold its slot's secret (never on a
        command line), and calls the study's scheduler back. Returns the handle the pool keeps, with the calls of
        subprocess.Popen it makes: poll(), wait(timeout), terminate(), kill(), returncode."""
        raise NotImplementedError(f"launcher={self.name} places no study trials elsewhere")

    def worker_ended(self, handle: Any) -> str:
        """How a study's worker (`handle`) ended, in words ("it was killed by signal 9"); it is ended if it has
        not (SIGTERM, then SIGKILL)."""
        if end_together([handle], ((None, 10.0), ("kill", 10.0))):
            return "it did not end, not even on SIGKILL"
        return f"it {exit_words(handle.returncode)}"

    def worker_lost(self, slot: Slot, handle: Any) -> None:
        """The worker `start_worker` started for `slot` (`handle`) was lost (ended already); its replacement is
        started next."""

    @property
    def grow_every_s(self) -> float:
        """A site whose slots come and go (a cluster's nodes): how often the pool asks `grown` (0: never)."""
        return 0.0

    def grown(self, have: list[Slot], index: int) -> list[Slot]:
        """Slots it offers now beyond the study's (`have`: a node joined), numbered from `index`. Where slots come
        and go, a slot whose worker cannot be started again (its node lost, no room elsewhere) is dropped."""
        return []


class Launcher(JobPlacement, StudySlots):
    """A launcher: what a job's processes need (JobPlacement) and what a study's slots need (StudySlots), each
    with this machine's behaviour as its default, and the launcher's own settings. A launcher that sends
    processes to other hosts writes `hosts`, `transport` and `check_plan` (OnHosts has the rest); one that offers
    a study slots elsewhere writes `slots` and `start_worker`."""
    remote: ClassVar[bool] = False  # processes go to other hosts (through `transport`), not only this machine
    nodes: ClassVar[str] = "the hosts"  # what messages call the machines a submitted run's processes run on
    Options: ClassVar[type] = NoOptions  # its settings (config group `launcher`), with their defaults
    moved: ClassVar[dict[str, str]] = {}  # settings it had under other keys: old KEY (or PREFIX.) -> launcher.KEY
    sweeps: ClassVar[str] = ""  # a batch launcher: where a sweep's jobs go instead (its refusal says so)

    def __init__(self, settings: LaunchSettings | None = None):
        self.settings = settings or LaunchSettings(self.name)  # the plan's LaunchSettings
        self.options = self.read_options(self.settings.options)  # its own, checked

    @classmethod
    def read_options(cls, raw: dict[str, Any]) -> Any:
        """The launcher's own settings from its config group, checked: one line (ConfigError) per problem. This
        default refuses keys its Options lacks; a launcher checks the values' types and ranges itself."""
        known = [f.name for f in fields(cls.Options)]
        for key in raw:
            if key not in known:
                raise ConfigError(f"launcher.{key}: launcher={cls.name} has no such setting; its settings: "
                                  f"{', '.join(known) or 'none'}")
        return cls.Options(**raw)


class Local(Launcher):
    """Every process on this machine, every socket on 127.0.0.1."""
    name = "local"

    def check_plan(self, plan: Plan) -> None:
        if plan.checkpoint_dir:  # on this machine (a remote launcher's is on rank 0's host)
            from xp.run.plan import writable_folder

            writable_folder(str(plan.checkpoint_dir), "checkpoint_dir")

    def env(self, workers: int) -> dict[str, str]:
        if "OMP_NUM_THREADS" in os.environ:
            return {}
        # workers on one machine share its cores: N workers x all cores each would oversubscribe them
        return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


class OnHosts(Launcher):
    """Processes on other hosts reached through a transport: the hosts are probed before the job starts and
    reaped after it. Subclasses say which hosts and which transport."""
    remote = True

    def transport(self) -> Transport:
        raise NotImplementedError(f"{type(self).__name__}: a launcher on hosts says how a command reaches them")

    def address(self) -> str | None:
        return self.settings.host_ip

    def check(self, hosts: list[str], interface: str | None, interface_here: bool,
              before_probe: Callable[[], None] | None = None) -> None:
        check_here(self.address(), interface, interface_here=interface_here)
        if before_probe is not None:
            before_probe()
        probe(self.transport(), interface, hosts)

    def reap(self, hosts: list[str], job: str) -> None:
        reap(self.transport(), hosts, job)

    def check_study(self, tracking_uri: str) -> None:
        from xp.launching.reach import check_reachable

        hosts = [h.name for h in self.hosts()]
        self.check(hosts, None, False)
        check_reachable(tracking_uri, hosts, self.address())

    def slots(self, gpus_per_trial: int, parallel: int | None, trials_per_gpu: int) -> list[Slot]:
        from xp.launching.slots import host_slots

        return host_slots(self.hosts(), gpus_per_trial, parallel, trials_per_gpu)

    def start_worker(self, slot: Slot, command: dict[str, Any]) -> subprocess.Popen:
        """Through the transport, as a job's processes are started (xp.launching.hosts.start_there)."""
        return start_there(self.transport(), slot.host, command)


@dataclass(frozen=True)
class SshOptions:
    """launcher=ssh's settings (conf/launcher/ssh.yaml)."""
    hosts_file: str | None = None  # HOST or HOST:SLOTS a line
    config: str | None = None  # ssh -F
    identity: str | None = None  # ssh -i
    connect_timeout_s: float = 10.0


class Ssh(OnHosts):
    """The hosts of `launcher.hosts_file` (HOST or HOST:SLOTS a line), over ssh with xp's options."""
    name = "ssh"
    Options = SshOptions
    moved = {"hosts_file": "launcher.hosts_file", "ssh.": "launcher."}

    @classmethod
    def read_options(cls, raw: dict[str, Any]) -> SshOptions:
        o = super().read_options(raw)
        flat = {f"launcher.{k}": v for k, v in raw.items()}
        for key in ("hosts_file", "config", "identity"):  # their files are read when the hosts are
            text(flat, f"launcher.{key}")
        number({"launcher.connect_timeout_s": o.connect_timeout_s}, "launcher.connect_timeout_s", 1, 3600)
        return o

    def check_plan(self, plan: Plan) -> None:
        elastic = plan.elastic.enabled
        if not self.options.hosts_file and not elastic:
            raise ConfigError("launcher=ssh: needs launcher.hosts_file=PATH (HOST or HOST:SLOTS a line)")
        if elastic and not plan.checkpoint_dir:
            raise ConfigError("elastic.enabled=true launcher=ssh: needs checkpoint_dir=PATH on storage every host "
                              "and this machine share (rank 0 commits there; a relaunch resumes from it)")

    def hosts(self) -> list[HostSlots]:
        return read_hosts(self.options.hosts_file, "launcher.hosts_file")

    def transport(self) -> SSH:
        o = self.options
        for key, path in (("launcher.config", o.config), ("launcher.identity", o.identity)):
            if path and not Path(path).expanduser().is_file():
                raise ConfigError(f"{key}={path}: no such file")
        config, identity = (str(Path(p).expanduser()) if p else None for p in (o.config, o.identity))
        return SSH(config, identity, float(o.connect_timeout_s))


def launchers() -> Any:
    """The registry of launchers (entry-point group xp.launchers)."""
    from xp.run.entry_points import Registry

    return Registry(group=GROUP, base=Launcher, kind="launcher")


def gpus_here(config: dict[str, Any]) -> bool:
    """Whether a run's GPUs are this machine's: not a remote launcher's (a login node without GPUs, say)."""
    name, registry = (config.get("launcher") or {}).get("name"), launchers()
    return name not in registry.names() or not registry.load(name).remote


def launcher_for(plan: Plan) -> Launcher:
    """The plan's launcher, the plan checked against it."""
    registry, name = launchers(), plan.launch.launcher
    if name not in registry.names():  # a setting given wrong, not a broken plugin
        shipped = [n for n in SHIPPED if n in registry.names()]
        valid = [*shipped, *sorted(set(registry.names()) - set(shipped))]
        raise ConfigError(f"launcher={name!r}: not supported; valid: {', '.join(valid)}")
    launcher = registry.load(name)(plan.launch)
    launcher.check_plan(plan)
    if plan.elastic.enabled and launcher.remote and not plan.elastic.discovery:  # (xp.launching.hosts.hosts_for)
        raise ConfigError(f"elastic.enabled=true launcher={name}: needs elastic.discovery=FILE|SCRIPT listing the "
                          "hosts (HOST:SLOTS a line)")
    return launcher


def offer_options() -> None:
    """Offer every registered launcher as an option of the config group `launcher`: xp's own from
    conf/launcher/NAME.yaml, another package's from its Options dataclass (Hydra's ConfigStore), so
    launcher=NAME launcher.KEY=VALUE composes for it too."""
    from dataclasses import MISSING, asdict

    from hydra.core.config_store import ConfigStore

    from xp import shipped

    store, documented = ConfigStore.instance(), {p.stem for p in shipped("conf").glob("launcher/*.yaml")}
    for name in launchers().names():
        if name not in documented:
            options = launchers().load(name).Options
            if any(f.default is MISSING and f.default_factory is MISSING for f in fields(options)):
                raise ConfigError(f"launcher {name}: every field of its Options needs a default")
            store.store(group="launcher", name=name, node={"name": name, **asdict(options())})


def moved_key(key: str) -> tuple[str, str] | None:
    """A launcher's setting under the key it had before launchers brought their own (hosts_file, ssh.config,
    slurm.nodes): (the launcher, its key now), or None."""
    for name in launchers().names():
        for old, new in launchers().load(name).moved.items():
            if key == old or (old.endswith(".") and key.startswith(old)):
                return name, new + key[len(old):] if old.endswith(".") else new
    return None
