"""Starting the processes of a distributed run, on this machine or on other hosts, and watching them.

Framework-neutral: an *engine* (xp/mx/pslite.py, xp/mx/horovodrun.py, xp/pt/torchrun.py) says which
processes a job needs, where and with what command (`Engine.roles`); the `Job` here starts them (locally,
or over ssh on the hosts of a hosts file), watches them and ends them.

- launcher=local: every process on this machine, every socket on 127.0.0.1.
- launcher=ssh: the processes on the hosts of `hosts_file` (HOST or HOST:SLOTS a line), started over ssh
  with the same command paths (the checkout and its .venv are at the same path on every host). Before
  anything starts every host is probed (reachable, key accepted, checkout present, network_interface
  there) and host_ip must be an address of this machine: each fails with one line.

Liveness crosses hosts: workers send progress datagrams (UDP: rank, host, pid, role) to a socket the
launcher binds on host_ip (127.0.0.1 locally), at most one a second. A worker that exits non-zero, whose
ssh connection drops, or that stays silent for dist_timeout_s fails the job, naming its rank and host.

Ending: local processes by the process groups the job created (and descendants seen); on every host, the
ssh sessions' wrappers (xp.remote run) end their process group when the launcher closes the session or
dies, and a last `xp.remote reap JOB` over ssh ends whatever carries the job's id (what horovodrun started
itself included). The launching process owns the MLflow run; rank 0 logs into it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import shutil
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import psutil

from xp.errors import ConfigError, XPError

LOOPBACK = "127.0.0.1"
WORKER_ENV = "XP_DIST_WORKER"  # set in workers: run as a worker, do not launch again
RUN_ENV = "XP_RUN_ID"  # the MLflow run the launcher created; rank 0 logs into it
PROGRESS_ENV = "XP_PROGRESS"  # ADDRESS:PORT of the launcher's progress socket (UDP)
JOB_ENV = "XP_JOB"  # the job's id: every process it starts, on any host, carries it
HOST_ENV = "XP_HOST"  # the host a process runs on, as the hosts file names it
ROLE_ENV = "XP_ROLE"  # the index of the role (process) the launcher started
HOSTS_ENV = "XP_HOSTS"  # the hosts the job occupies (its cost), counted by the launcher
CONNECT_ENV = "XP_CONNECT_TIMEOUT_S"  # how long a worker tries to reach the scheduler
NO_CHECKOUT = 97  # exit code of the remote probe command when the checkout or its Python is missing
# variables a remote process gets from the launcher's environment (the rest is the host's own)
FORWARDED = ("XP_", "MLFLOW_", "OMP_", "MXNET_", "PYTHON", "TORCH", "NCCL_", "GLOO_", "HOROVOD_", "DMLC_")


class LaunchError(XPError):
    exit_code = 1
    host: str | None = None  # the host whose process failed, where known


# --- settings ------------------------------------------------------------------------------------
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


def read_hosts(path: str) -> list[HostSlots]:
    try:
        hosts = parse_hosts(Path(path).expanduser().read_text(), f"hosts_file={path}")
    except OSError as e:
        raise ConfigError(f"hosts_file={path}: cannot read it ({e.strerror})") from None
    if not hosts:
        raise ConfigError(f"hosts_file={path}: lists no hosts (HOST or HOST:SLOTS a line)")
    return hosts


@dataclass(frozen=True)
class SSH:
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


@dataclass
class Spec:
    """What to launch; built from the run's plan by the CLI."""
    worker_argv: list[str]  # python -m MODULE arguments for every worker
    workers: int  # worker processes (torchrun: one per device and worker)
    servers: int = 1
    launcher: str = "local"  # local | ssh
    port: int | None = None  # the scheduler's / rendezvous port, None: a free one
    hosts: list[HostSlots] = field(default_factory=list)  # launcher=ssh
    host_ip: str | None = None  # launcher=ssh: this machine's address as the hosts reach it
    interface: str | None = None  # launcher=ssh: the network interface workers talk over
    ssh: SSH = field(default_factory=SSH)
    timeout_s: float = 300.0  # a worker without progress for this long fails the job
    env: dict[str, str] = field(default_factory=dict)  # extra variables for every worker
    on_poll: Callable[[], None] | None = None  # called every poll_s while the job runs (elastic discovery)
    poll_s: float = 1.0
    module: str = "xp"  # what the workers run (python -m MODULE): xp, or a benchmark's program

    @property
    def remote(self) -> bool:
        return self.launcher == "ssh"

    @property
    def bind(self) -> str:
        """The address this machine's servers (scheduler, rendezvous, progress) listen on."""
        return self.host_ip if self.remote and self.host_ip else LOOPBACK

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


