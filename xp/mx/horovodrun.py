"""Horovod (gloo) as a launch engine, and `python -m xp.mx.horovodrun ARGS` = `horovodrun ARGS` with its
rendezvous server bound to one address.

Horovod 0.28's HTTP rendezvous server listens on every interface; xp binds it to the address the workers
reach (XP_BIND: 127.0.0.1 on this machine, host_ip across hosts). Across hosts horovodrun starts the remote
workers itself with ssh: xp puts an `ssh` first on its PATH that is the launcher's transport (ssh with xp's
options, srun inside a Slurm allocation, ...), and the job's id travels in the environment horovodrun exports,
so xp ends them all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from xp.launching.engine import LOOPBACK, Engine, Role, free_port, python, worker_command
from xp.run.worker import HOST_FROM_ENV

if TYPE_CHECKING:
    from xp.launching.engine import JobHandle

BIND_ENV = "XP_BIND"
# gloo's own limit on any wait for a peer (30 s unless set): a worker that lags longer (a loaded host, a pause)
# fails the job, however long dist_timeout_s allows. xp gives it dist_timeout_s; its watchdog ends a real stall.
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)")
_TERMINATING = "Terminating remaining workers after failure of Process"  # the exits after it are horovodrun's kills


class Horovod(Engine):
    name = "horovod"
    forwarded = ("MXNET_", "HOROVOD_", "GLOO_", "NCCL_")
    interface_here = True  # horovodrun takes its rendezvous address from the interface here

    def check(self) -> None:
        import importlib.util

        from xp.errors import ConfigError

        if importlib.util.find_spec("horovod.runner") is None:
            raise ConfigError("backend=horovod: horovodrun (horovod.runner) is not installed; ./dev.sh setup "
                              "builds Horovod against the installed mxnet")

    def roles(self, job: JobHandle) -> list[Role]:
        s = self.spec
        env = {BIND_ENV: s.bind, HOST_FROM_ENV: "HOROVOD_HOSTNAME",  # the host horovodrun names its processes by
               GLOO_TIMEOUT_ENV: os.environ.get(GLOO_TIMEOUT_ENV, str(int(s.timeout_s)))}  # (>= 1 s)
        if s.remote:
            hosts = ",".join(f"{h}:{n}" for h, n in s.placement())
            nic = s.interface  # None: horovodrun finds the interfaces the hosts share itself
            shim = Path(job.folder) / "bin"
            shim.mkdir(exist_ok=True)  # a job's later rounds (elastic) find it there
            # horovodrun reaches the hosts with ssh: the launcher's transport, as ssh (ssh with xp's options, srun...)
            assert s.transport is not None  # (a remote job's spec has its launcher's transport)
            (shim / "ssh").write_text(f"#!/bin/sh\nexec {s.transport.as_ssh()} \"$@\"\n")
            (shim / "ssh").chmod(0o755)
            env["PATH"] = f"{shim}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        else:
            hosts, nic = f"{LOOPBACK}:{s.workers}", "lo"
        argv = [python(), "-m", "xp.mx.horovodrun", "--gloo", "-np", str(s.workers), "-H", hosts,
                *(["--network-interfaces", nic] if nic else []), "--start-timeout", str(int(s.timeout_s)),
                "--disable-cache", *worker_command(s)]
        return [Role("horovodrun", argv, env, runner=True)]

    def failed(self, line: str, exits: dict[int, int], state: dict[str, Any]) -> None:
        if _TERMINATING in line:
            state["terminating"] = True
        m = _EXIT.search(line)
        if m and not state.get("terminating"):
            exits.setdefault(int(m.group(1)), int(m.group(2)))

    def describe(self) -> str:
        if self.spec.remote:
            return f"{self.spec.workers} Horovod workers (gloo) on {', '.join(self.hosts())} (horovodrun here)"
        return f"{self.spec.workers} Horovod workers (gloo) on {LOOPBACK}"


def bound_port(address: str) -> Callable[[Callable[[tuple[str, int]], Any]], tuple[Any, int]]:
    def find_port(server_factory: Callable[[tuple[str, int]], Any]) -> tuple[Any, int]:
        for _ in range(100):
            port = free_port(address)
            try:
                return server_factory((address, port)), port
            except OSError:
                continue  # taken between the probe and the bind: another one
        raise RuntimeError(f"no free port on {address} for Horovod's rendezvous server")
    return find_port


def main() -> None:
    import horovod.runner.http.http_server as http_server
    from horovod.runner.launch import run_commandline

    http_server.find_port = bound_port(os.environ.get(BIND_ENV, LOOPBACK))
    run_commandline()


if __name__ == "__main__":
    main()
