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
    cores: tuple[int, ...]  # the CPU cores its processes may run on
    host: str = ""  # "": this machine

    def env(self) -> dict[str, str]:
        """The variables a trial on this slot runs with."""
        env = {v: str(len(self.cores)) for v in THREAD_VARIABLES}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        return env

    def describe(self) -> str:
        where = f"GPU {','.join(map(str, self.gpus))} and " if self.gpus else ""
        return f"slot {self.index}: {where}cores {span(self.cores)} on {self.host or 'this machine'}"

    def tags(self) -> dict[str, str]:
        """What a trial run on this slot records (xp.slot.*)."""
        return {"xp.slot": str(self.index), "xp.slot.gpus": ",".join(map(str, self.gpus)) or "none",
                "xp.slot.cores": span(self.cores), "xp.slot.host": self.host or "local"}


def span(cores: tuple[int, ...]) -> str:
    """0-3,6 for (0, 1, 2, 3, 6)."""
    parts, run = [], []
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
