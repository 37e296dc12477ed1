"""Launching MXNet's parameter server (ps-lite) for kvstore=dist_*: scheduler, servers, workers.

`local` runs every role as a process on this machine, on 127.0.0.1 with a free port
(what the tests use). The launcher process owns the MLflow run: rank 0 logs into it,
and the launcher ends it FINISHED, or FAILED as soon as a worker dies. A worker
blocked in a kvstore barrier cannot run Python code, so it could not end the run
itself. Every wait is bounded; the launcher ends only the processes it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from xp.errors import XPError

LOOPBACK = "127.0.0.1"
WORKER_ENV = "XP_DIST_WORKER"  # set in workers: run as a worker, do not launch again
RUN_ENV = "XP_RUN_ID"  # the MLflow run the launcher created; rank 0 logs into it


class LaunchError(XPError):
    exit_code = 1


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Role:
    name: str
    proc: subprocess.Popen


def dmlc_env(role: str, port: int, servers: int, workers: int) -> dict[str, str]:
    return {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": LOOPBACK, "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NODE_HOST": LOOPBACK, "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers),
            "DMLC_INTERFACE": "lo"}


def launch_local(worker_argv: list[str], servers: int, workers: int, extra_env: dict[str, str],
                 startup_timeout_s: float = 120.0) -> None:
    """Run scheduler, servers and workers; return when every worker succeeded, raise LaunchError otherwise."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    roles: list[Role] = []

    def start(name: str, role: str, argv: list[str], env: dict[str, str]) -> None:
        proc = subprocess.Popen(argv, env={**base, **dmlc_env(role, port, servers, workers), **env},
                                start_new_session=True)  # its own process group: we end it and its children
        roles.append(Role(name, proc))

    # importing mxnet with DMLC_ROLE=scheduler/server runs that role until the job ends
    start("scheduler", "scheduler", [sys.executable, "-c", "import mxnet"], {})
    for i in range(servers):
        start(f"server {i}", "server", [sys.executable, "-c", "import mxnet"], {})
    for i in range(workers):
        start(f"worker {i}", "worker", [sys.executable, "-m", "xp", *worker_argv],
              {WORKER_ENV: "1", "MXNET_UPDATE_ON_KVSTORE": "0", **extra_env})
    try:
        _watch(roles)
    finally:
        _end(roles)


def _watch(roles: list[Role]) -> None:
    workers = [r for r in roles if r.name.startswith("worker")]
    while True:
        for r in roles:
            code = r.proc.poll()
            if code not in (None, 0):
                raise LaunchError(f"{r.name} (pid {r.proc.pid}) exited with code {code}; the other roles were "
                                  "stopped (see the run's log for the worker's error)")
        if all(w.proc.poll() == 0 for w in workers):
            return
        time.sleep(0.2)


def _end(roles: list[Role], grace_s: float = 10.0) -> None:
    """Scheduler and servers exit by themselves after the workers; whatever is left is ended."""
    deadline = time.monotonic() + grace_s
    for r in roles:
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [r for r in roles if r.proc.poll() is None]
        for r in alive:
            try:
                os.killpg(r.proc.pid, sig)  # the group we created for it, nothing else
            except ProcessLookupError:
                pass
        for r in alive:
            try:
                r.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
