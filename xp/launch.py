"""Starting the processes of a distributed run and watching them until they end.

Three engines: MXNet's parameter server (kvstore=dist_*: a scheduler, servers and
workers, told their roles through DMLC_* variables), Horovod (workers started by
horovodrun over gloo) and PyTorch DDP (processes started by torchrun, over gloo or
NCCL). `launcher=local` runs every process on this machine on 127.0.0.1 / lo (what the tests use); `ssh`, `mpi` and `slurm` hand the parameter-server
roles to the dmlc tracker that ships inside the mxnet wheel, with a hosts file.

The launching process owns the MLflow run: rank 0 logs into it, and the launcher ends it
FINISHED, or FAILED as soon as a worker dies or stops making progress. A worker blocked
in a collective cannot end the run itself. Workers report progress by touching a file
named by their pid (it holds their rank) in a folder the launcher gives them. Every wait
is bounded; the launcher ends only the processes it started and their descendants.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from xp.errors import ConfigError, XPError

LOOPBACK = "127.0.0.1"
WORKER_ENV = "XP_DIST_WORKER"  # set in workers: run as a worker, do not launch again
RUN_ENV = "XP_RUN_ID"  # the MLflow run the launcher created; rank 0 logs into it
HEARTBEAT_ENV = "XP_HEARTBEAT_DIR"  # where workers report progress
CONNECT_ENV = "XP_CONNECT_TIMEOUT_S"  # how long a worker tries to reach the scheduler


class LaunchError(XPError):
    exit_code = 1


@dataclass
class Spec:
    """What to launch; built from the run's config by the CLI."""
    engine: str  # "ps-lite", "horovod" or "torchrun"
    worker_argv: list[str]  # python -m xp arguments for every worker
    workers: int
    servers: int = 1
    launcher: str = "local"
    port: int | None = None  # the scheduler's port (ps-lite), None: a free one
    hosts_file: str | None = None  # ssh/mpi: one host per line (host[:ssh port] or "host slots=N")
    host_ip: str | None = None  # cluster launchers: the address workers reach the scheduler at
    timeout_s: float = 300.0  # a worker without progress for this long fails the job
    env: dict[str, str] = field(default_factory=dict)  # extra variables for every worker
    on_poll: Callable[[], None] | None = None  # called every poll_s while the job runs (elastic discovery)
    poll_s: float = 1.0


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


def report_progress(rank: int) -> None:
    """Worker side: record that this worker is alive and moving (called per batch; writes at most once a second)."""
    global _last_report
    folder = os.environ.get(HEARTBEAT_ENV)
    now = time.monotonic()
    if not folder or now - _last_report < 1.0:
        return
    _last_report = now
    try:
        (Path(folder) / str(os.getpid())).write_text(str(rank))
    except OSError:
        pass  # progress reports are advisory; training goes on


# --- commands ------------------------------------------------------------------------------------
def worker_command(spec: Spec) -> list[str]:
    return [sys.executable, "-m", "xp", *spec.worker_argv]


def dmlc_env(role: str, port: int, spec: Spec) -> dict[str, str]:
    return {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": LOOPBACK, "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NODE_HOST": LOOPBACK, "DMLC_NUM_SERVER": str(spec.servers), "DMLC_NUM_WORKER": str(spec.workers),
            "DMLC_INTERFACE": "lo"}


def horovod_command(spec: Spec) -> list[str]:
    # horovodrun, with its rendezvous server on 127.0.0.1 (xp/horovodrun.py)
    return [sys.executable, "-m", "xp.horovodrun", "--gloo", "-np", str(spec.workers), "-H", f"{LOOPBACK}:{spec.workers}",
            "--network-interfaces", "lo", "--start-timeout", str(int(spec.timeout_s)), "--disable-cache",
            *worker_command(spec)]


def torchrun_command(spec: Spec, port: int) -> list[str]:
    # torchrun, with its rendezvous store on 127.0.0.1 (xp/torchrun.py); a failed process ends the job
    return [sys.executable, "-m", "xp.torchrun", "--nnodes=1", f"--nproc-per-node={spec.workers}",
            f"--master-addr={LOOPBACK}", f"--master-port={port}", "--max-restarts=0", "--monitor-interval=0.5",
            "-m", "xp", *spec.worker_argv]


