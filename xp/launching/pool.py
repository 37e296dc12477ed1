"""A study's workers: one long-lived process per slot (xp.launching.slots), started once, pinned to its slot,
replaced when it dies. The scheduler (xp.studies.scheduler) reads them through one selector."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from xp.errors import XPError, one_line
from xp.launching.slots import Slot
from xp.launching.trialworker import BACKEND_ENV, CONNECT_ENV, QUIET_ENV, SLOT_ENV, TOKEN_ENV, TRACKING_ENV
from xp.studies.scheduler import Channel

log = logging.getLogger("xp")

READY_S = 300.0  # a worker that has not imported its frameworks by then is taken for a broken one
STOP_S = 10.0  # how long a stopped study waits for its busy workers to end their trials' runs
DEATHS = 3  # workers of one slot that die in a row without finishing a trial: the study stops


class Worker:
    """The scheduler's handle on one worker process."""

    def __init__(self, slot: Slot, proc: subprocess.Popen, channel: Channel, deaths: int = 0):
        self.slot, self.proc, self.channel = slot, proc, channel
        self.deaths = deaths  # workers of its slot that died before it without finishing a trial
        self.finished = 0  # trials it finished
        self.previous: tuple[Any, str | None] | None = None  # the last (trial, state): its run's records may
        # still be on their way from this worker while it runs the next

    def fileno(self) -> int:
        return self.channel.fileno()

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.channel.send(msg)
        except OSError:  # it died; its end of the channel says so to the selector
            pass

    def pending(self) -> list[dict[str, Any]] | None:
        return self.channel.pending()

    def gone(self) -> bool:
        """Its process has ended (a worker elsewhere may end without its channel saying so: a lost node)."""
        return self.proc.poll() is not None

    def ended(self) -> str:
        """How the process ended, in words (it is ended if it has not)."""
        if not isinstance(self.proc, subprocess.Popen):  # a batch job: its batch system says how it went (as it
            self.proc.poll()  # stood when the worker was lost), then it is ended (it may live on a lost node)
            how = str(self.proc)
            self.proc.terminate()
            return how
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        if self.slot.host and 128 < code < 160:  # the remote side's 128+N (xp.launching.remote run)
            code = 128 - code
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


