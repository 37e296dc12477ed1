"""A study's workers: one long-lived process per slot (xp.launching.slots), started once, pinned to its slot,
replaced when it dies. Each talks to the scheduler (xp.studies.scheduler) over its channel (xp.studies.channel),
whose messages all arrive in the pool's one inbox. Where the slots are and how a worker gets there is the
launcher's (Launcher.slots, start_worker); this machine's workers the pool starts itself, forked from the
command's zygote where it has one (xp.launching.zygote)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

from xp.errors import XPError, one_line
from xp.launching.hosts import end_together
from xp.launching.slots import Slot
from xp.launching.trialworker import BACKEND_ENV, CONNECT_ENV, QUIET_ENV, SLOT_ENV, TOKEN_ENV, TRACKING_ENV
from xp.launching.zygote import Zygote, local_worker
from xp.studies.channel import Channel, Exit, Hello, Inbox, Message, Ready

log = logging.getLogger("xp")

READY_S = 300.0  # a worker that has not imported its frameworks by then is taken for a broken one
# how long a stopped study waits for its busy workers to end their trials' runs (they wait for the store 0.5 s at
# most: xp.launching.trialworker.STOPPED_SETTLE_S; most end within a second), before SIGKILL: the study's stop
# then ends a killed worker's run KILLED in the store itself (give_back), so a stop stays within 2 s
STOP_S = 1.5
DEATHS = 3  # workers of one slot that die in a row without finishing a trial: the study stops


class Worker:
    """The scheduler's handle on one worker process."""

    def __init__(self, slot: Slot, proc: Any, channel: Channel, launcher: Any, deaths: int = 0):
        self.slot, self.proc, self.channel, self.launcher = slot, proc, channel, launcher
        self.deaths = deaths  # workers of its slot that died before it without finishing a trial
        self.finished = 0  # trials it finished
        self.previous: tuple[Any, str | None] | None = None  # the last (trial, state): its run's records may
        # still be on their way from this worker while it runs the next

    def send(self, msg: Message) -> None:
        try:
            self.channel.send(msg)
        except OSError:  # it died; its channel's end says so to the inbox
            pass

    def gone(self) -> bool:
        """Its process has ended (a worker elsewhere may end without its channel saying so: a lost node)."""
        return self.proc.poll() is not None

    def ended(self) -> str:
        """How the process ended, in words (it is ended if it has not)."""
        return self.launcher.worker_ended(self.proc)


