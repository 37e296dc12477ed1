"""PyTorch's intra-op threads fitted to the cores this process has, as other processes leave them.

Torch starts one OpenMP thread per core of the machine. Every parallel operator then waits at a barrier for all of
them, and a thread whose core another process is using waits for that process's time slice: LeNet on the digits ran
at 7,000 samples/s alone on 2 cores and at 1,200-1,600 beside one CPU-bound process (one thread: 4,600-6,400). So
before each epoch the threads are set to the cores the process's affinity gives it less what the other processes
used of them over the last epoch (from /proc/stat, less this process's own time), between 1 and the count torch
started with (OMP_NUM_THREADS, a slot's cores). Linux only; elsewhere nothing changes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

log = logging.getLogger("xp")

MIN_S = 0.05  # a shorter interval says too little (/proc/stat counts in 10 ms ticks)


def _busy_ticks(cores: set[int]) -> int | None:
    """The ticks the cores spent on anything but idle and iowait, since boot (None where /proc/stat is not)."""
    try:
        lines = open("/proc/stat").read().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            values = [int(v) for v in fields]
            total += sum(values) - values[3] - (values[4] if len(values) > 4 else 0)
    return total


def _own_ticks() -> int:
    """This process's user and system ticks (all its threads), since it started."""
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


class FitThreads:
    """torch.set_num_threads to the cores left free by other processes, read again at each `fit()`."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.cap = torch.get_num_threads()  # what torch started with: OMP_NUM_THREADS, or the machine's cores
        self.cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.threads = self.cap
        self.last = self._read()

    def _read(self) -> tuple[float, int, int] | None:
        busy = _busy_ticks(self.cores) if self.cores else None
        return None if busy is None else (time.monotonic(), busy, _own_ticks())

    def others(self) -> float | None:
        """The cores' worth the other processes used since the last reading (None: nothing to read, or too soon)."""
        now = self._read()
        if now is None or self.last is None or now[0] - self.last[0] < MIN_S:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self.last, now
        self.last = now
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / self.hz / (t1 - t0))

    def fit(self) -> int:
        """Set the threads for what comes next; returns their number."""
        others = self.others()
        if others is None or self.cap <= 1:
            return self.threads
        threads = max(1, min(self.cap, round(len(self.cores) - others)))
        if threads != self.threads:
            self.torch.set_num_threads(threads)
            log.info("torch: %d intra-op thread%s (other processes used %.1f of the %d cores this process has)",
                     threads, "" if threads == 1 else "s", others, len(self.cores))
            self.threads = threads
        return threads