def cluster_command(spec: Spec) -> list[str]:
    """The dmlc tracker command for launcher=ssh/mpi/slurm: it runs the scheduler here and the servers
    and workers on the cluster (ssh to each host, mpirun --hostfile, or srun)."""
    if spec.launcher in ("ssh", "mpi") and not spec.hosts_file:
        raise ConfigError(f"launcher={spec.launcher}: needs hosts_file=PATH (one host per line)")
    if spec.hosts_file:
        hosts = Path(spec.hosts_file).expanduser()
        if not hosts.is_file() or not any(line.strip() for line in hosts.read_text().splitlines()):
            raise ConfigError(f"hosts_file={spec.hosts_file}: no such file, or it lists no hosts")
    # xp's own variables travel in the command: the ssh launcher forwards only DMLC_* and a few others
    env = {WORKER_ENV: "1", **spec.env}
    inner = ["env", *(f"{k}={v}" for k, v in env.items()), *worker_command(spec)]
    code = (f"import sys, dmlc_tracker.opts as o, dmlc_tracker.{spec.launcher} as m; "
            "m.submit(o.get_opts(sys.argv[1:]))")
    cmd = [sys.executable, "-c", code, "--cluster", spec.launcher, "--num-workers", str(spec.workers),
           "--num-servers", str(spec.servers)]
    if spec.hosts_file:
        cmd += ["--host-file", str(Path(spec.hosts_file).expanduser())]
    if spec.host_ip:
        cmd += ["--host-ip", spec.host_ip]
    return [*cmd, *inner]


# --- running -------------------------------------------------------------------------------------
@dataclass
class Role:
    name: str
    proc: subprocess.Popen


class Job:
    """Started processes, watched until every worker succeeded, one failed, or progress stopped."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.roles: list[Role] = []
        self.workers: list[Role] = []
        self.beats = Path(tempfile.mkdtemp(prefix="xp-progress-"))
        self.base = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
        self.base.update({HEARTBEAT_ENV: str(self.beats), WORKER_ENV: "1", **spec.env})
        if spec.launcher == "local" and "OMP_NUM_THREADS" not in os.environ:
            # workers on one machine share its cores: N workers x all cores each would oversubscribe them
            self.base["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // spec.workers))
        self.seen: dict[int, float] = {}  # descendants: pid -> create time (ended too, if left over)
        self.exits: dict[int, int] = {}  # horovod, torchrun: rank -> exit code, from the runner's report
        self.started = time.monotonic()
        self.relay: threading.Thread | None = None  # horovod, torchrun: the thread reading the runner's output

    def start(self, name: str, argv: list[str], env: dict[str, str], worker: bool, pipe: bool = False) -> Role:
        proc = subprocess.Popen(argv, env={**self.base, **env}, start_new_session=True,  # its own process group
                                stdout=subprocess.PIPE if pipe else None, stderr=subprocess.STDOUT if pipe else None,
                                text=pipe)
        role = Role(name, proc)
        self.roles.append(role)
        if worker:
            self.workers.append(role)
        return role

    def run(self) -> None:
        done = False
        try:
            self._watch()
            done = True
        finally:
            self._end(grace_s=10.0 if done else 0.0)  # after a failure, nothing is worth waiting for

    # a worker's rank, as it reported it (ps-lite assigns ranks in the order workers reach the scheduler)
    def _rank(self, pid: int) -> str | None:
        try:
            return (self.beats / str(pid)).read_text().strip() or None
        except OSError:
            return None

    def _watch(self) -> None:
        polled = time.monotonic()
        while True:
            if self.spec.on_poll is not None and time.monotonic() - polled >= self.spec.poll_s:
                polled = time.monotonic()
                self.spec.on_poll()
            self._remember_descendants()
            for r in self.roles:
                code = r.proc.poll()
                if code not in (None, 0):
                    raise self._failure(r, code)
            if all(w.proc.poll() == 0 for w in self.workers):
                return
            self._check_progress()
            time.sleep(0.2)

    def _failure(self, role: Role, code: int) -> LaunchError:
        what = role.name
        rank = self._rank(role.proc.pid)
        if self.relay is not None:
            self.relay.join(timeout=5)  # the runner reported which worker failed first: read all it said
            failed = [(r, c) for r, c in self.exits.items() if c != 0]
            if failed:
                rank, code = str(failed[0][0]), failed[0][1]
                if code > 128:
                    code = 128 - code  # horovodrun runs workers through a shell: 128+N means signal N
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        who = f"worker rank {rank}" if rank is not None else what
        e = LaunchError(f"{who} {how}; the other processes were stopped (its error is in the log above)")
        if code == 2:
            e.exit_code = 2  # a configuration error, found by the worker
        return e

    def _check_progress(self) -> None:
        now_wall, age_limit = time.time(), self.spec.timeout_s
        beats = {}  # rank -> (seconds since its last progress, pid)
        for f in self.beats.iterdir():
            try:
                beats[f.read_text().strip()] = (now_wall - f.stat().st_mtime, int(f.name))
            except (OSError, ValueError):
                continue
        waited = time.monotonic() - self.started
        if len(beats) < self.spec.workers and waited > age_limit:
            raise LaunchError(f"only {len(beats)} of {self.spec.workers} workers started within {age_limit:g} s "
                              "(dist_timeout_s); the job was stopped")
        stale = {rank: age_pid for rank, age_pid in beats.items() if age_pid[0] > age_limit}
        if stale:
            # the others wait for it in a collective and may have gone silent first (reports are at most one a
            # second): name a worker the system stopped, stale or not yet, else the longest silent
            stopped = [rank for rank, (_, pid) in beats.items() if _is_stopped(pid)]
            rank = stopped[0] if stopped else max(stale, key=lambda r: stale[r][0])
            silent = max(age for age, _ in stale.values())
            raise LaunchError(f"worker rank {rank} made no progress for {silent:.0f} s (dist_timeout_s={age_limit:g}); "
                              "the job was stopped")

    def _remember_descendants(self) -> None:
        for r in self.roles:
            try:
                for c in psutil.Process(r.proc.pid).children(recursive=True):
                    self.seen.setdefault(c.pid, c.create_time())
            except psutil.Error:
                continue

    def _end(self, grace_s: float) -> None:
        """Whatever is left is ended: each role's process group, then any descendant seen running."""
        deadline = time.monotonic() + grace_s
        for r in self.roles:
            if r in self.workers:
                continue  # scheduler and servers exit by themselves once the workers finished
            try:
                r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [r for r in self.roles if r.proc.poll() is None]
            for r in alive:
                try:
                    os.killpg(r.proc.pid, sig)  # the group we created for it, nothing else
                except ProcessLookupError:
                    pass
            for r in alive:
                try:
                    r.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
        self._end_descendants()
        for f in self.beats.iterdir():
            f.unlink(missing_ok=True)
        self.beats.rmdir()

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