class Pool:
    """One worker per slot. `backend`: the backend the trials use, imported by each worker as it starts."""

    def __init__(self, slots: list[Slot], backend: str | None = None, tracking_uri: str | None = None,
                 launcher: Any = None, zygote: Zygote | None = None):
        from xp.launching.launcher import Local

        self.slots, self.backend, self.tracking_uri = slots, backend, tracking_uri
        self.launcher = launcher or Local()  # where the slots are, how a worker elsewhere gets there
        self.remote = self.launcher.remote  # its workers start elsewhere and call back
        self.zygote = zygote  # where this machine's workers are forked from (the command's; None: started afresh)
        self.inbox = Inbox()  # where every worker's messages arrive
        self.quiet = len(slots) > 1
        self.workers: list[Worker] = []
        self.released: list[Worker] = []  # left before the study's end (release)
        self.started: list[tuple[subprocess.Popen, Channel | None, Slot]] = []
        self.listener: socket.socket | None = None  # where workers of other hosts call back
        self.tokens: dict[str, Slot] = {}  # the secret each remote slot's worker says first
        self.superseded: set[str] = set()  # the secrets of workers given up (a late call of theirs is closed)
        self.arrived: dict[Slot, Channel] = {}
        self.job = secrets.token_hex(6)  # XP_JOB of its remote workers (reaped by it at the end)
        self.closing = threading.Event()  # the pool is ending: no worker joins any more
        self.stopping: Callable[[], bool] = lambda: False  # a stop is pending (the scheduler's Ctrl-C): no more waits
        self.grower: threading.Thread | None = None

    def spawn(self) -> Pool:
        """Start the workers; they import their frameworks side by side (__enter__ waits for them)."""
        if not self.started:
            self.started = [self._spawn(s) for s in self.slots]
        return self

    def __enter__(self) -> Pool:
        self.spawn()
        try:
            firsts = [self._first(*s) for s in self.started]
            self.workers = [w for w in firsts if w is not None]
            if not self.workers:
                raise XPError(f"the study's workers did not start on any of its {len(self.slots)} slots (see the "
                              "lines above)")
        except BaseException:
            self.discard()
            raise
        if self.launcher.grow_every_s > 0:
            self.grower = threading.Thread(target=self._grow, args=(self.launcher.grow_every_s,), daemon=True)
            self.grower.start()
        return self

    def _grow(self, every_s: float) -> None:
        """Slots that the site offers as it grows (Launcher.grown: a node joined) take a worker each, started here
        while the scheduler goes on; each is announced in the inbox (Ready) and takes trials from then on."""
        while not self.closing.wait(every_s):
            try:
                new = self.launcher.grown([w.slot for w in self.workers], 1 + max(s.index for s in self.slots))
            except Exception as e:  # the site did not answer this time: asked again next time
                log.warning(f"study: asking launcher={self.launcher.name} for more slots failed ({one_line(e)})")
                continue
            for slot in new:
                try:
                    worker = self._ready(*self._spawn(slot))
                except XPError as e:
                    if self.closing.is_set():
                        return
                    log.warning(f"study: no worker for a new {slot.describe()} ({one_line(e)}); asked again later")
                    continue
                if self.closing.is_set():
                    _end([worker.proc], first="terminate")
                    return
                self.slots.append(slot)
                self.workers.append(worker)
                log.info(f"study: a new {slot.describe()} (the site grew): {len(self.workers)} slots")
                self.inbox.put(worker, Ready(getattr(worker.proc, "pid", 0)))

    def trim(self, n: int) -> Pool:
        """Only the first n slots (a study with fewer trials left than slots): the workers started for the others
        end now."""
        _unused(self.started[n:])
        self.started, self.slots = self.started[:n], self.slots[:n]
        return self

    def discard(self) -> None:
        """End workers that were started and never used (SIGTERM: they may still be importing)."""
        _unused(self.started)
        self.started = []
        self._close()

    def __exit__(self, *exc: Any) -> None:
        self.closing.set()
        if self.grower is not None:
            self.grower.join(timeout=5.0)  # one still waiting for a worker ends it when it comes
        for w in self.workers:
            w.send(Exit())
        _end([w.proc for w in [*self.workers, *self.released]])
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
        if self.zygote is not None and not self.zygote.gone:  # forked: it calls back, as a remote worker does
            return self.zygote.fork(self._calling_back(slot, "127.0.0.1")), None, slot
        return (*local_worker({**os.environ, **self._variables(slot)}), slot)

    def _spawn_there(self, slot: Slot) -> tuple[Any, None, Slot]:
        """A worker elsewhere, started by the launcher (Launcher.start_worker: over its transport, or as a batch
        job); it calls back to this process's listener with its slot's token."""
        from xp.launching.remote import JOB_ENV

        command = {"argv": [sys.executable, "-m", "xp.launching.trialworker", "connect"],
                "env": {**self._calling_back(slot, self.launcher.address()), JOB_ENV: self.job}}
        return self.launcher.start_worker(slot, command), None, slot  # (the launcher keeps env off any command line)

    def _calling_back(self, slot: Slot, address: str | None) -> dict[str, str]:
        """The variables of `slot`'s worker, with where it calls back (this process's listener, on `address`) and
        the secret it says first."""
        if self.listener is None:
            self.listener = socket.create_server((address, 0))
            self.listener.settimeout(0.5)
        # the secret of the slot's earlier worker, given up, no longer counts: that one's call, late (it called,
        # then died before the call was taken), was taken for this one's (found by benchmarks/chaos.py)
        for old in [t for t, s in self.tokens.items() if s == slot]:
            del self.tokens[old]
            self.superseded.add(old)
        stale = self.arrived.pop(slot, None)
        if stale is not None:
            stale.close()
        token = secrets.token_hex(16)
        self.tokens[token] = slot
        address, port = self.listener.getsockname()[:2]
        return {**self._variables(slot), CONNECT_ENV: f"{address}:{port}", TOKEN_ENV: token}

    def _called_back(self, slot: Slot, proc: subprocess.Popen) -> Channel | None:
        """The channel of `slot`'s worker (remote, or forked by the zygote) once it has called back (None: it
        ended, or READY_S passed)."""
        deadline = time.monotonic() + READY_S
        while slot not in self.arrived:
            if proc.poll() is not None or time.monotonic() > deadline or self.closing.is_set() or \
                    self.listener is None or self.stopping():
                return None
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, BlockingIOError):
                continue
            channel = Channel(conn)
            try:
                hello = channel.recv(timeout=10)
            except (TimeoutError, OSError, ValueError):  # silent, gone, or bytes that are no message
                hello = None
            caller = self.tokens.pop(hello.token, None) if isinstance(hello, Hello) else None
            if caller is None and isinstance(hello, Hello) and hello.token in self.superseded:
                log.debug("study: a worker given up called back late: its connection is closed")
                conn.close()
                continue
            if caller is None:  # not one of ours: dropped, in one line
                log.warning(f"study: a connection from {_peer(conn)} without a slot's secret was refused")
                conn.close()
                continue
            self.arrived[caller] = channel
        return self.arrived.pop(slot)

    def _first(self, proc: Any, channel: Channel | None, slot: Slot) -> Worker | None:
        """A slot's first worker, ready. One that did not start (killed as it started, its zygote killed: then it
        starts afresh, or its host cut off for a while) is started again, DEATHS times in all; then a slot elsewhere
        is left out (None) where other slots are, as a slot whose workers die is, and one of this machine's stops
        the study: what fails there fails on every slot (found by benchmarks/chaos.py: a worker killed, or a host's
        link down, as the study began ended the whole command)."""
        try:
            return self._ready(proc, channel, slot)
        except XPError as e:
            last = e
        for _ in range(DEATHS - 1):
            gone = self.zygote is not None and self.zygote.gone
            log.warning(f"study: {one_line(last)}: " + ("this machine's zygote is gone, the worker starts afresh"
                                                        if gone else "started once more"))
            try:
                return self._ready(*self._spawn(slot))
            except XPError as e:
                last = e
            if self.stopping():
                break
        if self.remote and len(self.slots) > 1:
            log.warning(f"study: {slot.describe()} left out: its worker did not start {DEATHS} times ({one_line(last)}); "
                        "the other slots go on")
            return None
        raise last

    def _ready(self, proc: Any, channel: Channel | None, slot: Slot) -> Worker:
        if channel is None:
            channel = self._called_back(slot, proc)
        msg, deadline = None, time.monotonic() + READY_S
        while channel is not None:  # in slices: a worker whose host went after it called back (its connection stays
            try:  # open, its ssh ends at its ServerAlive timeout) held the study 300 s, Ctrl-C too (benchmarks/chaos.py)
                msg = channel.recv(timeout=1.0)
                break
            except TimeoutError:
                if proc.poll() is not None or time.monotonic() > deadline or self.stopping():
                    break
            except ValueError:
                break
        if channel is None or not isinstance(msg, Ready):
            why = getattr(msg, "error", None) or (
                f"exit code {proc.returncode}" if proc.poll() is not None else
                "it did not call back" if channel is None else
                f"it said {type(msg).__name__}, not Ready" if msg is not None else "no answer")
            _end([proc])
            raise XPError(f"the study's worker for {slot.describe()} did not start ({why})")
        worker = Worker(slot, proc, channel, self.launcher)
        channel.listen(self.inbox, worker)
        return worker

    def replace(self, worker: Worker) -> Worker | None:
        """A new worker on `worker`'s slot (the old one is ended if it is not); XPError when DEATHS workers of the
        slot died in a row without finishing a trial (a broken environment, not a bad trial). Where slots come and
        go (Launcher.grow_every_s), a slot whose new worker does not start is dropped instead: None."""
        self.launcher.worker_lost(worker.slot, worker.proc)
        deaths = 0 if worker.finished else worker.deaths + (worker.proc.returncode != 0)
        while True:
            if self.stopping():  # the study stops: no new worker (the dead one stays listed, and is ended with all)
                return None
            if deaths >= DEATHS and self.remote and len(self.workers) > 1:
                # a host that does not come back (down, its ssh refused): its slot goes, the others go on (found
                # by benchmarks/chaos.py: a host gone for good ended the whole study). This machine's slots still
                # stop the study: what fails there fails on every slot.
                self.workers.remove(worker)
                log.warning(f"study: {worker.slot.describe()} dropped: its workers died {deaths} times in a row "
                            f"without finishing a trial (last: exit code {worker.proc.returncode}); "
                            f"{len(self.workers)} slots go on")
                return None
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
                if self.launcher.grow_every_s > 0 and len(self.workers) > 1:
                    self.workers.remove(worker)
                    log.warning(f"study: {worker.slot.describe()} dropped; {len(self.workers)} slots go on (a slot "
                                f"is added when the site has room: every {self.launcher.grow_every_s:g} s)")
                    return None
        fresh.deaths = deaths
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def stop(self, busy: list[Worker], grace_s: float = STOP_S) -> None:
        """The study stops: the workers running a trial are told by SIGTERM (the trial's run ends KILLED, its
        records reach the store) and ended, SIGKILL after grace_s; the idle ones leave on "exit" (__exit__)."""
        # all given the same grace, then all killed at once: the stop takes grace_s + 2 s at most
        for proc in end_together([w.proc for w in busy], (("terminate", grace_s), ("kill", 2.0))):
            log.warning(f"study: worker {proc} did not end after SIGKILL")

    def release(self, worker: Worker) -> None:
        """An idle worker the study needs no more leaves now (its slot's resources go back: a batch job ends);
        __exit__ waits for it with the others."""
        worker.send(Exit())
        self.workers.remove(worker)
        self.released.append(worker)

    def retire(self, worker: Worker) -> None:
        worker.send(Exit())
        _end([worker.proc])


def _peer(conn: socket.socket) -> str:
    try:
        return ":".join(map(str, conn.getpeername()[:2]))
    except OSError:
        return "an address that is gone"


def _end(procs: list[Any], first: str | None = None, grace_s: float = 10.0) -> None:
    """End workers we started, together: they leave on "exit" (or `first`: "terminate", for one that may still be
    importing); else SIGTERM, then SIGKILL (a batch job: cancelled), each given grace_s to take."""
    steps = ((first, grace_s), ("terminate", grace_s), ("kill", grace_s))[1 if first == "terminate" else 0:]
    for proc in end_together(procs, steps):
        log.warning(f"study: worker {proc} did not end within {3 * grace_s:.0f} s")


def _unused(started: list[tuple[Any, Channel | None, Slot]]) -> None:
    """End workers started and never used (SIGTERM: they may still be importing), and their channels."""
    _end([proc for proc, _, _ in started], first="terminate")
    for _, channel, _ in started:
        if channel is not None:
            channel.close()
