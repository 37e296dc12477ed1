"""A study's scheduler: trials kept in flight on slots, a slot refilled as soon as its trial ends (finished,
pruned or failed), until the budget is spent. Asynchronous ask and tell: a pruned trial never waits for the
slowest of a batch (ASHA's argument), and the pruners and samplers see every result as it comes.

The scheduler alone talks to the study's storage. Its workers (one long-lived process per slot, see
xp.launching.pool) run the trials and send each epoch's value over a channel; the scheduler reports it,
asks the pruner and answers. So SQLite never has two writers, and a remote database one connection per
scheduler. Several schedulers (on several machines) may still share one PostgreSQL or journal study.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("xp")

ALIVE_S = 2.0  # how often the workers running a trial are checked for a process that ended without a word
SCHEDULER_ATTR = "xp.scheduler"  # a trial's user attribute: host:pid:start of the scheduler running it


class Channel:
    """JSON messages, one per line, over a socket (a scheduler and one of its workers)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""
        self.held: collections.deque[dict[str, Any]] = collections.deque()  # read while waiting for another

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(msg) + "\n").encode())

    def recv_op(self, op: str) -> dict[str, Any] | None:
        """The next message of kind `op` from the socket; the others that come first are held for recv()."""
        while True:
            msg = self._read()
            if msg is None or msg.get("op") == op:
                return msg
            self.held.append(msg)

    def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message (blocking, at most `timeout` s: TimeoutError); None once the other end closed."""
        return self.held.popleft() if self.held else self._read(timeout)

    def _read(self, timeout: float | None = None) -> dict[str, Any] | None:
        self.sock.settimeout(timeout)
        try:
            while b"\n" not in self.buf:
                data = self.sock.recv(65536)
                if not data:
                    return None
                self.buf += data
        finally:
            self.sock.settimeout(None)
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def pending(self) -> list[dict[str, Any]] | None:
        """The messages that arrived (the socket is readable); None once the other end closed."""
        try:
            data = self.sock.recv(65536)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            return None
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines]


class SlotTrial:
    """A worker's view of the trial it runs (what xp's run uses of an Optuna trial): its values go to the
    scheduler, which reports them to the study and answers whether to prune."""

    def __init__(self, channel: Channel, number: int, params: dict[str, Any], study_name: str):
        self.channel, self.number, self.params = channel, number, params
        self.study = type("Study", (), {"study_name": study_name})()

    def report(self, value: float, step: int) -> None:
        self.channel.send({"op": "report", "value": float(value), "step": int(step)})

    def should_prune(self) -> bool:
        self.channel.send({"op": "should_prune"})
        answer = self.channel.recv_op("prune")  # (the worker's next trial may come first: it is held)
        if answer is None:
            raise ConnectionError("the study's scheduler is gone")
        return bool(answer["prune"])

    def set_user_attr(self, key: str, value: Any) -> None:
        self.channel.send({"op": "attr", "key": key, "value": value})


@dataclass
class Flight:
    trial: Any  # the Optuna trial (the scheduler's)
    started: float  # when it was sent to its worker (0.0 while the scheduler holds it ready)
    job: int
    message: dict[str, Any]  # what its worker was sent


@dataclass
class Tally:
    """What the study did in this process, for the progress lines."""
    states: dict[str, int] = field(default_factory=lambda: {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0})
    best: float | None = None
    busy_s: float = 0.0  # slot-seconds spent running trials
    started: float = field(default_factory=time.monotonic)
    first: float | None = None  # when the first trial started


class Scheduler:
    """Keeps every slot of `pool` busy with a trial of `study` until `remaining()` is 0 and none is in flight.
    `ask()` gives the next trial (None: nothing to run now), `job_of(trial, job)` its message for a worker,
    `tell(trial, result)` records how it ended, `lost(trial, why)` a trial whose worker died, `mark(trial)` who
    runs it, `unsettled(trial, state, why)` the trial a gone worker finished last (its run's last records may have
    gone with it: its worker sends them while it runs the next).

    The scheduler holds the next trials asked (`ready`, one per slot) while every slot runs one: the first slot
    to free starts the oldest the moment it reports, without waiting for the scheduler to tell and ask (tens of
    ms a trial; with short pruned trials, a tenth of a slot's time), also when several free at once. Trials start
    in the order they were asked, on whichever slot frees first: none waits behind a long trial while another
    slot is free. The sampler proposes each without the results of the trials in flight when it was asked."""

    def __init__(self, pool: Any, ask: Callable[[], Any], remaining: Callable[[], int],
                 job_of: Callable[[Any, int], dict[str, Any]], tell: Callable[[Any, dict[str, Any]], str],
                 lost: Callable[[Any, str], None], heartbeat_s: float, direction: str | None = None,
                 mark: Callable[[Any], None] = lambda trial: None,
                 give_back: Callable[[list[Any], str], None] = lambda trials, why: None,
                 unsettled: Callable[[Any, str | None, str], None] = lambda trial, state, why: None):
        self.pool, self.ask, self.remaining, self.job_of, self.mark = pool, ask, remaining, job_of, mark
        self.tell, self.lost, self.heartbeat_s, self.direction = tell, lost, heartbeat_s, direction
        self.give_back = give_back  # trials in flight or held when the study stops early, handed back to it
        self.unsettled = unsettled
        self.flights: dict[Any, Flight] = {}  # worker -> the trial it runs
        self.ready: collections.deque[Flight] = collections.deque()  # the next trials, asked and not sent yet
        self.ended: list[tuple[Flight, dict[str, Any], str]] = []  # trials told, not yet counted
        self.jobs = 0
        self.left = 0  # trials the budget has left, as last asked
        self.tally = Tally()

    def run(self) -> Tally:
        selector = selectors.DefaultSelector()
        idle = list(self.pool.workers)
        for w in idle:
            selector.register(w, selectors.EVENT_READ)
        beat = checked = time.monotonic()
        self.slots = len(self.pool.workers)
        try:
            while True:
                idle = self._fill(idle)
                if idle and self.flights and not self.ready and self.left <= 0:  # the budget is spent: a slot that
                    for worker in idle:  # has no trial left gives its resources back (a Slurm job's allocation)
                        selector.unregister(worker)
                        self.pool.release(worker)
                    idle = []
                if not self.flights:
                    while self.ended:
                        self._count(*self.ended.pop(0))
                    self._summary()
                    return self.tally
                wake = min(beat + self.heartbeat_s, checked + ALIVE_S)
                for key, _ in selector.select(timeout=max(0.05, wake - time.monotonic())):
                    idle.extend(self._serve(key.fileobj, selector))
                if time.monotonic() >= checked + ALIVE_S:  # a worker elsewhere can be lost without a word (its
                    checked = time.monotonic()  # node gone: no end of its connection arrives); its process says so
                    for worker in [w for w in self.pool.workers if w.gone() and not _readable(w)]:  # (what it
                        if worker in idle:  # said before it went, and its end, the select reads)
                            idle.remove(worker)
                        idle.extend(self._died(worker, selector))
                idle = self._fill(idle)
                while self.ended:
                    self._count(*self.ended.pop(0))
                if time.monotonic() >= beat + self.heartbeat_s:
                    beat = time.monotonic()
                    _beat([f.trial for f in [*self.flights.values(), *self.ready]])
        except BaseException as e:  # Ctrl-C, SIGTERM, a slot that cannot keep a worker: nothing stays RUNNING
            self._stop(e)
            raise
        finally:
            selector.close()

    def _stop(self, error: BaseException) -> None:
        """The study stops before its trials end: their workers are stopped (their runs end KILLED), then every trial
        in flight or held ready goes back to the study, to run first when the same command runs again."""
        from xp.errors import Terminated

        why = {KeyboardInterrupt: "interrupted (Ctrl-C)", Terminated: "terminated (SIGTERM)"}.get(
            type(error), f"stopped ({type(error).__name__})")
        stopped = list(self.flights)
        self.pool.stop(stopped)
        for worker in stopped:
            if worker.previous is not None:
                self.unsettled(*worker.previous, why)
        trials = [f.trial for f in [*self.flights.values(), *self.ready]]
        self.flights.clear()
        self.ready.clear()
        while self.ended:
            self._count(*self.ended.pop(0))
        if trials:
            self.give_back(trials, why)

    def _fill(self, idle: list[Any]) -> list[Any]:
        """Give every idle worker a trial, then hold one ready for each, while the budget lasts (an asked trial
        that reused an earlier result is told at once, and the budget shrinks)."""
        while idle:
            flight = self.ready.popleft() if self.ready else self._next()
            if flight is None:
                break
            self._start(idle.pop(0), flight)
        while self.flights and len(self.ready) < len(self.pool.workers):
            flight = self._next()
            if flight is None:
                break
            self.ready.append(flight)
        return idle

    def _next(self) -> Flight | None:
        """The next trial asked, with its worker's message; None when the budget is spent."""
        while True:
            self.left = self.remaining()
            if self.left <= 0:
                return None
            trial = self.ask()
            if trial is not None:
                break
        self.jobs += 1
        self.mark(trial)
        _beat([trial])  # alive from the start: a later sweeper does not take it for a lost one
        return Flight(trial, 0.0, self.jobs - 1, self.job_of(trial, self.jobs - 1))

    def _start(self, worker: Any, flight: Flight) -> None:
        worker.send(flight.message)
        flight.started = time.monotonic()
        self.flights[worker] = flight
        if self.tally.first is None:
            self.tally.first = flight.started

    def _serve(self, worker: Any, selector: Any) -> list[Any]:
        """Answer a worker's messages; returns it when it is free again (or its replacement)."""
        messages = worker.pending()
        flight = self.flights.get(worker)
        if messages is None:
            return self._died(worker, selector)
        free = []
        for msg in messages:
            op = msg["op"]
            if op == "report":
                flight.trial.report(msg["value"], msg["step"])
            elif op == "should_prune":
                worker.send({"op": "prune", "prune": bool(flight.trial.should_prune())})
            elif op == "attr":
                flight.trial.set_user_attr(msg["key"], msg["value"])
            elif op == "done":
                worker.finished += 1
                worker.previous = (flight.trial, msg.get("state"))
                del self.flights[worker]
                self.tally.busy_s += time.monotonic() - flight.started
                if msg.get("recycle"):  # it ran something that changes its process for good (mixed precision)
                    selector.unregister(worker)
                    self.pool.retire(worker)
                    worker = self.pool.replace(worker)
                    selector.register(worker, selectors.EVENT_READ)
                nxt = self.ready.popleft() if self.ready else None
                if nxt is not None:  # the trial held ready starts at once; the scheduler tells and asks meanwhile
                    self._start(worker, nxt)
                else:
                    free.append(worker)
                self.ended.append((flight, msg, self.tell(flight.trial, msg)))  # counted once the slot is refilled
                flight = nxt
        return free

    def _died(self, worker: Any, selector: Any) -> list[Any]:
        """A worker died: its trial is lost (and retried), a new worker takes the slot; returns it."""
        selector.unregister(worker)
        why = worker.ended()
        flight = self.flights.pop(worker, None)
        if flight is not None:
            self.tally.busy_s += time.monotonic() - flight.started
            self.lost(flight.trial, why)
            self.tally.states["FAIL"] += 1
        if worker.previous is not None:
            self.unsettled(*worker.previous, why)
        fresh = self.pool.replace(worker)
        selector.register(fresh, selectors.EVENT_READ)
        return [fresh]

    def _summary(self) -> None:
        t = self.tally
        if t.first is None:
            return
        span, slots = time.monotonic() - t.first, self.slots
        log.info(f"study: {sum(t.states.values())} trials on {slots} slot{'s' if slots > 1 else ''} in {span:.1f} s; "
                 f"the slots were busy {t.busy_s / (slots * span):.0%} of the time after the first trial started")

    def _count(self, flight: Flight, msg: dict[str, Any], state: str) -> None:
        t = self.tally
        t.states[state] = t.states.get(state, 0) + 1
        value = msg["values"][0] if state == "COMPLETE" and msg.get("values") else None
        if value is not None and (t.best is None or (value > t.best if self.direction != "minimize" else
                                                     value < t.best)):
            t.best = value
        done = sum(t.states.values())
        elapsed = time.monotonic() - t.started
        left = self.left + len(self.flights) + len(self.ready)
        eta = f", about {elapsed / done * left / max(1, self.slots):.0f} s left" if left and done else ""
        error = f": {msg['error']}" if msg.get("error") else ""
        print(f"study: trial {flight.trial.number} {state.lower()}{error} after "
              f"{time.monotonic() - flight.started:.1f} s | {done} done ({t.states['COMPLETE']} complete, "
              f"{t.states['PRUNED']} pruned, {t.states['FAIL']} failed), {len(self.flights)} running on "
              f"{self.slots} slots" + (f", best {t.best:.4g}" if t.best is not None else "") + eta,
              flush=True, file=sys.stdout)


def _readable(worker: Any) -> bool:
    import select

    return bool(select.select([worker], [], [], 0)[0])


def _beat(trials: list[Any]) -> None:
    """A heartbeat for each trial in flight (an RDB storage's; others keep none)."""
    for t in trials:
        record = getattr(t.study._storage, "record_heartbeat", None)
        if record is not None:
            try:
                record(t._trial_id)
            except Exception as e:  # a database hiccup must not end the study; the next beat tries again
                log.warning(f"heartbeat of trial {t.number}: {e}")


def scheduler_mark() -> str:
    """This scheduler process, as a trial records it: host:pid:start (xp.tracking.spool.same_process)."""
    from xp.tracking.spool import started

    return f"{socket.gethostname()}:{os.getpid()}:{started(os.getpid()):.2f}"


def orphaned(mark: str | None) -> bool:
    """Whether a trial marked by `mark` lost its scheduler: one of this host whose process is gone."""
    from xp.tracking.spool import same_process

    if not mark or mark.count(":") < 2:
        return False
    host, pid, start = mark.rsplit(":", 2)
    return host == socket.gethostname() and pid.isdigit() and not same_process(int(pid), start)