# --- engines -------------------------------------------------------------------------------------
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
    interface_here: ClassVar[bool] = False  # launcher=ssh: network_interface must exist on this machine too

    def __init__(self, spec: Spec):
        self.spec = spec

    @abstractmethod
    def roles(self, job: Job) -> list[Role]:
        """The processes to start, in order."""

    @abstractmethod
    def describe(self) -> str:
        """One line: what runs where."""

    @classmethod
    def env_for(cls, plan: Any) -> dict[str, str]:
        """Variables every process of a job of this plan gets."""
        return {}

    def check(self) -> None:
        """Refuse, before anything starts, what this engine cannot launch (ConfigError)."""

    def hosts(self) -> list[str]:
        """The hosts this job starts processes on (launcher=ssh)."""
        return [h for h, _ in self.spec.placement()] if self.spec.remote else []

    def failed(self, line: str, exits: dict[int, int], state: dict[str, Any]) -> None:
        """Note in `exits` (rank -> exit code) what a runner's output line says failed."""


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


# --- worker side ---------------------------------------------------------------------------------
def check_scheduler() -> None:
    """In a ps-lite worker: fail with a clear error when the scheduler cannot be reached (MXNet would wait forever)."""
    role = os.environ.get("DMLC_ROLE")
    host, port = os.environ.get("DMLC_PS_ROOT_URI"), os.environ.get("DMLC_PS_ROOT_PORT")
    if role != "worker" or not host or not (port or "").isdigit():
        raise ConfigError("kvstore=dist_*: this process is not a parameter-server worker (DMLC_ROLE=worker, "
                          "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT are set by the launcher); "
                          "run it through python -m xp, which launches the roles")
    timeout = float(os.environ.get(CONNECT_ENV, "60"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(f"cannot reach the parameter-server scheduler at {host}:{port} within {timeout:g} s "
                                  "(DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT); is it running and reachable?") from None
            time.sleep(0.5)


_last_report = -1e9
_reporter: socket.socket | None = None


def report_progress(rank: int) -> None:
    """Worker side: tell the launcher this worker is alive and moving (called per batch; sends at most one
    datagram a second; advisory: a lost datagram only delays the next)."""
    global _last_report, _reporter
    target = os.environ.get(PROGRESS_ENV)
    now = time.monotonic()
    if not target or now - _last_report < 1.0:
        return
    # the host as the launcher names it: xp's remote roles are told; horovodrun tells the processes it starts
    host = os.environ.get(HOST_ENV) or os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    if _last_report < 0:
        sys.stdout.write(f"xp: worker rank {rank} is pid {os.getpid()} on {host}\n")  # one write: workers share a pipe
        sys.stdout.flush()
    _last_report = now
    address, _, port = target.rpartition(":")
    msg = json.dumps({"rank": rank, "pid": os.getpid(), "host": host,
                      "role": os.environ.get(ROLE_ENV)}).encode()
    try:
        if _reporter is None:
            _reporter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _reporter.sendto(msg, (address, int(port)))
    except (OSError, ValueError):
        pass


# --- the job -------------------------------------------------------------------------------------
@dataclass
class Started:
    role: Role
    proc: subprocess.Popen
    relay: threading.Thread | None = None


@dataclass
class Beat:
    at: float  # time.monotonic() of the last datagram
    host: str
    pid: int
    role: str | None


class Job:
    """Started processes, watched until every worker succeeded, one failed, or progress stopped."""

    def __init__(self, engine: Engine):
        self.engine, self.spec = engine, engine.spec
        self.id = uuid.uuid4().hex[:12]
        self.folder = tempfile.mkdtemp(prefix="xp-job-")  # the job's files on this machine (removed at the end)
        self.started: list[Started] = []
        self.progress = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.progress.bind((self.spec.bind, 0))
        self.progress.setblocking(False)
        self.beats: dict[int, Beat] = {}  # rank -> its last progress
        self.env = {WORKER_ENV: "1", JOB_ENV: self.id, **self.spec.env,
                    PROGRESS_ENV: f"{self.spec.bind}:{self.progress.getsockname()[1]}"}
        if not self.spec.remote and "OMP_NUM_THREADS" not in os.environ:
            # workers on one machine share its cores: N workers x all cores each would oversubscribe them
            self.env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.spec.workers))
        self.seen: dict[int, float] = {}  # local descendants: pid -> create time (ended too, if left over)
        self.exits: dict[int, int] = {}  # runners: rank -> exit code, from their reports
        self.runner_state: dict[str, Any] = {}
        self.began = time.monotonic()

    # --- starting ---
    def start(self, role: Role) -> Started:
        index = str(len(self.started))
        env = {**self.env, **role.env, ROLE_ENV: index, **({HOST_ENV: role.host} if role.host else {})}
        piped = role.host is not None or role.runner
        if role.host is None:
            inherited = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
            proc = subprocess.Popen(role.argv, env={**inherited, **env}, start_new_session=True, preexec_fn=_die_with_us,
                                    stdout=subprocess.PIPE if piped else None,
                                    stderr=subprocess.STDOUT if piped else None, text=piped)
        else:
            forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED) and k not in env}
            command = f"cd {shlex.quote(os.getcwd())} && exec {shlex.quote(python())} -m xp.remote run 2>&1"
            proc = subprocess.Popen(self.spec.ssh.argv(role.host, command), start_new_session=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # what to run goes through the session, not a command line (the environment may hold a password);
            # stdin then stays open: when it closes (the job ends, or this process dies) the host ends the process
            try:
                proc.stdin.write(json.dumps({"argv": role.argv, "env": {**forwarded, **env}}) + "\n")
                proc.stdin.flush()
            except OSError:
                pass  # ssh already gave up: its exit code says why, and the watch reports it
        s = Started(role, proc)
        if piped:
            s.relay = threading.Thread(target=self._relay, args=(s,), daemon=True)
            s.relay.start()
        self.started.append(s)
        return s

    def _relay(self, s: Started) -> None:
        """The process's output to ours (prefixed with its host when remote), noting what a runner reports."""
        prefix = f"[{s.role.host}] " if s.role.host else ""
        for line in s.proc.stdout:
            sys.stdout.write(prefix + line)
            if s.role.runner:
                self.engine.failed(line, self.exits, self.runner_state)
        sys.stdout.flush()

    def run(self) -> None:
        done = False
        try:
            for role in self.engine.roles(self):
                self.start(role)
            self._watch()
            done = True
        finally:
            self._end(grace_s=10.0 if done else 0.0)  # after a failure, nothing is worth waiting for

    # --- watching ---
    def _watch(self) -> None:
        polled = time.monotonic()
        while True:
            if self.spec.on_poll is not None and time.monotonic() - polled >= self.spec.poll_s:
                polled = time.monotonic()
                self.spec.on_poll()
            self._receive()
            self._remember_descendants()
            for s in self.started:
                code = s.proc.poll()
                if code not in (None, 0):
                    raise self._failure(s, code)
            if all(s.proc.poll() == 0 for s in self.started if s.role.worker):
                return
            self._check_progress()
            time.sleep(0.2)

    def _receive(self) -> None:
        while True:
            try:
                data = self.progress.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            try:
                m = json.loads(data)
                self.beats[int(m["rank"])] = Beat(time.monotonic(), str(m["host"]), int(m["pid"]), m.get("role"))
            except (ValueError, KeyError, TypeError):
                continue

    def _rank_of(self, s: Started) -> tuple[int | None, str | None]:
        index = str(self.started.index(s))
        for rank, b in self.beats.items():
            if b.role == index:
                return rank, b.host
        return None, s.role.host

    def _failure(self, s: Started, code: int) -> LaunchError:
        rank, host = self._rank_of(s)
        if s.relay is not None:
            s.relay.join(timeout=5)  # a runner reports which process failed first: read all it said
        failed = [(r, c) for r, c in self.exits.items() if c != 0] if s.role.runner else []
        if failed:
            rank, code = failed[0]
            host = self.beats[rank].host if rank in self.beats else host
        lost = s.role.host is not None and code == 255 and not failed
        if code > 128:
            code = 128 - code  # xp.remote run and the runners' shells: 128+N means signal N
        who = f"worker rank {rank}" if rank is not None else s.role.name
        where = f" on host {host}" if host and self.spec.remote else ""
        if lost:
            how = "lost its ssh connection (the host went down or became unreachable)"
        else:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        e = LaunchError(f"{who}{where} {how}; the other processes were stopped (its error is in the log above)")
        e.host = host
        if code == 2:
            e.exit_code = 2  # a configuration error, found by the worker
        return e

    def _check_progress(self) -> None:
        now, limit = time.monotonic(), self.spec.timeout_s
        if len(self.beats) < self.spec.workers and now - self.began > limit:
            missing = ""
            if self.spec.remote:
                seen = {b.host for b in self.beats.values()}
                silent = [h for h in self.engine.hosts() if h not in seen]
                missing = f"; nothing heard from {', '.join(silent)}" if silent else ""
            e = LaunchError(f"only {len(self.beats)} of {self.spec.workers} workers started within {limit:g} s "
                            f"(dist_timeout_s){missing}; the job was stopped")
            if self.spec.remote and len(silent) == 1:
                e.host = silent[0]
            raise e
        stale = {rank: now - b.at for rank, b in self.beats.items() if now - b.at > limit}
        if stale:
            # the others wait for it in a collective and may have gone silent first (reports are at most one a
            # second): name a worker the system stopped, else one on a host that no longer answers, else the
            # longest silent
            stopped, unreachable = self._stalled()
            rank = (stopped or unreachable or [max(stale, key=lambda r: stale[r])])[0]
            where = f" on host {self.beats[rank].host}" if self.spec.remote else ""
            e = LaunchError(f"worker rank {rank}{where} made no progress for {max(stale.values()):.0f} s "
                            f"(dist_timeout_s={limit:g}); the job was stopped")
            e.host = self.beats[rank].host
            raise e

    def _stalled(self) -> tuple[list[int], list[int]]:
        """Ranks whose process is stopped (asking each host), and ranks on hosts that do not answer."""
        local = {socket.gethostname(), LOOPBACK}
        stopped = [r for r, b in self.beats.items() if b.host in local and _is_stopped(b.pid)]
        remote = {b.host for b in self.beats.values() if b.host not in local}
        if not self.spec.remote or not remote:
            return stopped, []
        unreachable = []
        py = shlex.quote(python())
        answers = on_hosts(self.spec.ssh, sorted(remote), "", self.spec.ssh.connect_timeout_s + 5, command_for=lambda h: (
            f"{py} -m xp.remote state " + " ".join(str(b.pid) for b in self.beats.values() if b.host == h)))
        for host, r in answers.items():
            ranks = [rank for rank, b in self.beats.items() if b.host == host]
            if r.returncode != 0:
                unreachable += ranks
                continue
            states = json.loads(r.stdout.strip().splitlines()[-1])
            stopped += [rank for rank in ranks if states.get(str(self.beats[rank].pid)) == "T"]
        return stopped, unreachable

    def _remember_descendants(self) -> None:
        for s in self.started:
            if s.role.host is not None:
                continue
            try:
                for c in psutil.Process(s.proc.pid).children(recursive=True):
                    self.seen.setdefault(c.pid, c.create_time())
            except psutil.Error:
                continue

    # --- ending ---
    def _end(self, grace_s: float) -> None:
        """Whatever is left is ended: on the hosts first (sessions closed, then the job's id reaped), then
        each local role's process group and any descendant seen running."""
        deadline = time.monotonic() + grace_s
        for s in self.started:
            if not s.role.worker and not s.role.service:
                try:  # scheduler, servers, stores exit by themselves once the workers finished
                    s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for s in self.started:
            if s.role.host is not None and s.proc.stdin is not None:
                try:
                    s.proc.stdin.close()  # the host's wrapper ends its process group
                except OSError:
                    pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [s for s in self.started if s.proc.poll() is None]
            for s in alive:
                try:
                    os.killpg(s.proc.pid, sig)  # the group we created for it, nothing else
                except ProcessLookupError:
                    pass
            for s in alive:
                try:
                    s.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
        self._end_descendants()
        if self.spec.remote:
            reap(self.spec.ssh, self.engine.hosts(), self.id)
        self.progress.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _end_descendants(self) -> None:
        left = []
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:  # the same process, not a new one with a reused pid
                    p.kill()
                    left.append(p)
            except psutil.Error:
                continue
        psutil.wait_procs(left, timeout=5)


def _die_with_us() -> None:
    """In a local role's process, before it runs: the kernel ends it if the launcher dies (even by SIGKILL)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:  # gone, or not on this machine: nothing to tell
        return False


# --- hosts ---------------------------------------------------------------------------------------
def on_hosts(ssh: SSH, hosts: list[str], command: str, timeout: float,
             command_for: Callable[[str], str] | None = None) -> dict[str, subprocess.CompletedProcess]:
    """Run `command` (or command_for(host)) on every host at once over ssh; a host that does not answer in
    time gets code 255."""
    def one(host: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(ssh.argv(host, command_for(host) if command_for else command),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 255, "", f"no answer within {timeout:g} s")

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
        return dict(zip(hosts, pool.map(one, hosts)))


def reap(ssh: SSH, hosts: list[str], job: str) -> None:
    """End, on every host, whatever carries the job's id; a host that cannot be reached is noted."""
    command = f"{shlex.quote(python())} -m xp.remote reap {job}"
    for host, r in on_hosts(ssh, hosts, command, ssh.connect_timeout_s + 20).items():
        if r.returncode != 0:
            print(f"xp: could not reach {host} to end the job's processes there ({_ssh_error(r)})", flush=True)


def _ssh_error(r: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (r.stderr or "").splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {r.returncode}"


def local_addresses() -> dict[str, list[str]]:
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def preflight(spec: Spec, hosts: list[str], interface_here: bool = False) -> None:
    """launcher=ssh: refuse, before anything starts, an address or interface that is not there, a host that
    cannot be reached, refuses the key, or lacks the checkout. One line each (ConfigError)."""
    here = local_addresses()
    if not spec.host_ip:
        raise ConfigError("launcher=ssh: needs host_ip=ADDRESS, this machine's address as the hosts reach it "
                          f"(its addresses: {', '.join(a for v in here.values() for a in v)})")
    if not any(spec.host_ip in v for v in here.values()):
        raise ConfigError(f"host_ip={spec.host_ip}: not an address of this machine (its addresses: "
                          f"{', '.join(a for v in here.values() for a in v)})")
    if spec.interface and interface_here and spec.interface not in here:
        raise ConfigError(f"network_interface={spec.interface}: this machine has no such interface "
                          f"(it has: {', '.join(sorted(here))})")
    py, cwd = shlex.quote(python()), shlex.quote(os.getcwd())
    command = f"cd {cwd} 2>/dev/null && test -x {py} && exec {py} -m xp.remote probe; exit {NO_CHECKOUT}"
    for host, r in on_hosts(spec.ssh, hosts, command, spec.ssh.connect_timeout_s + 20).items():
        if r.returncode == NO_CHECKOUT or (r.returncode == 1 and "No module named" in r.stderr):
            raise ConfigError(f"host {host}: no xp checkout at {os.getcwd()} with its Python {python()} (the "
                              "checkout and its .venv must be at the same path on every host)")
        if r.returncode == 255:
            why = _ssh_error(r)
            hint = ("check ssh.identity / ssh.config" if "denied" in why.lower()
                    else "check the hosts file and that sshd runs there")
            raise ConfigError(f"host {host}: ssh failed ({why}); {hint}")
        if r.returncode != 0:
            raise ConfigError(f"host {host}: the probe failed ({_ssh_error(r)})")
        info = json.loads(r.stdout.strip().splitlines()[-1])
        if not info.get("resolves", True):
            raise ConfigError(f"host {host}: its own name {info['hostname']!r} does not resolve there (gloo and "
                              "ps-lite look it up); add the hosts' names to DNS or /etc/hosts")
        if spec.interface and spec.interface not in info["interfaces"]:
            raise ConfigError(f"network_interface={spec.interface}: host {host} has no such interface (it has: "
                              f"{', '.join(sorted(info['interfaces']))})")


def spec_for(plan: Any, argv: list[str], engine_cls: type[Engine], env: dict[str, str], elastic: bool = False) -> Spec:
    """The launch spec of a plan (its launch settings): hosts file read, ssh files checked."""
    ls = plan.launch
    for key, path in (("ssh.config", ls.ssh_config), ("ssh.identity", ls.ssh_identity)):
        if path and not Path(path).expanduser().is_file():
            raise ConfigError(f"{key}={path}: no such file")
    ssh = SSH(*(str(Path(p).expanduser()) if p else None for p in (ls.ssh_config, ls.ssh_identity)),
              ls.ssh_connect_timeout_s)
    hosts = read_hosts(ls.hosts_file) if ls.launcher == "ssh" and ls.hosts_file else []
    # torchrun starts a process per device and worker; the other engines a process per worker
    processes = len(plan.devices) * plan.workers if engine_cls.name == "torchrun" else plan.workers
    spec = Spec(argv, processes, plan.servers, ls.launcher, ls.port, hosts, ls.host_ip, ls.interface, ssh,
                ls.timeout_s, {**engine_cls.env_for(plan), **env})
    if spec.remote and not elastic:
        spec.placement()  # enough slots
    return spec


def prepare(engine: Engine, hosts: list[str] | None = None) -> None:
    """Everything checked before anything starts: the engine's own checks, then (launcher=ssh) the address,
    the interface and every host (default: those the job uses)."""
    engine.check()
    if engine.spec.remote:
        preflight(engine.spec, engine.hosts() if hosts is None else hosts, interface_here=engine.interface_here)


def launch(engine: Engine) -> None:
    """Run the job to the end; raise LaunchError (or ConfigError) when it fails."""
    Job(engine).run()
