"""MXNet's parameter server (ps-lite, kvstore=dist_*) as a launch engine: a scheduler, servers and workers,
told their roles through DMLC_* variables (importing mxnet with DMLC_ROLE=scheduler/server runs that role).

launcher=local: every role on this machine, on 127.0.0.1. launcher=ssh: the scheduler here, on host_ip;
servers (one per host, round robin, `servers` of them) and workers (filling the hosts' slots) on the hosts.
xp starts the remote roles itself rather than through the dmlc tracker in the mxnet wheel: the tracker
crashes on Python >= 3.9 (Thread.isAlive), forwards only a fixed list of variables, runs each remote
command in a daemon thread whose failure nobody sees, and cannot end what it started.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from xp.errors import ConfigError
from xp.launching.engine import LOOPBACK, Engine, Role, check_port, free_port, python, worker_command

if TYPE_CHECKING:
    from xp.run.plan import Plan
    from xp.launching.engine import JobHandle


CONNECT_ENV = "XP_CONNECT_TIMEOUT_S"  # how long a worker tries to reach the scheduler


def check_scheduler() -> None:
    """In a ps-lite worker: fail with a clear error when the scheduler cannot be reached (MXNet would wait forever)."""
    role = os.environ.get("DMLC_ROLE")
    host, port = os.environ.get("DMLC_PS_ROOT_URI"), os.environ.get("DMLC_PS_ROOT_PORT") or ""
    if role != "worker" or not host or not port.isdigit():
        raise ConfigError("kvstore=dist_*: this process is not a parameter-server worker (DMLC_ROLE=worker, "
                          "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT are set by the launcher); "
                          "run it through python -m xp, which launches the roles")
    timeout = float(os.environ.get(CONNECT_ENV, "60"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(f"cannot reach the parameter-server scheduler at {host}:{port} within {timeout:g} s "
                                  "(DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT); is it running and reachable?") from None
            time.sleep(0.5)


class PsLite(Engine):
    name = "ps-lite"
    forwarded = ("MXNET_", "DMLC_")
    not_inherited = ("DMLC_",)  # each role's DMLC_ROLE and addresses are its own

    @classmethod
    def env_for(cls, plan: Plan) -> dict[str, str]:
        # whether MXNet's Module updates on the servers (dist_async; Gluon is told directly)
        return {"MXNET_UPDATE_ON_KVSTORE": "1" if plan.kvstore == "dist_async" else "0"}

    def check(self) -> None:
        if self.spec.port:
            check_port(self.spec.port, self.spec.bind)

    def hosts(self) -> list[str]:
        if not self.spec.remote:
            return []
        workers = [h for h, _ in self.spec.placement()]
        return list(dict.fromkeys([*workers, *self.server_hosts()]))

    def server_hosts(self) -> list[str]:
        names = [h.name for h in self.spec.hosts]
        return [names[i % len(names)] for i in range(self.spec.servers)]

    def env(self, role: str, port: int, host: str | None) -> dict[str, str]:
        s = self.spec
        env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": s.bind, "DMLC_PS_ROOT_PORT": str(port),
               "DMLC_NUM_SERVER": str(s.servers), "DMLC_NUM_WORKER": str(s.workers)}
        if not s.remote:
            env.update(DMLC_NODE_HOST=LOOPBACK, DMLC_INTERFACE="lo")
        elif host is None:
            env["DMLC_NODE_HOST"] = s.bind  # the scheduler, on the address the hosts reach
        elif s.interface:
            env["DMLC_INTERFACE"] = s.interface  # ps-lite takes the node's address from this interface
        else:
            env["DMLC_NODE_HOST"] = host
        return env

    def roles(self, job: JobHandle) -> list[Role]:
        s = self.spec
        port = s.port or free_port(s.bind)
        role_cmd = [python(), "-c", "import mxnet"]
        roles = [Role("scheduler", role_cmd, self.env("scheduler", port, None), worker=False)]
        servers = self.server_hosts() if s.remote else [None] * s.servers
        for i, host in enumerate(servers):
            roles.append(Role(f"server {i}", role_cmd, self.env("server", port, host), host=host, worker=False))
        workers = [h for h, n in s.placement() for _ in range(n)] if s.remote else [None] * s.workers
        for i, host in enumerate(workers):
            roles.append(Role(f"worker {i}", worker_command(s), self.env("worker", port, host), host=host))
        return roles

    def describe(self) -> str:
        s = self.spec
        if not s.remote:
            return f"{s.workers} workers and {s.servers} servers on {LOOPBACK}"
        return (f"{s.workers} workers and {s.servers} servers on {', '.join(self.hosts())} over {s.via} "
                f"(scheduler here on {s.bind})")
