"""Elastic training: workers join and leave at epoch boundaries while the global batch stays fixed.

A restart and membership policy of one job (`Elastic`, an xp.launching.job.Policy; see the
docs/guides/elastic.md for why checkpoint-and-relaunch, not Horovod's elastic driver). While a round of the
ps-lite processes runs, the job polls the discovery source (a file of "host:slots" lines, or an
executable printing them, as horovodrun's --host-discovery-script expects) every `poll_s`; when
the count changes the workers are asked to stop after the current epoch (a flag file they agree
on through a collective), and the next round starts from the committed state (parameters,
optimizer state, epoch, metrics) with the new count: per-worker batch = global batch / workers,
the data re-sharded by rank, the learning-rate schedule unchanged (it follows the global batch).
A worker that dies mid-epoch fails its round; the next one rolls back to the last commit and
goes on with the workers that are left. One MLflow run covers every round.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from xp.errors import ConfigError
from xp.launching.engine import Spec
from xp.launching.hosts import HostSlots, discovered_hosts
from xp.launching.job import LaunchError, Policy
from xp.run import checkpoint, handoff, spot

if TYPE_CHECKING:
    from xp.run.plan import Plan

LOCAL_HOSTS = ("127.0.0.1", "localhost")


def read_slots(source: str) -> int:
    """Slots the discovery source lists now, all on this machine (launcher=local)."""
    hosts = discovered_hosts(source)
    for h in hosts:
        if h.name not in LOCAL_HOSTS:
            raise ConfigError(f"elastic.discovery={source}: host {h.name!r} is not this machine; with launcher=local "
                              f"the workers run here ({', '.join(LOCAL_HOSTS)}); across hosts use launcher=ssh")
    return sum(h.slots for h in hosts)


def usable(available: int, lo: int, hi: int, global_batch: int, devices: int) -> int | None:
    """Workers to run: at most `available` and `hi`, and dividing the global batch evenly (the largest
    such count: a worker that would break the division waits as a spare); None if fewer than `lo`."""
    for n in range(min(available, hi), lo - 1, -1):
        if global_batch % (n * devices) == 0:
            return n
    return None


# --- launcher side -------------------------------------------------------------------------------
def override(argv: list[str], **values: Any) -> list[str]:
    keys = set(values)
    kept = [a for a in argv if a.split("=", 1)[0].lstrip("+") not in keys]
    return [*kept, *(f"{k}={v}" for k, v in values.items())]


class Membership:
    """Who can take workers now: the discovery source's hosts (launcher=local: this machine's slots), less what
    was lost since the source last changed (a remote host whose worker failed, or a local slot)."""

    def __init__(self, spec: Any, plan: Plan):
        self.spec, self.plan = spec, plan
        self.lost = 0
        self.lost_hosts: set[str] = set()
        self.lost_at: list[HostSlots] = []
        self.t0 = time.time()  # a spot trace's zero: the job's start
        e = plan.elastic
        self.feed = spot.Feed(e.trace_file, e.trace) if e.trace else None

    def listed(self) -> list[HostSlots]:
        e = self.plan.elastic
        source = e.discovery or ""  # (a remote elastic job has one: its launcher's check_plan asks for it)
        if self.feed:  # the hosts the spot market offers now: the first of the pool (remote), or slots here
            n, _ = spot.at(self.feed.now(), (time.time() - self.t0) * e.trace_speed)
            if not self.spec.remote:
                return [HostSlots("127.0.0.1", n)]
            return [HostSlots(h.name, 1) for h in discovered_hosts(source)[:n]]  # an instance, a worker
        if not self.spec.remote:
            return [HostSlots("127.0.0.1", read_slots(e.discovery) if e.discovery else self.plan.workers)]
        return discovered_hosts(source)

    def alive(self) -> list[HostSlots]:
        listed = self.listed()
        if self.spec.remote:
            return [h for h in listed if h.name not in self.lost_hosts]
        return [HostSlots(h.name, h.slots - self.lost) for h in listed]

    def refresh(self, listed: list[HostSlots]) -> None:
        if (self.lost or self.lost_hosts) and listed != self.lost_at:
            self.lost, self.lost_hosts = 0, set()  # a new membership: the source speaks for every worker again

    def lose(self, err: LaunchError, listed: list[HostSlots]) -> str:
        self.lost_at = listed
        if self.spec.remote and err.host:
            self.lost_hosts.add(err.host)
            return f"host {err.host}"
        self.lost += 1
        return "worker"


class Elastic(Policy):
    """Elastic training as the job's policy: each round runs the ps-lite processes on the workers usable now,
    from the last commit; a membership change ends a round at an epoch's end (the flag file), a lost worker
    rolls the next round back to the last commit without it; the job is done at the plan's last epoch."""

    def __init__(self, plan: Plan, log: Callable[[dict[str, float], int], None], hand_plan: bool,
                 launched: handoff.Launched):
        """`hand_plan`: the workers get each round's plan (not with batch=auto); `launched`: what the job's
        workers are told (its MLflow run)."""
        self.plan, self.log, self.poll_s = plan, log, plan.elastic.poll_s
        self.hand_plan, self.launched = hand_plan, launched
        self.keep = bool(plan.checkpoint_dir)
        self.root = Path(plan.checkpoint_dir).expanduser() if plan.checkpoint_dir else \
            Path(tempfile.mkdtemp(prefix="xp-elastic-"))
        self.root.mkdir(parents=True, exist_ok=True)  # the stop flag may be needed before rank 0's first commit
        self.flag = self.root / "stop-after-epoch"
        self.restarts, self.rounds = 0, 0
        self.listed: list[HostSlots] = []

    def first(self, spec: Spec) -> Spec | None:
        self.base, self.members = spec, Membership(spec, self.plan)
        return self._next()

    def poll(self, job: Any) -> None:
        changed = self.members.listed() != self.listed
        if changed and not self.flag.exists():
            self.flag.touch()  # the workers finish this epoch, commit it, and exit
        elif not changed and self.flag.exists():
            self.flag.unlink(missing_ok=True)  # it changed back before the epoch's end: no relaunch for nothing

    def after(self, spec: Spec, error: LaunchError | None) -> Spec | None:
        if error is not None:
            self.restarts += 1
            limit = self.plan.elastic.max_restarts
            if self.restarts > limit:
                raise LaunchError(f"{error} (elastic: {self.restarts - 1} restarts already, elastic.max_restarts="
                                  f"{limit})") from None
            what = self.members.lose(error, self.listed)
            back = checkpoint.latest(self.root)
            print(f"xp: elastic: {error}; rolling back to epoch {back.epoch if back else 0} and going on "
                  f"without the lost {what}", flush=True)
            self.log({"elastic.restarts": self.restarts}, back.epoch if back else 0)
        return self._next()

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def _next(self) -> Spec | None:
        """The next round: n workers, per-worker batch from the fixed global batch, resumed from the last commit;
        None once the last epoch is committed."""
        plan, e = self.plan, self.plan.elastic
        done = checkpoint.latest(self.root)
        if done is not None and done.epoch >= plan.epochs:
            return None
        self.listed = self.members.listed()
        self.members.refresh(self.listed)
        n = wait_for_workers(lambda: usable(sum(h.slots for h in self.members.alive()), e.min_workers,
                                            e.max_workers, plan.global_batch, len(plan.devices)),
                             e.wait_s, e.poll_s, e.min_workers)
        self.log({"elastic.launch_workers": n}, done.epoch if done else 0)
        batch = plan.global_batch // (len(plan.devices) * n)
        self.flag.unlink(missing_ok=True)
        base = self.base
        argv = override(base.worker_argv, workers=n, batch=batch, checkpoint_dir=str(self.root), checkpoint_every=1,
                        resume=str(self.root) if done else "null")
        workers_plan = None  # the round's plan: the same run on n workers, from the last commit
        if self.hand_plan:
            feed = self.members.feed  # the trace as it is now: its prices bill the round
            workers_plan = replace(plan, workers=n, batch=batch, worker_batch=batch * len(plan.devices),
                             checkpoint_dir=str(self.root), checkpoint_every=1, resume=str(self.root) if done else None,
                             elastic=replace(e, trace=feed.trace) if feed else e)
        launched = replace(self.launched, stop_flag=str(self.flag), resumed=self.rounds > 0,
                       job_t0=self.members.t0)
        env = {**base.env, **base.launcher.env(n), handoff.PLAN_ENV: handoff.dumps(workers_plan, launched)}
        self.rounds += 1
        print(f"xp: elastic: epoch {(done.epoch if done else 0) + 1}/{plan.epochs} on {n} workers "
              f"(batch {batch} per device, global {plan.global_batch})", flush=True)
        return replace(base, workers=n, worker_argv=argv, env=env,
                       hosts=self.members.alive() if base.remote else base.hosts)


def wait_for_workers(count: Callable[[], int | None], wait_s: float, poll_s: float, lo: int) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        n = count()
        if n is not None:
            return n
        if time.monotonic() >= deadline:
            raise LaunchError(f"elastic: fewer than elastic.min_workers={lo} usable workers for {wait_s:g} s "
                              "(the discovery source lists too few slots, or none that divide the global batch)")
        time.sleep(poll_s)

