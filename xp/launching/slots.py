"""Where a study's trials run: slots. A slot is what one trial needs: `gpus` GPUs of a host (several trials may
share one: trials_per_gpu), or on a CPU host a set of its cores; its trials are pinned to it (the GPUs through
CUDA_VISIBLE_DEVICES, the cores through the process's CPU affinity, with the thread counts set to match).
Slots are disjoint: no two trials compete for a device or a core."""

from __future__ import annotations

import os
from dataclasses import dataclass

from xp.errors import ConfigError
from xp.run.gpu import visible_gpu_ids

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class Slot:
    index: int
    gpus: tuple[int, ...]  # NVML indices; (): a CPU trial
    cores: tuple[int, ...]  # the CPU cores its processes may run on; (): a share of its host's, found there
    host: str = ""  # "": this machine
    rank: int = 0  # on another host: its place among that host's slots ...
    of: int = 1  # ... and how many that host has (its share of the host's cores is the rank-th of `of`)

    def env(self) -> dict[str, str]:
        """The variables a trial on this slot runs with (the thread counts: pin())."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus))} if self.gpus else {}

    def pin(self) -> tuple[int, ...]:
        """In the slot's worker, before anything starts a thread: the process kept to the slot's cores (a remote
        slot's: its share of what the host gives this process), its thread counts set to match; its cores."""
        mine = sorted(os.sched_getaffinity(0))
        cores = self.cores
        if not cores:
            share = len(mine) // self.of
            cores = tuple(mine[self.rank * share:(self.rank + 1) * share]) if share else (mine[self.rank % len(mine)],)
        for task in os.listdir("/proc/self/task"):  # every thread there is (numpy's BLAS may have some)
            try:
                os.sched_setaffinity(int(task), cores)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        if set(cores) != set(mine):  # a share: as many threads as it has cores. The whole machine: the frameworks'
            # own defaults, as a plain run has them (MXNet runs LeNet 1.4x faster on 2 cores without OMP_NUM_THREADS=2)
            os.environ.update({v: str(len(cores)) for v in THREAD_VARIABLES})
        return cores

    def describe(self) -> str:
        where = f"GPU {','.join(map(str, self.gpus))} and " if self.gpus else ""
        cores = f"cores {span(self.cores)}" if self.cores else f"share {self.rank + 1} of {self.of} of the cores"
        return f"slot {self.index}: {where}{cores} on {self.host or 'this machine'}"

    def tags(self) -> dict[str, str]:
        """What a trial run on this slot records (xp.slot.*)."""
        return {"xp.slot": str(self.index), "xp.slot.gpus": ",".join(map(str, self.gpus)) or "none",
                "xp.slot.cores": span(self.cores) if self.cores else f"share {self.rank + 1}/{self.of}",
                "xp.slot.host": self.host or "local"}


def span(cores: tuple[int, ...]) -> str:
    """0-3,6 for (0, 1, 2, 3, 6)."""
    parts: list[list[int]] = []
    run: list[int] = []
    for c in sorted(cores):
        if run and c != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(c)
    parts.append(run) if run else None
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in parts)


def plan_slots(gpus_per_trial: int, parallel: int | None, trials_per_gpu: int = 1,
               gpu_ids: list[int] | None = None, cores: list[int] | None = None) -> list[Slot]:
    """The slots of this machine for trials of `gpus_per_trial` GPUs (0: CPU trials), `parallel` of them (None:
    as many as the machine offers: each group of `gpus_per_trial` GPUs `trials_per_gpu` times, or each core).
    The cores are shared out evenly and disjoint; only more CPU slots than cores share them."""
    gpu_ids = visible_gpu_ids() if gpu_ids is None else gpu_ids
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if gpus_per_trial > 0:
        groups = [tuple(gpu_ids[i:i + gpus_per_trial]) for i in range(0, len(gpu_ids), gpus_per_trial)]
        groups = [g for g in groups if len(g) == gpus_per_trial]
        if not groups:
            raise ConfigError(f"gpus={gpus_per_trial} per trial: this machine shows xp {len(gpu_ids)} GPU"
                              f"{'' if len(gpu_ids) == 1 else 's'}; give each trial fewer (gpus=N) or none (gpus=0)")
        devices = [g for g in groups for _ in range(trials_per_gpu)]
        n = len(devices) if parallel is None else parallel
        if n > len(devices):
            raise ConfigError(f"sweep.parallel={parallel}: {len(groups)} group{'s' if len(groups) > 1 else ''} of "
                              f"{gpus_per_trial} GPU{'s' if gpus_per_trial > 1 else ''} x {trials_per_gpu} trials "
                              f"each make {len(devices)} slots; ask for at most {len(devices)}, pack more trials on "
                              "a GPU (sweep.trials_per_gpu=N), or leave sweep.parallel unset")
    else:
        n = len(cores) if parallel is None else parallel
        devices = [()] * n
    share = len(cores) // n
    return [Slot(i, devices[i], tuple(cores[i * share:(i + 1) * share]) if share else (cores[i % len(cores)],))
            for i in range(n)]


def host_slots(hosts: list, gpus_per_trial: int, parallel: int | None, trials_per_gpu: int = 1) -> list[Slot]:
    """The slots of other hosts (a launcher's, each with its slots: HOST:N in a hosts file). A host of N slots
    takes N CPU trials, each on a share of its cores, or with `gpus_per_trial` GPUs per trial, N // gpus
    groups of GPUs (0..N-1 there) `trials_per_gpu` times. `parallel`: at most so many, taken from every host
    in turn."""
    per_host: list[list[Slot]] = []
    for h in hosts:
        if gpus_per_trial > 0:
            groups = [tuple(range(i, i + gpus_per_trial)) for i in range(0, h.slots - gpus_per_trial + 1,
                                                                         gpus_per_trial)]
            devices = [g for g in groups for _ in range(trials_per_gpu)]
        else:
            devices = [()] * h.slots
        per_host.append([Slot(0, d, (), h.name, rank, len(devices)) for rank, d in enumerate(devices)])
    if not any(per_host):
        raise ConfigError(f"gpus={gpus_per_trial} per trial: no host of the hosts file has that many slots "
                          "(HOST:SLOTS: its GPUs); give each trial fewer")
    turns = [p[i] for i in range(max(len(p) for p in per_host)) for p in per_host if i < len(p)]  # host by host
    if parallel is not None and parallel > len(turns):
        raise ConfigError(f"sweep.parallel={parallel}: the hosts offer {len(turns)} slots; ask for at most "
                          f"{len(turns)} or leave sweep.parallel unset")
    chosen = turns[:parallel] if parallel is not None else turns
    return [Slot(i, s.gpus, (), s.host, s.rank, s.of) for i, s in enumerate(chosen)]
