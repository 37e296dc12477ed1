"""The worker's side of a launched job: the variables the launcher sets, and reporting progress. Light on
purpose: every launched worker imports it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time


WORKER_ENV = "XP_DIST_WORKER"  # set in workers: run as a worker, do not launch again
RUN_ENV = "XP_RUN_ID"  # a Slurm batch job: the MLflow run the submitting process created
PROGRESS_ENV = "XP_PROGRESS"  # ADDRESS:PORT of the launcher's progress socket (UDP)
JOB_ENV = "XP_JOB"  # the job's id: every process it starts, on any host, carries it
HOST_ENV = "XP_HOST"  # the host a process runs on, as the hosts file names it
ROLE_ENV = "XP_ROLE"  # the index of the role (process) the launcher started
HOSTS_ENV = "XP_HOSTS"  # the hosts the job occupies (its cost), counted by the launcher
HOST_FROM_ENV = "XP_HOST_FROM"  # the variable a runner's processes find their host's name in


def die_with_parent() -> None:
    """Linux: the kernel ends this process when its parent does, even by SIGKILL (PR_SET_PDEATHSIG); a parent gone
    before we asked: at once. The first thing a launched process does (or its preexec_fn, before it runs)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: it outlives a killed parent, as elsewhere
        return
    if os.getppid() == 1:
        os._exit(1)


_last_report = -1e9
_reporter: socket.socket | None = None


def report_progress(rank: int) -> None:
    """Worker side: tell the launcher this worker is alive and moving (called per batch; sends at most one
    datagram a second; advisory: a lost datagram only delays the next)."""
    global _last_report, _reporter
    target = os.environ.get(PROGRESS_ENV)
    now = time.monotonic()
    if not target or now - _last_report < 1.0:
        return
    # the host as the launcher names it: xp's remote roles are told; a runner that starts processes itself
    # (horovodrun) tells them through the variable its engine names (HOST_FROM_ENV)
    host = os.environ.get(HOST_ENV) or os.environ.get(os.environ.get(HOST_FROM_ENV, ""), "") or socket.gethostname()
    if _last_report < 0:
        sys.stdout.write(f"xp: worker rank {rank} is pid {os.getpid()} on {host}\n")  # one write: workers share a pipe
        sys.stdout.flush()
    _last_report = now
    address, _, port = target.rpartition(":")
    msg = json.dumps({"rank": rank, "pid": os.getpid(), "host": host,
                      "role": os.environ.get(ROLE_ENV)}).encode()
    try:
        if _reporter is None:
            _reporter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _reporter.sendto(msg, (address, int(port)))
    except (OSError, ValueError):
        pass
