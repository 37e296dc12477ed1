"""launcher=slurm: a distributed run as a Slurm job.

From a login node (no SLURM_JOB_ID): `submit` checks the job against the cluster (partition, nodes), creates
the MLflow run, submits `python -m xp` with the same arguments as a batch job (sbatch: nodes, tasks per node,
GPUs, time limit, account), relays its output and follows it with `scontrol show job` until it ends. Ctrl-C or
SIGTERM cancel it (scancel). A job Slurm ends (time limit, node failure, cancelled) ends the run FAILED with
Slurm's state and reason (tags xp.slurm.state, xp.slurm.reason).

Inside the allocation (SLURM_JOB_ID set): the job's nodes are the hosts and `srun` is the transport in place
of ssh (`Srun`: one task on one node, sharing the allocation), so every engine (ps-lite, Horovod, torchrun)
starts its roles as it does over ssh; this node's address (scontrol's NodeAddr) is host_ip. The run is the
one the submitting process created (XP_RUN_ID).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from xp.errors import ConfigError, Terminated, XPError, one_line
from xp.launching.hosts import HostSlots, Transport

if TYPE_CHECKING:
    from xp.run.plan import Plan


class SlurmState(StrEnum):
    """A Slurm job's state as sacct and scontrol say it (its base state: the first word)."""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    UNKNOWN = "UNKNOWN"


ENDED = (SlurmState.COMPLETED, SlurmState.FAILED, SlurmState.CANCELLED, SlurmState.TIMEOUT, SlurmState.NODE_FAIL,
         SlurmState.OUT_OF_MEMORY, SlurmState.PREEMPTED, SlurmState.BOOT_FAIL, SlurmState.DEADLINE)


CANCEL_WAIT_S = 60  # after scancel, how long xp waits for the job to have ended
UNKNOWN_AFTER_S = 120  # a job scontrol cannot show for this long (purged, or slurmctld gone) has ended for xp


class SlurmError(XPError):
    exit_code = 1


def inside() -> bool:
    """This process runs in a Slurm allocation."""
    return bool(os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_JOB_NODELIST"))


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ConfigError(f"launcher=slurm: {argv[0]} is not on PATH (Slurm's client commands are needed)") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"launcher=slurm: {' '.join(argv[:3])} did not answer within {timeout:g} s "
                          "(is slurmctld up?)") from None


@dataclass(frozen=True)
class Srun(Transport):
    """The transport inside an allocation, in place of ssh: one task on one node of the job."""
    name: ClassVar[str] = "srun"
    connect_timeout_s: float = 10.0

    def argv(self, host: str, command: str) -> list[str]:
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap", "--quiet",
                "--kill-on-bad-exit=1", "bash", "-c", command]


def allocation(tasks_per_node: int) -> tuple[list[HostSlots], str]:
    """This allocation's nodes (each with tasks_per_node slots) and this node's address as the others reach it."""
    r = _run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]])
    names = r.stdout.split()
    if r.returncode != 0 or not names:
        raise ConfigError(f"launcher=slurm: cannot read this allocation's nodes ({r.stderr.strip()})")
    first = _field(_show("node", names[0]), "NodeAddr") or names[0]
    return [HostSlots(n, tasks_per_node) for n in names], _address_towards(first)


def _address_towards(node: str) -> str:
    """This machine's address as `node` reaches it: a batch job's first node, or the login node under salloc
    (a UDP socket's route; nothing is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(node), 9))
            return s.getsockname()[0]
        except OSError as e:
            raise ConfigError(f"launcher=slurm: no route to node {node} from here ({e.strerror}); give "
                              "host_ip=ADDRESS") from None


def _show(kind: str, name: str) -> str:
    r = _run(["scontrol", "show", "-o", kind, name])
    return r.stdout if r.returncode == 0 else ""


def clip(text: str, limit: int) -> str:
    """Slurm's message on one line, cut at a word boundary (never mid-word) when longer than `limit`."""
    text = one_line(text)
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def _field(record: str, key: str) -> str | None:
    for part in record.split():
        if part.startswith(key + "="):
            return part.split("=", 1)[1]
    return None


