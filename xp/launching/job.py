"""Starting the processes of a distributed run, on this machine or on other hosts, and watching them.

Beside it: xp/launching/engine.py (the job's spec, its roles, the Engine interface), xp/launching/launcher.py
(where processes go: the Launcher interface, local, ssh, slurm), xp/launching/hosts.py (hosts files,
transports, probing and reaping hosts), xp/run/worker.py (the worker's side: its variables, progress reports).

Framework-neutral: an *engine* (xp/mx/pslite.py, xp/mx/horovodrun.py, xp/pt/torchrun.py) says which
processes a job needs, where and with what command (`Engine.roles`); the `Job` here starts them (locally,
or through the launcher's transport on its hosts), watches them and ends them.

Liveness crosses hosts: workers send progress datagrams (UDP: rank, host, pid, role) to a socket the
launcher binds on host_ip (127.0.0.1 locally), at most one a second. A worker that exits non-zero, whose
connection drops, or that stays silent for dist_timeout_s fails the job, naming its rank and host.

Ending: local processes by the process groups the job created (and descendants seen); on every host, the
sessions' wrappers (xp.launching.remote run) end their process group when the launcher closes the session or
dies, and a last `xp.launching.remote reap JOB` through the transport ends whatever carries the job's id
(what a runner such as horovodrun started itself included). The launching process owns the MLflow run;
rank 0 logs into it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psutil

from xp.launching.engine import LOOPBACK, Engine, Role, Spec, python
from xp.errors import XPError
from xp.launching.hosts import exit_words, on_hosts, start_there
from xp.run.worker import HOST_ENV, JOB_ENV, PROGRESS_ENV, ROLE_ENV, WORKER_ENV, die_with_parent

# variables a remote process gets from the launcher's environment (the rest is the host's own), with those its
# engine names (Engine.forwarded)
FORWARDED = ("XP_", "MLFLOW_", "OMP_", "PYTHON")


class LaunchError(XPError):
    exit_code = 1
    host: str | None = None  # the host whose process failed, where known


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


class Policy:
    """What a job does with its processes over time. This one runs them once: the job succeeds when every
    worker did and fails with the first failure. Elastic training is another (xp.launching.elastic.Elastic):
    the same job runs its processes again, on the members there are, after a membership change or a loss."""
    poll_s: float = 1.0  # how often `poll` is called while the processes run

    def first(self, spec: Spec) -> Spec | None:
        """The spec of the job's first round of processes (None: nothing to run)."""
        return spec

    def poll(self, job: Job) -> None:
        """Called every poll_s while a round runs (elastic: has the membership changed?)."""

    def lost(self, job: Job, started: Started, code: int) -> bool:
        """A process of the round exited with `code` != 0: True if the round goes on without it (torch's elastic
        agents restart their workers without a lost host); False fails the round."""
        return False

    def after(self, spec: Spec, error: LaunchError | None) -> Spec | None:
        """The spec of the next round, or None: the job is done. `error`: why the last round failed (None: every
        worker succeeded); raising it fails the job."""
        if error is not None:
            raise error
        return None

    def close(self) -> None:
        """The job is over, however it ended."""