class Pool:
    """One worker per slot. `backend`: the backend the trials use, imported by each worker as it starts."""

    def __init__(self, slots: list[Slot], backend: str | None = None, tracking_uri: str | None = None,
                 launcher: Any = None):
        self.slots, self.backend, self.tracking_uri = slots, backend, tracking_uri
        self.launcher = launcher  # how slots elsewhere are reached (xp.launching.launcher: ssh, slurm)
        self.remote = launcher is not None and launcher.remote  # its workers start elsewhere and call back
        self.quiet = len(slots) > 1
        self.workers: list[Worker] = []
        self.released: list[Worker] = []  # left before the study's end (release)
        self.started: list[tuple[subprocess.Popen, Channel | None, Slot]] = []
        self.listener: socket.socket | None = None  # where workers of other hosts call back
        self.tokens: dict[str, Slot] = {}  # the secret each remote slot's worker says first
        self.arrived: dict[Slot, Channel] = {}
        self.job = secrets.token_hex(6)  # XP_JOB of its remote workers (reaped by it at the end)

    def spawn(self) -> Pool:
        """Start the workers; they import their frameworks side by side (__enter__ waits for them)."""
        if not self.started:
            self.started = [self._spawn(s) for s in self.slots]
        return self

    def __enter__(self) -> Pool:
        self.spawn()
        try:
            self.workers = [self._ready(*s) for s in self.started]
        except BaseException:
            self.discard()
            raise
        return self

    def discard(self) -> None:
        """End workers that were started and never used (SIGTERM: they may still be importing)."""
        for proc, channel, _ in self.started:
            if proc.poll() is None:
                proc.terminate()
            _end(proc)
            if channel is not None:
                channel.sock.close()
        self.started = []
        self._close()

    def __exit__(self, *exc: Any) -> None:
        for w in self.workers:
            w.send({"op": "exit"})
        for w in [*self.workers, *self.released]:
            _end(w.proc)
        self._close()

    def _close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            hosts = sorted({s.host for s in self.slots if s.host})
            self.launcher.reap(hosts, self.job)  # whatever a lost ssh session left running there

    def _variables(self, slot: Slot) -> dict[str, str]:
        return {**slot.env(), SLOT_ENV: json.dumps(asdict(slot)), QUIET_ENV: "1" if self.quiet else "0",
                **({BACKEND_ENV: self.backend} if self.backend else {}),
                **({TRACKING_ENV: self.tracking_uri} if self.tracking_uri else {})}

    def _spawn(self, slot: Slot) -> tuple[Any, Channel | None, Slot]:
        if self.remote:
            return self._spawn_there(slot)
        if _unplaced:  # started before its slot was known (early): told it now
            proc, channel, env = _unplaced.pop()
            told = {**{k: v for k, v in os.environ.items() if env.get(k) != v}, **self._variables(slot)}
            try:
                channel.send({"op": "slot", "env": told, "unset": [k for k in env if k not in os.environ],
                              "cwd": os.getcwd()})
            except OSError:  # it died meanwhile: _ready says so in one line
                pass
            return proc, channel, slot
        return (*_local_worker({**os.environ, **self._variables(slot)}), slot)

    def _spawn_there(self, slot: Slot) -> tuple[Any, None, Slot]:
        """A worker elsewhere, started by the launcher (Launcher.start_worker: over its transport, or as a batch
        job); it calls back to this process's listener with its slot's token."""
        from xp.launching.remote import JOB_ENV

        if self.listener is None:
            self.listener = socket.create_server((self.launcher.address(), 0))
            self.listener.settimeout(0.5)
        token = secrets.token_hex(16)
        self.tokens[token] = slot
        address, port = self.listener.getsockname()[:2]
        told = {"argv": [sys.executable, "-m", "xp.launching.trialworker", "connect"],
                "env": {**self._variables(slot), CONNECT_ENV: f"{address}:{port}", TOKEN_ENV: token,
                        JOB_ENV: self.job}}  # the launcher keeps it off any command line
        return self.launcher.start_worker(slot, told), None, slot

    def _called_back(self, slot: Slot, proc: subprocess.Popen) -> Channel | None:
        """The channel of `slot`'s remote worker once it has called back (None: it ended, or READY_S passed)."""
        deadline = time.monotonic() + READY_S
        while slot not in self.arrived:
            if proc.poll() is not None or time.monotonic() > deadline:
                return None
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, BlockingIOError):
                continue
            channel = Channel(conn)
            try:
                hello = channel.recv(timeout=10)
            except (TimeoutError, OSError):
                hello = None
            caller = self.tokens.pop(str((hello or {}).get("token")), None)
            if caller is None:  # not one of ours: dropped, in one line
                log.warning(f"study: a connection from {_peer(conn)} without a slot's secret was refused")
                conn.close()
                continue
            self.arrived[caller] = channel
        return self.arrived.pop(slot)

    def _ready(self, proc: subprocess.Popen, channel: Channel | None, slot: Slot) -> Worker:
        if channel is None:
            channel = self._called_back(slot, proc)
        try:
            msg = channel.recv(timeout=READY_S) if channel is not None else None
        except TimeoutError:
            msg = None
        if msg is None or msg.get("op") != "ready":
            _end(proc)
            why = msg.get("error") if msg else (f"exit code {proc.returncode}" if proc.poll() is not None
                                                 else "no answer")
            raise XPError(f"the study's worker for {slot.describe()} did not start ({why})")
        return Worker(slot, proc, channel)

    def replace(self, worker: Worker) -> Worker:
        """A new worker on `worker`'s slot (the old one is ended if it is not); XPError when DEATHS workers of the
        slot died in a row without finishing a trial (a broken environment, not a bad trial)."""
        if isinstance(worker.proc, subprocess.Popen):  # ended already (Worker.ended, or retired): reaped
            _end(worker.proc, 1.0)
        if self.remote:
            self.launcher.worker_lost(worker.slot, worker.proc)
        deaths = 0 if worker.finished else worker.deaths + (worker.proc.returncode != 0)
        while True:
            if deaths >= DEATHS:
                raise XPError(f"the study's workers on {worker.slot.describe()} died {deaths} times in a row "
                              f"without finishing a trial (last: exit code {worker.proc.returncode}); see their "
                              "lines above")
            try:
                fresh = self._ready(*self._spawn(worker.slot))
                break
            except XPError as e:  # its replacement did not start (a node that is going): another try
                log.warning(f"study: {one_line(e)}")
                deaths += 1
        fresh.deaths = deaths
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def stop(self, busy: list[Worker], grace_s: float = STOP_S) -> None:
        """The study stops: the workers running a trial are told by SIGTERM (the trial's run ends KILLED, its
        records reach the store) and ended, SIGKILL after grace_s; the idle ones leave on "exit" (__exit__)."""
        for w in busy:
            if w.proc.poll() is None:
                w.proc.terminate()
        deadline = time.monotonic() + grace_s
        for w in busy:  # all given the same grace, then all killed at once: the stop takes grace_s + 2 s at most
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        late = [w for w in busy if w.proc.poll() is None]
        for w in late:
            w.proc.kill()
        for w in late:
            try:
                w.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                log.warning("a worker of slot %s did not end after SIGKILL", w.slot.index)

    def release(self, worker: Worker) -> None:
        """An idle worker the study needs no more leaves now (its slot's resources go back: a batch job ends);
        __exit__ waits for it with the others."""
        worker.send({"op": "exit"})
        self.workers.remove(worker)
        self.released.append(worker)

    def retire(self, worker: Worker) -> None:
        worker.send({"op": "exit"})
        _end(worker.proc)


def _peer(conn: socket.socket) -> str:
    try:
        return ":".join(map(str, conn.getpeername()[:2]))
    except OSError:
        return "an address that is gone"


