"""A study's workers: one long-lived process per slot (xp.launching.slots), started once, pinned to its slot,
replaced when it dies. The scheduler (xp.studies.scheduler) reads them through one selector."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from xp.errors import XPError
from xp.launching.slots import Slot
from xp.launching.trialworker import BACKEND_ENV, QUIET_ENV, SLOT_ENV, TRACKING_ENV
from xp.studies.scheduler import Channel

log = logging.getLogger("xp")

READY_S = 300.0  # a worker that has not imported its frameworks by then is taken for a broken one
DEATHS = 3  # workers of one slot that die in a row without finishing a trial: the study stops


class Worker:
    """The scheduler's handle on one worker process."""

    def __init__(self, slot: Slot, proc: subprocess.Popen, channel: Channel, deaths: int = 0):
        self.slot, self.proc, self.channel = slot, proc, channel
        self.deaths = deaths  # workers of its slot that died before it without finishing a trial
        self.finished = 0  # trials it finished

    def fileno(self) -> int:
        return self.channel.fileno()

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.channel.send(msg)
        except OSError:  # it died; its end of the channel says so to the selector
            pass

    def pending(self) -> list[dict[str, Any]] | None:
        return self.channel.pending()

    def ended(self) -> str:
        """How the process ended, in words (it is ended if it has not)."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


class Pool:
    """One worker per slot. `backend`: the backend the trials use, imported by each worker as it starts."""

    def __init__(self, slots: list[Slot], backend: str | None = None, tracking_uri: str | None = None):
        self.slots, self.backend, self.tracking_uri = slots, backend, tracking_uri
        self.quiet = len(slots) > 1
        self.workers: list[Worker] = []
        self.started: list[tuple[subprocess.Popen, Channel, Slot]] = []

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
            channel.sock.close()
        self.started = []

    def __exit__(self, *exc: Any) -> None:
        for w in self.workers:
            w.send({"op": "exit"})
        for w in self.workers:
            _end(w.proc)

    def _spawn(self, slot: Slot) -> tuple[subprocess.Popen, Channel, Slot]:
        ours, theirs = socket.socketpair()
        env = {**os.environ, **slot.env(), SLOT_ENV: json.dumps(asdict(slot)), QUIET_ENV: "1" if self.quiet else "0",
               **({BACKEND_ENV: self.backend} if self.backend else {}),
               **({TRACKING_ENV: self.tracking_uri} if self.tracking_uri else {})}
        proc = subprocess.Popen([sys.executable, "-m", "xp.launching.trialworker", str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        return proc, Channel(ours), slot

    def _ready(self, proc: subprocess.Popen, channel: Channel, slot: Slot) -> Worker:
        try:
            msg = channel.recv(timeout=READY_S)
        except TimeoutError:
            msg = None
        if msg is None or msg.get("op") != "ready":
            _end(proc)
            raise XPError(f"the study's worker for {slot.describe()} did not start "
                          f"({msg.get('error') if msg else 'no answer'})")
        return Worker(slot, proc, channel)

    def replace(self, worker: Worker) -> Worker:
        """A new worker on `worker`'s slot (the old one is ended if it is not); XPError when DEATHS workers of the
        slot died in a row without finishing a trial (a broken environment, not a bad trial)."""
        _end(worker.proc)
        deaths = 0 if worker.finished else worker.deaths + (worker.proc.returncode != 0)
        if deaths >= DEATHS:
            raise XPError(f"the study's workers on {worker.slot.describe()} died {deaths} times in a row without "
                          f"finishing a trial (last: exit code {worker.proc.returncode}); see their lines above")
        fresh = self._ready(*self._spawn(worker.slot))
        fresh.deaths = deaths
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def retire(self, worker: Worker) -> None:
        worker.send({"op": "exit"})
        _end(worker.proc)


def _end(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a worker we started: it leaves on "exit"; else SIGTERM, then SIGKILL."""
    try:
        proc.wait(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


LOCAL_LAUNCHERS = ("BasicLauncher", "JoblibLauncher")  # Hydra's launchers that run jobs on this machine


_early: list[Pool] = []  # the workers prestart() started, until slot_pool takes them or discard_early() ends them


def prestart(config: dict[str, Any], argv: list[str]) -> None:
    """A study on this machine's slots: start its workers now, while this process opens its stores and its
    study, so their imports (seconds) overlap; slot_pool hands them to the study when its slots are the same.
    Only for Hydra's default launcher (another one, or its settings, may place trials differently)."""
    node = config.get("sweep")
    if not node or node.get("scheduler", "slots") != "slots" or any(a.startswith(("hydra/launcher", "hydra.launcher")) for a in argv):
        return
    from xp.launching.slots import plan_slots

    try:
        slots = plan_slots(int(config.get("gpus") or 0), node.get("parallel"), node.get("trials_per_gpu") or 1)
    except XPError:
        return  # the study says so, in its own words
    _early.append(_pool(config, slots).spawn())


def discard_early() -> None:
    while _early:
        _early.pop().discard()


def _pool(config: Any, slots: list[Slot]) -> Pool:
    from xp.tracking.stores import resolve_uri

    return Pool(slots, backend=(config.get("backend") or {}).get("name"),
                tracking_uri=resolve_uri(config.get("tracking_uri")))


def slot_pool(config: Any, spec: Any, parallel: int | None) -> Pool | None:
    """The pool of a study run on this machine (Hydra's basic or joblib launcher), its placement printed;
    None for a cluster's launcher (submitit: the trials are its jobs)."""
    target = str(config.hydra.launcher.get("_target_", ""))
    if not target.endswith(LOCAL_LAUNCHERS):
        return None
    from xp.launching.slots import plan_slots

    slots = plan_slots(int(config.get("gpus") or 0), parallel, spec.trials_per_gpu)
    log.info(f"study: {len(slots)} slot{'s' if len(slots) > 1 else ''}, a worker each: "
             + "; ".join(s.describe() for s in slots))
    pool = _pool(config, slots)
    early = next((p for p in _early if (p.slots, p.backend, p.tracking_uri) == (slots, pool.backend,
                                                                              pool.tracking_uri)), None)
    if early is not None:
        _early.remove(early)
    discard_early()  # started for other slots: not this study's
    return early or pool
