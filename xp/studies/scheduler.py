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
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xp.interrupts import held_interrupts
from xp.states import TRIAL_ENDS, TrialState
from xp.studies.channel import Attr, Done, Kept, Message, Prune, Ready, Report, ShouldPrune, RunTrial
from xp.studies import pruning
from xp.tracking.spool import STORE_WAIT_S  # (a complete trial waits this long at most for its records: Kept)

NO_SPACE = ("[Errno 28]", ": the disk is full: ")  # in a trial's error (ENOSPC, xp.run.checkpoint's check): its
# host's disk was full

if TYPE_CHECKING:
    from optuna.trial import Trial

    from xp.studies.search import Search


log = logging.getLogger("xp")

ALIVE_S = 2.0  # how often the workers running a trial are checked for a process that ended without a word


@dataclass
class Flight:
    trial: Trial  # the Optuna trial (the scheduler's)
    started: float  # when it was sent to its worker (0.0 while the scheduler holds it ready)
    job: int
    message: RunTrial  # what its worker was sent


@dataclass
class Tally:
    """What the study did in this process, for the progress lines."""
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRIAL_ENDS, 0))
    busy_s: float = 0.0  # slot-seconds spent running trials
    started: float = field(default_factory=time.monotonic)
    first: float | None = None  # when the first trial started