def _end(proc: Any, grace_s: float = 10.0) -> None:
    """End a worker we started: it leaves on "exit"; else SIGTERM, then SIGKILL (a batch job: cancelled), each
    given grace_s to take."""
    for step in (None, proc.terminate, proc.kill):
        if step is not None:
            step()
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    log.warning(f"study: worker {proc} did not end within {3 * grace_s:.0f} s")


_unplaced: list[tuple[subprocess.Popen, Channel, dict[str, str]]] = []  # early(): a worker and the environment
# it started with, until a local slot takes it or discard_early() ends it
_early: list[Pool] = []  # the workers prestart() started, until slot_pool takes them or discard_early() ends them
_launcher: list[Any] = []  # the study's launcher (its plan's), where its slots come from: set by prestart()


def prestart(config: dict[str, Any], argv: list[str], launcher: Any = None) -> None:
    """A study on slots: its launcher's hosts checked (launcher=ssh: every host answers, the tracking store is
    one they reach), then its workers started now, while this process opens its stores and its study, so their
    imports (seconds) overlap; slot_pool hands them to the study when its slots are the same. Workers start
    early only under Hydra's default launcher (another one, or its settings, may place trials differently)."""
    _launcher[:] = [launcher]
    node = config.get("sweep")
    if not node or node.get("scheduler", "slots") != "slots":
        return
    if launcher is not None and launcher.remote:
        from xp.tracking.stores import resolve_uri

        launcher.check_study(resolve_uri(config.get("tracking_uri")))
    if any(a.startswith(("hydra/launcher", "hydra.launcher")) for a in argv):
        return
    from xp.tracking.stores import resolve_uri

    if not resolve_uri(config.get("tracking_uri")).startswith(("sqlite:", "http:", "https:")):
        return  # a new database's schema (PostgreSQL) has no creation lock: the workers open it after this process
    slots = _slots(config, node.get("parallel"), node.get("trials_per_gpu") or 1)
    _early.append(_pool(config, slots).spawn())


def early(argv: list[str]) -> None:
    """A study's first local worker, started before anything is composed (the command line looks like a study on
    this machine's slots): it imports what does not depend on its slot (MLflow, Hydra, xp: a second on 2 cores)
    while this process composes and checks the study, then waits to be told its slot (Pool._spawn), pins itself
    there and imports its frameworks. Not taken by a slot, discard_early() ends it; it dies with this process."""
    if any(a.startswith(("hydra/launcher", "hydra.launcher", "sweep.scheduler=hydra")) for a in argv) or any(
            a.startswith("launcher=") and a != "launcher=local" for a in argv):
        return  # trials placed by another launcher: no local slot would take it
    env = {k: v for k, v in os.environ.items() if k != SLOT_ENV}
    _unplaced.append((*_local_worker(env), env))


def _local_worker(env: dict[str, str]) -> tuple[subprocess.Popen, Channel]:
    """A worker process on this machine, and the scheduler's end of its channel."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-m", "xp.launching.trialworker", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
    theirs.close()
    return proc, Channel(ours)


def discard_early() -> None:
    while _early:
        _early.pop().discard()
    while _unplaced:  # it holds nothing yet: ended at once
        proc, channel, _ = _unplaced.pop()
        proc.kill()
        proc.wait(timeout=30)
        channel.sock.close()
    _launcher.clear()


def _slots(config: Any, parallel: int | None, trials_per_gpu: int) -> list[Slot]:
    """This machine's slots, or (launcher=ssh) its hosts'."""
    from xp.launching.slots import plan_slots

    launcher = _launcher[0] if _launcher else None
    if launcher is not None:
        return launcher.slots(int(config.get("gpus") or 0), parallel, trials_per_gpu)
    return plan_slots(int(config.get("gpus") or 0), parallel, trials_per_gpu)


def _pool(config: Any, slots: list[Slot]) -> Pool:
    from xp.tracking.stores import resolve_uri

    return Pool(slots, backend=(config.get("backend") or {}).get("name"),
                tracking_uri=resolve_uri(config.get("tracking_uri")), launcher=_launcher[0] if _launcher else None)


def slot_pool(config: Any, spec: Any, parallel: int | None) -> Pool | None:
    """The pool of a study whose trials Hydra's basic or joblib launcher would run here: this machine's slots,
    or those of the hosts of xp's launcher (ssh); its placement printed. None for a cluster's Hydra launcher
    (submitit: the trials are its jobs)."""
    from xp.launching.hydra_launchers import runs_here

    if not runs_here(str(config.hydra.launcher.get("_target_", ""))):
        return None
    slots = _slots(config, parallel, spec.trials_per_gpu)
    log.info(f"study: {len(slots)} slot{'s' if len(slots) > 1 else ''}, a worker each: "
             + "; ".join(s.describe() for s in slots))
    pool = _pool(config, slots)
    early = next((p for p in _early if (p.slots, p.backend, p.tracking_uri) == (slots, pool.backend,
                                                                              pool.tracking_uri)), None)
    if early is not None:
        _early.remove(early)
    while _early:  # started for other slots: not this study's
        _early.pop().discard()
    return early or pool