def _is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:  # gone: nothing to tell
        return False


def validate(spec: Spec) -> None:
    """Refuse, before anything starts, what cannot launch: a taken port, a missing hosts file or horovodrun."""
    if spec.engine == "torchrun":
        if spec.launcher != "local":
            raise ConfigError(f"launcher={spec.launcher}: backend=torch launches with torchrun on this machine "
                              "(launcher=local); across hosts run torchrun on each host yourself with XP_DIST_WORKER=1")
        if spec.port:
            check_port(spec.port)
    elif spec.engine == "horovod":
        if spec.launcher != "local":
            raise ConfigError(f"launcher={spec.launcher}: backend=horovod launches with horovodrun on this machine "
                              "(launcher=local); across hosts run horovodrun -H yourself with XP_DIST_WORKER=1")
        import importlib.util

        if importlib.util.find_spec("horovod.runner") is None:
            raise ConfigError("backend=horovod: horovodrun (horovod.runner) is not installed; ./dev.sh setup "
                              "builds Horovod against the installed mxnet")
    elif spec.launcher == "local":
        if spec.port:
            check_port(spec.port)
    else:
        cluster_command(spec)


def launch(spec: Spec) -> None:
    """Run the job to the end; raise LaunchError (or ConfigError) when it fails."""
    job = Job(spec)
    if spec.engine in ("horovod", "torchrun"):  # one runner starts the workers and reports which one failed
        if spec.engine == "horovod":
            role = job.start("horovodrun", horovod_command(spec), {}, worker=True, pipe=True)
        else:
            role = job.start("torchrun", torchrun_command(spec, spec.port or free_port()),
                             {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}, worker=True, pipe=True)
        job.relay = threading.Thread(target=_relay, args=(role.proc, job.exits), daemon=True)
        job.relay.start()
    elif spec.launcher == "local":
        port = spec.port or free_port()
        if spec.port:
            check_port(port)
        # importing mxnet with DMLC_ROLE=scheduler/server runs that role until the job ends
        job.start("scheduler", [sys.executable, "-c", "import mxnet"], dmlc_env("scheduler", port, spec), worker=False)
        for i in range(spec.servers):
            job.start(f"server {i}", [sys.executable, "-c", "import mxnet"], dmlc_env("server", port, spec),
                      worker=False)
        for i in range(spec.workers):
            job.start(f"worker {i}", worker_command(spec), dmlc_env("worker", port, spec), worker=True)
    else:
        job.start(f"dmlc tracker ({spec.launcher})", cluster_command(spec), {}, worker=True)
    job.run()


_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)")  # horovodrun
_TORCH_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")  # torchrun's failure summary: rank, then exitcode
_TORCH_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def _relay(proc: subprocess.Popen, exits: dict[int, int]) -> None:
    """The runner's output to ours, noting which worker process failed (first) and how."""
    rank = None
    for line in proc.stdout:
        sys.stdout.write(line)
        m = _EXIT.search(line)
        if m:
            exits.setdefault(int(m.group(1)), int(m.group(2)))
        if "Root Cause" in line:  # torchrun names the first failure here, the others before it
            exits.clear()
        m = _TORCH_RANK.match(line)
        if m:
            rank = int(m.group(1))
        m = _TORCH_EXIT.match(line)
        if m and rank is not None:
            exits.setdefault(rank, int(m.group(1)))
    sys.stdout.flush()


def describe(spec: Spec) -> str:
    if spec.engine == "torchrun":
        return f"{spec.workers} PyTorch DDP processes (torchrun) on {LOOPBACK}"
    if spec.engine == "horovod":
        return f"{spec.workers} Horovod workers (gloo) on {LOOPBACK}"
    where = f"on {LOOPBACK}" if spec.launcher == "local" else f"through the dmlc tracker ({spec.launcher})"
    return f"{spec.workers} workers and {spec.servers} servers {where}"
