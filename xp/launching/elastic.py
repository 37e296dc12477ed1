"""Elastic training: workers join and leave at epoch boundaries while the global batch stays fixed.

Built on checkpoint-and-relaunch of the parameter-server job (see the README for why, not
Horovod's elastic driver). The launching process reads the discovery source (a file of
"host:slots" lines, or an executable printing them, as horovodrun's --host-discovery-script
expects) every `poll_s`. It runs the ps-lite job with as many workers as are usable; when the
count changes it asks the workers to stop after the current epoch (a flag file they agree on
through a collective), and relaunches from the committed state (parameters, optimizer state,
epoch, metrics) with the new count: per-worker batch = global batch / workers, the data
re-sharded by rank, the learning-rate schedule unchanged (it follows the global batch).
A worker that dies mid-epoch fails that job; the launcher rolls back to the last commit and
continues with the workers that are left. One MLflow run covers every relaunch.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from xp.run.worker import RESUMED_ENV, STOP_ENV
from xp.errors import ConfigError
from xp.launching.engine import Engine
from xp.launching.hosts import HostSlots, discovered_hosts
from xp.launching.job import LaunchError, launch

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
def _override(argv: list[str], **values: Any) -> list[str]:
    keys = set(values)
    kept = [a for a in argv if a.split("=", 1)[0].lstrip("+") not in keys]
    return [*kept, *(f"{k}={v}" for k, v in values.items())]


class Membership:
    """Who can take workers now: the discovery source's hosts (launcher=local: this machine's slots), less what
    was lost since the source last changed (a remote host whose worker failed, or a local slot)."""

    def __init__(self, spec: Any, plan: Any):
        self.spec, self.plan = spec, plan
        self.lost, self.lost_hosts, self.lost_at = 0, set(), []

    def listed(self) -> list[HostSlots]:
        e = self.plan.elastic
        if not self.spec.remote:
            return [HostSlots("127.0.0.1", read_slots(e.discovery) if e.discovery else self.plan.workers)]
        return discovered_hosts(e.discovery)

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


def run(engine: Engine, plan: Any, log: Callable[[dict[str, float], int], None]) -> None:
    """Run the elastic job (`plan`: its plan as launched) to its last epoch; raise LaunchError when it
    cannot go on."""
    from xp.run import checkpoint

    e, keep = plan.elastic, bool(plan.checkpoint_dir)
    root = Path(plan.checkpoint_dir).expanduser() if keep else Path(tempfile.mkdtemp(prefix="xp-elastic-"))
    members, restarts, launches = Membership(engine.spec, plan), 0, 0
    try:
        while (done := checkpoint.latest(root)) is None or done.epoch < plan.epochs:
            listed = members.listed()
            members.refresh(listed)
            n = _wait_for_workers(lambda: usable(sum(h.slots for h in members.alive()), e.min_workers,
                                                 e.max_workers, plan.global_batch, len(plan.devices)),
                                  e.wait_s, e.poll_s, e.min_workers)
            log({"elastic.launch_workers": n}, done.epoch if done else 0)
            job = _relaunch(engine, plan, root, n, done, listed, members, first=launches == 0)
            launches += 1
            try:
                launch(job)
            except LaunchError as err:
                restarts += 1
                if restarts > e.max_restarts:
                    raise LaunchError(f"{err} (elastic: {restarts - 1} restarts already, elastic.max_restarts="
                                      f"{e.max_restarts})") from None
                what = members.lose(err, listed)
                back = checkpoint.latest(root)
                print(f"xp: elastic: {err}; rolling back to epoch {back.epoch if back else 0} and going on "
                      f"without the lost {what}", flush=True)
                log({"elastic.restarts": restarts}, back.epoch if back else 0)
    finally:
        if not keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


def _relaunch(engine: Engine, plan: Any, root: Path, n: int, done: Any, listed: list[HostSlots],
              members: Membership, first: bool) -> Engine:
    """The job for the next stretch: n workers, per-worker batch from the fixed global batch, resumed from the
    last commit; it stops after an epoch when the discovery source changes."""
    spec, devices = engine.spec, len(plan.devices)
    flag = root / "stop-after-epoch"
    flag.unlink(missing_ok=True)
    argv = _override(spec.worker_argv, workers=n, batch=plan.global_batch // (devices * n), checkpoint_dir=str(root),
                     checkpoint_every=1, resume=str(root) if done else "null")
    env = {**spec.env, STOP_ENV: str(flag), **({} if first else {RESUMED_ENV: "1"})}

    def poll() -> None:
        if not flag.exists() and members.listed() != listed:
            flag.touch()  # the workers finish this epoch, commit it, and exit

    print(f"xp: elastic: epoch {(done.epoch if done else 0) + 1}/{plan.epochs} on {n} workers "
          f"(batch {plan.global_batch // (devices * n)} per device, global {plan.global_batch})", flush=True)
    return type(engine)(replace(spec, workers=n, worker_argv=argv, env=env, on_poll=poll, poll_s=plan.elastic.poll_s,
                                hosts=members.alive() if spec.remote else spec.hosts))


def _wait_for_workers(count: Callable[[], int | None], wait_s: float, poll_s: float, lo: int) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        n = count()
        if n is not None:
            return n
        if time.monotonic() >= deadline:
            raise LaunchError(f"elastic: fewer than elastic.min_workers={lo} usable workers for {wait_s:g} s "
                              "(the discovery source lists too few slots, or none that divide the global batch)")
        time.sleep(poll_s)

