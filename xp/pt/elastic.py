"""Elastic training on PyTorch through torchrun's own elastic agent (xp.pt.torchrun starts the agents): the job's
policy (an xp.launching.job.Policy) that follows the membership while the agents restart their workers."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from xp.launching.elastic import Membership, override, usable, wait_for_workers
from xp.launching.engine import Spec
from xp.launching.hosts import HostSlots
from xp.launching.job import Policy
from xp.run import checkpoint, handoff

if TYPE_CHECKING:
    from xp.run.plan import Plan


class ElasticAgents(Policy):
    """Elastic training through torchrun's own elastic agent (xp.pt.torchrun): one round, one agent per member host
    (--nnodes=MIN:MAX); the agents hold the rendezvous and restart their workers themselves (--max-restarts), each
    restart planning its batch from the group's size and resuming from xp's last commit (TorchBackend.in_group).
    xp only follows the membership: an agent started on a host that joins, the agent of a host that leaves ended
    (its peers' collectives fail, their agents restart without it), a host lost on its own noted and gone on
    without while at least min_workers agents are left."""

    def __init__(self, plan: Plan, log: Callable[[dict[str, float], int], None], launched: handoff.Launched):
        self.plan, self.log, self.poll_s, self.launched = plan, log, plan.elastic.poll_s, launched
        self.root = Path(plan.checkpoint_dir or "").expanduser()  # (torch elastic has one: TorchBackend.check)
        self.root.mkdir(parents=True, exist_ok=True)
        self.restarts = 0
        self.hosts: list[str] = []

    def first(self, spec: Spec) -> Spec | None:
        plan, e = self.plan, self.plan.elastic
        self.members, devices = Membership(spec, plan), len(plan.devices)
        n = wait_for_workers(lambda: usable(len(self.members.alive()), e.min_workers, e.max_workers,
                                            plan.global_batch, devices), e.wait_s, e.poll_s, e.min_workers)
        self.hosts = [h.name for h in self.members.alive()][:n]
        self._logged()
        launched = replace(self.launched, resumed=True, job_t0=self.members.t0)  # params: ours
        argv = override(spec.worker_argv, checkpoint_dir=str(self.root), checkpoint_every=1)
        env = {**spec.env, handoff.PLAN_ENV: handoff.dumps(replace(plan, checkpoint_dir=str(self.root),
                                                                   checkpoint_every=1), launched)}
        return replace(spec, worker_argv=argv, env=env, workers=n * devices,
                       hosts=[HostSlots(h, devices) for h in self.hosts])

    def poll(self, job: Any) -> None:
        e, devices = self.plan.elastic, len(self.plan.devices)
        alive = [h.name for h in self.members.alive()]
        n = usable(len(alive), e.min_workers, e.max_workers, self.plan.global_batch, devices)
        wanted = alive[:n] if n else [h for h in self.hosts if h in alive]
        if wanted == self.hosts:
            return
        agents = {s.role.host: s for s in job.started if s.role.runner}
        for host in self.hosts:
            if host not in wanted and host in agents:
                print(f"xp: elastic: host {host} leaves; its agent is ended and the others restart without it",
                      flush=True)
                job.retire(agents[host])
        for host in wanted:
            if host not in self.hosts:
                print(f"xp: elastic: host {host} joins; the agents restart their workers with it", flush=True)
                job.start(job.engine.agent(job, host, devices, len(wanted)))
        self.hosts = wanted
        self._follow(job)

    def lost(self, job: Any, started: Any, code: int) -> bool:
        host = started.role.host
        gone = code == 255 or code < 0 or code > 128  # its ssh session dropped, or it was killed: the host went
        if not started.role.runner or host not in self.hosts or not gone:
            return False  # an agent that gave up (its workers failed max_restarts times) fails the job
        self.restarts += 1
        left = [h for h in self.hosts if h != host]
        if self.restarts > self.plan.elastic.max_restarts or len(left) < self.plan.elastic.min_workers:
            return False
        self.members.lost_hosts.add(host)
        print(f"xp: elastic: the agent on host {host} was lost (exit {code}); the agents on {', '.join(left)} "
              "restart their workers from the last commit without it", flush=True)
        back = checkpoint.latest(self.root)
        self.log({"elastic.restarts": self.restarts}, back.epoch if back else 0)
        self.hosts = left
        self._follow(job)
        return True

    def _follow(self, job: Any) -> None:
        """The job watches the new membership: its hosts, its process count, progress heard afresh."""
        devices = len(self.plan.devices)
        job.spec.hosts = [HostSlots(h, devices) for h in self.hosts]
        job.spec.workers = len(self.hosts) * devices
        job.beats.clear()  # ranks are assigned anew by the rendezvous
        job.began = time.monotonic()
        self._logged()

    def _logged(self) -> None:
        done = checkpoint.latest(self.root)
        self.log({"elastic.launch_workers": len(self.hosts)}, done.epoch if done else 0)
        print(f"xp: elastic: torchrun agents on {', '.join(self.hosts)} (global batch {self.plan.global_batch})",
              flush=True)
