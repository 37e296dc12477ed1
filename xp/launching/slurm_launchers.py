"""launcher=slurm: two launchers sharing their settings and srun, one for each place a command can run. From a
login node (`SlurmSubmitting`) the run is submitted with sbatch and followed to its end, and a study's slots are
Slurm jobs, each a long-lived worker that takes trial after trial; inside an allocation (`SlurmInAllocation`: the
submitted job, or salloc) its nodes are the hosts and srun the transport, as launcher=ssh has its hosts file and
ssh. `launcher=slurm` makes whichever fits where the command runs (`Slurm.__new__`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from xp.errors import ConfigError
from xp.launching import slurm
from xp.launching.hosts import HostSlots, Transport
from xp.launching.launcher import OnHosts
from xp.launching.slots import Slot
from xp.launching.slurm import SlurmOptions

if TYPE_CHECKING:
    from xp.run.plan import Plan


class Slurm(OnHosts):
    """What both kinds share: the settings (conf/launcher/slurm.yaml), the plan's check, srun."""
    name = "slurm"
    nodes = "the Slurm job's nodes"
    Options = SlurmOptions
    moved = {"slurm.": "launcher."}
    sweeps = "a sweep's jobs go to Slurm with hydra/launcher=submitit_slurm"

    def __new__(cls, settings: Any = None) -> Slurm:
        if cls is Slurm:  # launcher=slurm: the kind for where this command runs
            cls = SlurmInAllocation if slurm.inside() else SlurmSubmitting
        return super().__new__(cls)

    @classmethod
    def read_options(cls, raw: dict[str, Any]) -> SlurmOptions:
        super().read_options(raw)
        return SlurmOptions.read(raw)

    def check_plan(self, plan: Plan) -> None:
        s = self.options
        if plan.workers != s.nodes * s.tasks_per_node:
            raise ConfigError(f"workers={plan.workers}: launcher=slurm runs launcher.nodes x launcher.tasks_per_node = "
                              f"{s.nodes} x {s.tasks_per_node} = {s.nodes * s.tasks_per_node} workers; make them "
                              "agree")

    def transport(self) -> Transport:
        return slurm.Srun()


class SlurmInAllocation(Slurm):
    """Inside a Slurm allocation: its nodes are the hosts (their slots its tasks), srun the transport; a study's
    slots are the nodes' slots, its workers started through srun."""

    def _allocation(self) -> tuple[list[HostSlots], str]:
        if not hasattr(self, "_nodes"):
            self._nodes = slurm.allocation(self.options.tasks_per_node)
        return self._nodes

    def hosts(self) -> list[HostSlots]:
        return self._allocation()[0]

    def address(self) -> str | None:
        return self.settings.host_ip or self._allocation()[1]

    def submitted_run(self) -> str | None:
        from xp.run.worker import RUN_ENV

        return os.environ.get(RUN_ENV) or None


class SlurmSubmitting(Slurm):
    """On a login node: the run is submitted (sbatch) and followed; a study's slots are Slurm jobs, each a
    long-lived worker that takes trial after trial (a slot frees and is refilled at once: no batches)."""

    def __init__(self, settings: Any = None):
        super().__init__(settings)
        self._avoid: dict[int, str] = {}  # a study's slot -> the node its last worker job was lost on

    def address(self) -> str | None:  # the login node as the partition's nodes reach it
        return self.settings.host_ip or slurm.login_address(self.options)

    def submits(self) -> bool:
        return True

    def check_submission(self) -> None:
        slurm.check(self.options)

    def submit(self, plan: Plan, argv: list[str], tracker: Any) -> None:
        slurm.submit(plan, self.options, argv, tracker)

    def check_study(self, tracking_uri: str) -> None:
        from xp.launching.reach import check_reachable

        self.check_submission()
        check_reachable(tracking_uri, [self.nodes], self.address())

    def slots(self, gpus_per_trial: int, parallel: int | None, trials_per_gpu: int) -> list[Slot]:
        return slurm.worker_slots(self.options, gpus_per_trial, parallel)

    def start_worker(self, slot: Slot, command: dict[str, Any]) -> Any:
        return slurm.WorkerJob.submit(self.options, slot, command, avoid=self._avoid.get(slot.index))

    def worker_ended(self, handle: Any) -> str:
        handle.poll()  # its batch system says how it went (as it stood when the worker was lost), then it is
        how = str(handle)  # ended (it may live on a lost node)
        handle.terminate()
        return how

    def worker_lost(self, slot: Slot, handle: Any) -> None:
        # the job's worker went while Slurm had it running (or its node failed): the slot's next jobs go elsewhere
        if handle.node and handle.lost_with_node:
            self._avoid[slot.index] = handle.node

    def reap(self, hosts: list[str], job: str) -> None:
        slurm.cancel_named(job)  # whatever the study's worker jobs left in the queue