@dataclass(frozen=True)
class SlurmOptions:
    """launcher=slurm's settings (conf/launcher/slurm.yaml): the job xp submits, or a study's worker jobs."""
    partition: str | None = None
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    time_min: int = 60
    account: str | None = None
    output_dir: str = "slurm"
    poll_s: float = 2.0

    @classmethod
    def read(cls, raw: dict[str, Any]) -> SlurmOptions:
        from xp.run.settings import integer, number, text

        flat = {f"launcher.{k}": v for k, v in {**vars(cls()), **raw}.items()}
        return cls(partition=text(flat, "launcher.partition"), nodes=integer(flat, "launcher.nodes", 1, 100_000),
                   tasks_per_node=integer(flat, "launcher.tasks_per_node", 1, 1024),
                   gpus_per_node=integer(flat, "launcher.gpus_per_node", 0, 64),
                   time_min=integer(flat, "launcher.time_min", 1, 525_600), account=text(flat, "launcher.account"),
                   output_dir=text(flat, "launcher.output_dir") or "slurm",
                   poll_s=number(flat, "launcher.poll_s", 0.1, 600))


def check(settings: Any) -> None:
    """Before anything is submitted: the partition exists and has the nodes asked for (one line each)."""
    r = _run(["sinfo", "-h", "-o", "%P %D"])
    if r.returncode != 0:
        raise ConfigError(f"launcher=slurm: sinfo failed ({clip(r.stderr, 300)}); is this a Slurm login node, and "
                          "is its controller (slurmctld) up and reachable?")
    partitions = {p.rstrip("*"): int(n) for p, n in (line.split() for line in r.stdout.splitlines() if line.strip())}
    default = next((p.rstrip("*") for p in (line.split()[0] for line in r.stdout.splitlines()) if p.endswith("*")),
                   None)
    name = settings.partition or default
    if name not in partitions:
        raise ConfigError(f"launcher.partition={settings.partition}: no such partition; valid: "
                          f"{', '.join(sorted(partitions))}")
    if settings.nodes > partitions[name]:
        raise ConfigError(f"launcher.nodes={settings.nodes}: partition {name} has {partitions[name]} nodes")