class Job:
    """One job: rounds of started processes (its policy decides how many), each watched until every worker
    succeeded, one failed, or progress stopped."""

    def __init__(self, engine: Engine, policy: Policy | None = None):
        self.engine, self.spec = engine, engine.spec
        self.policy = policy or Policy()
        self.id = uuid.uuid4().hex[:12]
        self.folder = tempfile.mkdtemp(prefix="xp-job-")  # the job's files on this machine (removed at the end)
        self.retired: list[str] = []  # hosts whose role was ended while the job went on (reaped at its end)
        self.progress = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.progress.bind((self.spec.bind, 0))
        self.progress.setblocking(False)
        self._use(self.spec)

    def _use(self, spec: Spec) -> None:
        """A new round's spec, and a clean slate for watching it."""
        self.spec = self.engine.spec = spec
        self.started: list[Started] = []
        self.beats: dict[int, Beat] = {}  # rank -> its last progress
        # PYTHONFAULTHANDLER: a process that a fatal signal ends (a C++ library's abort) says where its threads were
        self.env = {WORKER_ENV: "1", JOB_ENV: self.id, "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER", "1"),
                    **spec.env, PROGRESS_ENV: f"{spec.bind}:{self.progress.getsockname()[1]}"}
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
            own = self.engine.not_inherited  # the engine's own variables come from the role, not this process
            inherited = {k: v for k, v in os.environ.items() if not (own and k.startswith(own))}
            proc = subprocess.Popen(role.argv, env={**inherited, **env}, start_new_session=True,
                                    preexec_fn=die_with_parent, stdout=subprocess.PIPE if piped else None,
                                    stderr=subprocess.STDOUT if piped else None, text=piped)
        else:
            prefixes = FORWARDED + self.engine.forwarded
            forwarded = {k: v for k, v in os.environ.items() if k.startswith(prefixes) and k not in env}
            command = {"argv": role.argv, "env": {**forwarded, **env}, "slot": role.worker or role.runner}  # (a
            # launcher that gives each process a share of its host gives a server none)
            proc = start_there(self.spec.to_hosts, role.host, command, output=True, own_session=True)
        s = Started(role, proc)
        if piped:
            s.relay = threading.Thread(target=self._relay, args=(s,), daemon=True)
            s.relay.start()
        self.started.append(s)
        return s

    def retire(self, s: Started) -> None:
        """End one remote role while the others go on (an elastic member that left): its session closed, so the
        host ends its process group (SIGTERM, then SIGKILL after 5 s: a runner ends its own workers); no longer
        watched, and its host reaped with the others when the job ends. (Not reaped now: emulated hosts share
        one process table, where a host's reap would end the whole job.)"""
        self.started.remove(s)
        if s.role.host is not None:  # (a remote role's)
            self.retired.append(s.role.host)
        if s.proc.stdin is not None:
            try:
                s.proc.stdin.close()
            except OSError:
                pass
        try:
            s.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(s.proc.pid, signal.SIGKILL)

    def _relay(self, s: Started) -> None:
        """The process's output to ours (prefixed with its host when remote), noting what a runner reports."""
        prefix = f"[{s.role.host}] " if s.role.host else ""
        for line in s.proc.stdout or ():  # (piped)
            sys.stdout.write(prefix + line)
            if s.role.runner:
                self.engine.failed(line, self.exits, self.runner_state)
        sys.stdout.flush()

    def run(self) -> None:
        """Every round the policy asks for; raises LaunchError (or ConfigError) when the job fails."""
        try:
            spec = self.policy.first(self.spec)
            while spec is not None:
                self._use(spec)
                error = None
                try:
                    self._round()
                except LaunchError as e:
                    error = e
                spec = self.policy.after(spec, error)
        finally:
            self.policy.close()
            self.progress.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _round(self) -> None:
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
            if time.monotonic() - polled >= self.policy.poll_s:
                polled = time.monotonic()
                self.policy.poll(self)
            self._receive()
            self._remember_descendants()
            for s in list(self.started):
                code = s.proc.poll()
                if code not in (None, 0):
                    if self.policy.lost(self, s, code):
                        self.started.remove(s)
                        continue
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
        # one killed by a signal first: its peers fail because it went (they may even exit before the runner
        # has seen it die)
        failed.sort(key=lambda rc: not (rc[1] < 0 or rc[1] > 128))
        if failed:
            rank, code = failed[0]
            host = self.beats[rank].host if rank in self.beats else host
        lost = s.role.host is not None and code == 255 and not failed
        who = f"worker rank {rank}" if rank is not None else s.role.name
        where = f" on host {host}" if host and self.spec.remote else ""
        how = "lost its ssh connection (the host went down or became unreachable)" if lost else exit_words(code)
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
        to_hosts = self.spec.to_hosts
        answers = on_hosts(to_hosts, sorted(remote), "", to_hosts.connect_timeout_s + 5, command_for=lambda h: (
            f"{py} -m xp.launching.remote state " + " ".join(str(b.pid) for b in self.beats.values() if b.host == h)))
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
            self.spec.launcher.reap([*self.engine.hosts(), *(h for h in self.retired if h not in self.engine.hosts())],
                                    self.id)

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
    except psutil.Error:  # gone, or not on this machine: nothing to tell
        return False


def launch(engine: Engine, policy: Policy | None = None) -> None:
    """Run the job to the end (its policy: once, or elastic); raise LaunchError (or ConfigError) when it fails."""
    Job(engine, policy).run()