class Scheduler:
    """Keeps every slot of `pool` busy with a trial of `search` (xp.studies.search) until it has none left to start
    and none is in flight. The search gives the next trial and is told how each ended (or that its worker was
    lost); `runs` (xp.studies.sweeper.Runs) makes each trial's message for a worker, marks who runs it, and ends
    the runs that do not end on their own: given back at a stop (`give_back`), lost, or the trial a gone worker
    finished last (`unsettled`: its run's last records may have gone with it: its worker sends them while it runs
    the next). The scheduler never asks which search it drives.

    The scheduler holds the next trials asked (`ready`, one per slot) while every slot runs one: the first slot
    to free starts the oldest the moment it reports, without waiting for the scheduler to tell and ask (tens of
    ms a trial; with short pruned trials, a tenth of a slot's time), also when several free at once. Trials start
    in the order they were asked, on whichever slot frees first: none waits behind a long trial while another
    slot is free. The sampler proposes each without the results of the trials in flight when it was asked."""

    def __init__(self, pool: Any, search: Search, runs: Any, heartbeat_s: float, budget: Any = None):
        self.pool, self.search, self.runs = pool, search, runs
        self.waiting = False  # every proposal was a running trial's: none is asked until a trial ends
        self.heartbeat_s = heartbeat_s
        self.budget = budget  # its time and money (xp.studies.budget), or None
        self.stopped: str | None = None  # why no more trials start before the trial budget is spent
        self.flights: dict[Any, Flight] = {}  # worker -> the trial it runs
        self.ready: collections.deque[Flight] = collections.deque()  # the next trials, asked and not sent yet
        self.ended: list[tuple[Flight, Done, str]] = []  # trials told, not yet counted
        # worker -> the COMPLETE trials it ran whose run's records are not in the store yet (Done.kept false), with
        # when it said so: each is told once its worker says Kept; lost (and retried) if its worker goes before
        self.unkept: dict[Any, list[tuple[Flight, Done, float]]] = {}
        self.jobs = 0
        self.leader: Any = None  # the search's best so far, as of the last trial told
        self.left = 0  # trials the budget has left, as last asked
        self.tally = Tally()

    def run(self) -> Tally:
        idle = list(self.pool.workers)
        inbox = self.pool.inbox  # every worker's messages, whatever carries them (xp.studies.channel)
        beat = checked = time.monotonic()
        self.slots = len(self.pool.workers)
        with held_interrupts() as held:  # a signal lands between two storage calls, or while the scheduler waits
            self.pool.stopping = lambda: bool(held.pending)  # (a new worker's start does not hold the stop up)
            try:
                while True:
                    held.check()
                    idle = self._fill(idle)
                    if idle and self.flights and not self.ready and self.left <= 0:  # the budget is spent: a slot
                        for worker in idle:  # with no trial left gives its resources back (a Slurm job's allocation)
                            if not self.unkept.get(worker):  # (once its trials' records are kept)
                                self.pool.release(worker)
                        idle = [w for w in idle if self.unkept.get(w)]
                    self._overdue()
                    if not self.flights and not any(self.unkept.values()):
                        while self.ended:
                            self._count(*self.ended.pop(0))
                        self._summary()
                        return self.tally
                    if self.budget is not None and (why := self.budget.stops_now()):  # sweep.hard_stop=true
                        self._stop(why)
                        continue
                    with held.waiting():
                        got = inbox.get(min(beat + self.heartbeat_s, checked + ALIVE_S) - time.monotonic())
                    while got is not None:  # everything that came, in order
                        worker, msg = got
                        if worker in self.pool.workers:  # (a replaced, released or retired worker's last words: not)
                            if msg is None:  # a Ctrl-C that reached its workers too stops the study: no trial lost
                                held.check()
                                if worker in idle:
                                    idle.remove(worker)
                            idle.extend(self._serve(worker, msg) if msg is not None else self._died(worker))
                        got = inbox.get(0)
                    if time.monotonic() >= checked + ALIVE_S:  # a worker elsewhere can be lost without a word (its
                        checked = time.monotonic()  # node gone: its connection stays open); its process says so
                        for worker in self.pool.workers:
                            if worker.gone():  # what it said before it went is still read, then its channel ends
                                worker.channel.hang_up()
                    idle = self._fill(idle)
                    while self.ended:
                        self._count(*self.ended.pop(0))
                    if time.monotonic() >= beat + self.heartbeat_s:
                        beat = time.monotonic()
                        _beat([f.trial for f in [*self.flights.values(), *self.ready]]
                              + [f.trial for kept in self.unkept.values() for f, _, _ in kept])
            except BaseException as e:  # Ctrl-C, SIGTERM, a slot that cannot keep a worker: nothing stays RUNNING
                from xp.errors import Terminated

                self._stop({KeyboardInterrupt: "interrupted (Ctrl-C)", Terminated: "terminated (SIGTERM)"}.get(
                    type(e), f"stopped ({type(e).__name__})"))
                raise
            finally:
                if self.budget is not None:
                    self.budget.save(force=True)

    def _stop(self, why: str) -> None:
        """The study stops before its trials end (`why`): their workers are stopped (their runs end KILLED), then
        every trial in flight or held ready goes back to the study, to run first when the same command runs again."""
        self.stopped = self.stopped or why
        stopped = list(self.flights)
        self.pool.stop(stopped)
        self._last_words(stopped)
        for worker, unkept in self.unkept.items():  # trials whose records are on their way: told as they ended (their
            for flight, msg, _ in unkept:  # workers deliver them as they leave; what the store did not take, the next
                self.ended.append((flight, msg, self._told(flight.trial, msg)))  # command or xp.sync delivers)
        self.unkept.clear()
        for worker in stopped:
            if worker.previous is not None:
                trial, state = worker.previous
                self.runs.unsettled(trial, state, why)
        trials = [f.trial for f in [*self.flights.values(), *self.ready]]
        self.flights.clear()
        self.ready.clear()
        while self.ended:
            self._count(*self.ended.pop(0))
        if trials:
            self.runs.give_back(trials, why)

    def _last_words(self, stopped: list[Any], within_s: float = 2.0) -> None:
        """What stopped workers said before they went (a trial's MLflow run id) is recorded on their trials: read
        until each one's channel ends, within_s at most."""
        left, deadline = set(stopped), time.monotonic() + within_s
        while left and (got := self.pool.inbox.get(deadline - time.monotonic())) is not None:
            worker, msg = got
            if msg is None:
                left.discard(worker)
            elif isinstance(msg, Attr) and worker in self.flights:
                self.flights[worker].trial.set_user_attr(msg.key, msg.value)
            elif isinstance(msg, Kept):
                self._serve(worker, msg)

    def _fill(self, idle: list[Any]) -> list[Any]:
        """Give every idle worker a trial, then hold one ready for each, while the budget lasts (an asked trial
        that reused an earlier result is told at once, and the budget shrinks)."""
        while idle:
            flight = self._held() or self._next()
            if flight is None:
                break
            self._start(idle.pop(0), flight)
        while self.flights and len(self.ready) < len(self.pool.workers):
            flight = self._next()
            if flight is None:
                break
            self.ready.append(flight)
        return idle

    def _refused(self) -> bool:
        """The study's time or money budget lets no more trials start (the trials held ready go back to it)."""
        ran = sum(self.tally.states.values())
        why = self.budget.refuses(self.tally.busy_s / ran if ran else 0.0) if self.budget is not None else None
        if why is None:
            return False
        if self.stopped is None:
            self.stopped = why
            log.info(f"study: no more trials start: {why}")
        self.left = 0
        if self.ready:
            self.runs.give_back([f.trial for f in self.ready], "out of budget")
            self.ready.clear()
        return True

    def _held(self) -> Flight | None:
        """The oldest trial held ready, if the budget lets it start."""
        return self.ready.popleft() if self.ready and not self._refused() else None

    def _next(self) -> Flight | None:
        """The next trial asked, with its worker's message; None when the budget is spent, or while every proposal
        is a trial running already (`waiting`: asked again once a trial ends, not at every turn of the loop)."""
        self.left = self.search.remaining()
        if self.left <= 0 or self._refused() or self.waiting:
            return None
        trial = self.search.ask()
        if trial is not None and self.budget is not None and self._refused():  # spent while it was asked (a
            self.runs.give_back([trial], "out of budget")  # loaded machine's ask takes long): it starts not
            return None
        if trial is None:
            self.waiting = self.search.remaining() > 0
            return None
        self.jobs += 1  # (who asked it is on the trial already: xp.studies.trial.make_sampler marks it)
        _beat([trial])  # alive from the start: a later sweeper does not take it for a lost one
        return Flight(trial, 0.0, self.jobs - 1, self.runs.message(trial, self.jobs - 1))

    def _start(self, worker: Any, flight: Flight) -> None:
        worker.send(flight.message)
        flight.started = time.monotonic()
        self.flights[worker] = flight
        if self.tally.first is None:
            self.tally.first = flight.started

    def _serve(self, worker: Any, msg: Message) -> list[Any]:
        """Answer a worker's message; returns it when it is free again (or its replacement)."""
        from optuna.exceptions import UpdateFinishedTrialError

        flight = self.flights.get(worker)
        if isinstance(msg, (Report, ShouldPrune, Attr)):  # (of the trial in flight on it)
            trial = self.flights[worker].trial
            try:
                if isinstance(msg, Report):
                    pruning.report(trial, self.runs.spec, msg.values, msg.step)
                elif isinstance(msg, ShouldPrune):
                    why = pruning.should_prune(trial, self.runs.spec)
                    worker.send(Prune(why is not None, why or ""))
                else:
                    trial.set_user_attr(msg.key, msg.value)
            except UpdateFinishedTrialError:  # ended by another sweeper of the study (it took this one for dead):
                if isinstance(msg, ShouldPrune):  # the run goes on; how it ends is said when it does (_told)
                    worker.send(Prune(False, ""))
        elif isinstance(msg, Kept):  # a complete trial's records are in the store: it is told now
            unkept = self.unkept.get(worker, [])
            for i, (done, result, _) in enumerate(unkept):
                if done.trial.number == msg.number:
                    del unkept[i]
                    self.ended.append((done, result, self._told(done.trial, result)))
                    break
        elif isinstance(msg, Ready):  # a worker on a slot the site added (xp.launching.pool: the cluster grew)
            self.slots = max(self.slots, len(self.pool.workers))
            return self._died(worker) if worker.gone() else [worker]
        elif isinstance(msg, Done) and flight is not None:
            worker.finished += 1
            worker.previous = (flight.trial, msg.state)
            del self.flights[worker]
            self.tally.busy_s += time.monotonic() - flight.started
            if msg.recycle:  # it ran something that changes its process for good (mixed precision)
                self.pool.retire(worker)
                worker = self.pool.replace(worker)
            nxt = self._held() if worker is not None else None
            if nxt is not None:  # the trial held ready starts at once; the scheduler tells and asks meanwhile
                self._start(worker, nxt)
            if msg.kept or msg.recycle:
                self.ended.append((flight, msg, self._told(flight.trial, msg)))  # counted once the slot is refilled
            else:  # told once its records are in the store (Kept)
                self.unkept.setdefault(worker, []).append((flight, msg, time.monotonic()))
            return [worker] if nxt is None and worker is not None else []
        return []

    def _died(self, worker: Any) -> list[Any]:
        """A worker died: its trial is lost (and retried), a new worker takes the slot; returns it."""
        why = worker.ended()
        flight = self.flights.pop(worker, None)
        if flight is not None:
            self.tally.busy_s += time.monotonic() - flight.started
        unkept = [f for f, _, _ in self.unkept.pop(worker, [])]  # complete, but what they made went with their worker
        for lost in [*unkept, *([flight] if flight is not None else [])]:  # (its host gone, say): lost and retried
            self.runs.lost(lost.trial, why if lost is flight else f"{why}, before its complete trial's records "
                           "reached the store")
            self.tally.states[TrialState.FAIL] += 1
            if self.ready and (retry := self._next()) is not None:  # the lost one's retry starts before the
                self.ready.appendleft(retry)  # trials held behind it: the trials run in the order they were asked,
                # and each proposal sees what it would have seen had nothing been lost (trial.proposal_number)
        if worker.previous is not None and all(worker.previous[0] is not f.trial for f in unkept):
            trial, state = worker.previous
            self.runs.unsettled(trial, state, why)
        fresh = self.pool.replace(worker)
        return [fresh] if fresh is not None else []  # (None: its slot was dropped)

    def _overdue(self) -> None:
        """A complete trial whose records have waited for the store longer than STORE_WAIT_S (as long as a trial
        waits for a store that went away) is told anyway: they wait in its worker's spool (delivered as it leaves, by
        the next command or by xp.sync)."""
        for unkept in self.unkept.values():
            while unkept and time.monotonic() - unkept[0][2] > STORE_WAIT_S:
                flight, msg, _ = unkept.pop(0)
                log.warning(f"trial {flight.trial.number}: its run's records did not reach the tracking store within "
                            f"{STORE_WAIT_S:.0f} s of its end: told complete, they wait in its worker's spool")
                self.ended.append((flight, msg, self._told(flight.trial, msg)))

    def _told(self, trial: Trial, msg: Done) -> str:
        from optuna.exceptions import UpdateFinishedTrialError

        if msg.state == TrialState.FAIL and any(s in (msg.error or "") for s in NO_SPACE):  # its host's, not its own failure: lost,
            # retried with its parameters, not counted (found by benchmarks/chaos.py: a host's checkpoint folder full
            # for 30 s failed 7 trials in a row, each counted in the budget)
            self.runs.lost(trial, "its host's disk was full at a commit")
            return TrialState.FAIL
        try:
            state = self.search.told(trial, msg.state, list(msg.values or []), msg.error)
        except UpdateFinishedTrialError:
            frozen = trial.study._storage.get_trial(trial._trial_id)
            log.warning(f"trial {trial.number} ended {msg.state}, but another sweeper of the study had ended it "
                        f"{frozen.state.name} meanwhile (it took this one for dead: no heartbeat for grace_s, the "
                        "storage away?): Optuna keeps that; the trial's run keeps what it measured")
            return str(frozen.state.name)
        self.leader = self.search.leader()  # (the search's best so far, by its own rule: the answer it would give
        self.runs.told(trial, state, self.leader)  # now; read once a trial end, by the progress line and @best)
        return state

    def _summary(self) -> None:
        t = self.tally
        if self.budget is not None:
            log.info(f"study: budget spent: {self.budget.line()}" + (f"; {self.stopped}" if self.stopped else ""))
        if t.first is None:
            return
        span, slots = time.monotonic() - t.first, self.slots
        log.info(f"study: {sum(t.states.values())} trials on {slots} slot{'s' if slots > 1 else ''} in {span:.1f} s; "
                 f"the slots were busy {t.busy_s / (slots * span):.0%} of the time after the first trial started")

    def _count(self, flight: Flight, msg: Done, state: str) -> None:
        self.waiting = False  # (a trial ended: its parameters are a result to reuse now, not a run to wait for)
        t = self.tally
        t.states[state] = t.states.get(state, 0) + 1
        leader = self.leader
        done = sum(t.states.values())
        elapsed = time.monotonic() - t.started
        left = self.left + len(self.flights) + len(self.ready)
        eta = f", about {elapsed / done * left / max(1, self.slots):.0f} s left" if left and done else ""
        error = f": {msg.error}" if msg.error else ""
        print(f"{self.search.label(flight.trial)}: trial {flight.trial.number} {state.lower()}{error} after "
              f"{time.monotonic() - flight.started:.1f} s | {done} done ({t.states[TrialState.COMPLETE]} complete, "
              f"{t.states[TrialState.PRUNED]} pruned, {t.states[TrialState.FAIL]} failed), {len(self.flights)} running on "
              f"{len(self.pool.workers)} slots" + (f", best trial {leader.trial} " + " ".join(f"{k}={v:.4g}" for k, v in leader.values.items())
                 + (f" ({leader.judged})" if leader.judged else "") if leader is not None else "") + eta
              + (f" | budget {self.budget.line()}" if self.budget is not None else ""), flush=True, file=sys.stdout)
        if self.budget is not None:
            self.budget.save()


def _beat(trials: list[Any]) -> None:
    """A heartbeat for each trial in flight (an RDB storage's; others keep none)."""
    for t in trials:
        record = getattr(t.study._storage, "record_heartbeat", None)
        if record is not None:
            try:
                record(t._trial_id)
            except Exception as e:  # a database hiccup must not end the study; the next beat tries again
                log.warning(f"heartbeat of trial {t.number}: {e}")