def batch_command(plan: Plan, s: SlurmOptions, argv: list[str]) -> list[str]:
    out = Path(s.output_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["sbatch", "--parsable", f"--nodes={s.nodes}", f"--ntasks-per-node={s.tasks_per_node}",
           f"--time={s.time_min}", f"--job-name=xp-{plan.model.name}", f"--output={out}/slurm-%j.out",
           f"--chdir={os.getcwd()}", "--export=ALL", "--no-requeue"]  # a node lost ends the run: no rerun into it
    cmd += [f"--partition={s.partition}"] if s.partition else []
    cmd += [f"--gpus-per-node={s.gpus_per_node}"] if s.gpus_per_node else []
    cmd += [f"--account={s.account}"] if s.account else []
    return [*cmd, "--wrap", f"exec {shlex.quote(sys.executable)} -m xp {shlex.join(argv)}"]


def submit(plan: Plan, settings: SlurmOptions, argv: list[str], tracker: Any) -> None:
    """Submit the run as a job, relay its output, follow it to its end; SlurmError if it did not complete."""
    from xp.run.worker import RUN_ENV

    os.environ[RUN_ENV] = tracker.run_id  # the job inherits it (--export=ALL): rank 0 logs into this run
    r = _run(batch_command(plan, settings, argv))
    if r.returncode != 0:
        raise ConfigError(f"launcher=slurm: sbatch refused the job: {r.stderr.strip()[:300]}")
    job = r.stdout.strip().split(";")[0]
    tracker.set_tags({"xp.slurm.job": job})
    print(f"xp: submitted Slurm job {job}; MLflow run {tracker.run_id}", flush=True)
    state, reason = follow(job, settings)
    tracker.set_tags({"xp.slurm.state": state, "xp.slurm.reason": reason})
    if state != SlurmState.COMPLETED:
        raise SlurmError(f"Slurm job {job} ended {state}" + (f" ({reason})" if reason and reason != "None" else ""))


def follow(job: str, settings: Any) -> tuple[str, str]:
    """Relay the job's output until it ends; (JobState, Reason). Ctrl-C or SIGTERM cancel it (scancel)."""
    out = Path(settings.output_dir).expanduser().resolve() / f"slurm-{job}.out"
    offset, reason, heard = 0, "", time.monotonic()
    state: str = SlurmState.PENDING  # (as scontrol says it: maybe a state xp does not name)
    try:
        while True:  # as long as the job pends and runs; bounded by Slurm knowing it (UNKNOWN_AFTER_S)
            record = _show("job", job)
            if record:
                heard = time.monotonic()
            elif time.monotonic() - heard > UNKNOWN_AFTER_S:
                return SlurmState.UNKNOWN, f"slurmctld has not known the job for {UNKNOWN_AFTER_S} s"
            state, reason = _field(record, "JobState") or state, _field(record, "Reason") or reason
            offset = _relay(out, offset)
            if state in ENDED:
                time.sleep(0.2)
                _relay(out, offset)
                return state, reason
            time.sleep(settings.poll_s)
    except (KeyboardInterrupt, Terminated):
        _run(["scancel", job])
        deadline = time.monotonic() + CANCEL_WAIT_S  # until Slurm has ended its processes (it signals, then kills)
        while time.monotonic() < deadline and (_field(_show("job", job), "JobState") or SlurmState.CANCELLED) not in ENDED:
            time.sleep(0.5)
        print(f"xp: cancelled Slurm job {job}", file=sys.stderr, flush=True)
        raise


def _relay(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data)


# --- a study's slots as Slurm jobs (launcher=slurm from a login node) --------------------------------------------

WORKER_JOB = "xp-slot-"  # a study's worker jobs are named xp-slot-POOLJOB-INDEX (scancel --name ends them)


def login_address(settings: Any) -> str:
    """This machine's address as the nodes of the study's partition reach it (where its workers call back)."""
    r = _run(["sinfo", "-h", "-N", "-o", "%N"] + ([f"--partition={settings.partition}"] if settings.partition else []))
    nodes = r.stdout.split()
    if r.returncode != 0 or not nodes:
        raise ConfigError(f"launcher=slurm: cannot list the partition's nodes ({clip(r.stderr, 200)}); give "
                          "host_ip=ADDRESS (this machine's address as the nodes reach it)")
    return _address_towards(_field(_show("node", nodes[0]), "NodeAddr") or nodes[0])


def worker_slots(settings: Any, gpus_per_trial: int, parallel: int | None) -> list[Any]:
    """A study's slots on the cluster: `parallel` Slurm jobs (default: launcher.nodes x launcher.tasks_per_node), each
    one task with the trial's GPUs (Slurm picks the node and the devices)."""
    from xp.launching.slots import Slot

    n = parallel if parallel is not None else settings.nodes * settings.tasks_per_node
    return [Slot(i, tuple(range(gpus_per_trial)), (), "a Slurm job") for i in range(n)]


class WorkerJob:
    """A study's worker as a Slurm job of one task, which lives as long as the study wants it: the handle the pool
    keeps, with the calls of subprocess.Popen it makes. What it runs, and its slot's secret, go in a file only this
    user reads, which xp.launching.remote reads and removes as the job starts (never on a command line, nor in
    the job's record)."""

    def __init__(self, job: str, settings: Any, spec: Path | None = None):
        self.job, self.settings = job, settings
        self.returncode: int | None = None
        self.spec = spec  # its spec file, until the job has read it (a job cancelled while it pends never does)
        self.state: str = SlurmState.PENDING  # (as scontrol says it: maybe a state xp does not name)
        self.reason, self.node = "", ""
        self.heard = time.monotonic()  # when Slurm last showed the job
        self.ended_in = ""  # its state when xp first ended it

    @classmethod
    def submit(cls, settings: Any, slot: Any, command: dict[str, Any], avoid: str | None = None) -> WorkerJob:
        """The worker of `slot` submitted (`avoid`: a node not to place it on, where its predecessor was lost)."""
        import json
        import secrets

        out = Path(settings.output_dir).expanduser().resolve()
        out.mkdir(parents=True, exist_ok=True)
        job = command["env"].get("XP_JOB", "")
        spec = out / f".{WORKER_JOB}{secrets.token_hex(8)}.json"
        fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        env = {k: v for k, v in command["env"].items() if k != "CUDA_VISIBLE_DEVICES"}  # Slurm gives the job its GPUs
        with os.fdopen(fd, "w") as f:
            json.dump({**command, "env": env}, f)
        cmd = ["sbatch", "--parsable", "--nodes=1", "--ntasks=1", f"--time={settings.time_min}",
               f"--job-name={WORKER_JOB}{job}-{slot.index}", f"--output={out}/slurm-%j.out", f"--chdir={os.getcwd()}",
               "--export=ALL", "--no-requeue"]  # a lost node loses its trial (retried on another slot), not rerun
        cmd += [f"--partition={settings.partition}"] if settings.partition else []
        cmd += [f"--gpus={len(slot.gpus)}"] if slot.gpus else []
        cmd += [f"--account={settings.account}"] if settings.account else []
        cmd += [f"--exclude={avoid}"] if avoid else []
        r = _run([*cmd, "--wrap", f"exec {shlex.quote(sys.executable)} -m xp.launching.remote run --spec {spec}"])
        if r.returncode != 0:
            spec.unlink(missing_ok=True)
            raise ConfigError(f"launcher=slurm: sbatch refused the study's worker job: {clip(r.stderr, 300)}")
        return cls(r.stdout.strip().split(";")[0], settings, spec)

    def poll(self) -> int | None:
        if self.returncode is None:
            record = _show("job", self.job)  # "" while slurmctld does not answer (busy with a lost node)
            if record:
                self.heard = time.monotonic()
            elif time.monotonic() - self.heard > UNKNOWN_AFTER_S:
                self.state = SlurmState.UNKNOWN  # (purged, or slurmctld gone)
            self.state = _field(record, "JobState") or self.state
            self.reason = _field(record, "Reason") or self.reason
            node = _field(record, "NodeList") or ""
            self.node = node if node and node != "(null)" else self.node
            if self.state in ENDED or self.state == SlurmState.UNKNOWN:
                code = (_field(record, "ExitCode") or "1:0").split(":")[0]
                self.returncode = int(code) if self.state == SlurmState.COMPLETED and code.isdigit() else 1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"Slurm job {self.job}", timeout or 0.0)
            time.sleep(min(self.settings.poll_s, 0.5))
        return code

    @property
    def lost_with_node(self) -> bool:
        """When it was ended, Slurm still ran the job (its worker gone), or its node had failed: the node is in
        doubt."""
        return self.ended_in in (SlurmState.RUNNING, SlurmState.COMPLETING, SlurmState.NODE_FAIL,
                                 SlurmState.UNKNOWN)

    def terminate(self) -> None:
        self.ended_in = self.ended_in or self.state
        _run(["scancel", self.job])
        if self.spec is not None:  # the slot's secret goes with the job
            self.spec.unlink(missing_ok=True)

    kill = terminate  # Slurm signals the job's processes, then kills them

    def __str__(self) -> str:
        on = f" on {self.node}" if self.node else ""
        why = f", {self.reason}" if self.reason not in ("", "None") else ""
        return f"Slurm job {self.job}{on} ({self.state}{why})"


def cancel_named(job: str) -> None:
    """End the worker jobs of the study whose pool is `job`, pending or running."""
    r = _run(["squeue", "-h", "-o", "%i %j"])
    ids = [i for i, name in (line.split(None, 1) for line in r.stdout.splitlines() if " " in line)
           if name.startswith(f"{WORKER_JOB}{job}-")]
    if ids:
        _run(["scancel", *ids])
