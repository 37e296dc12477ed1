"""PyTorch DDP's torchrun as a launch engine, and `python -m xp.pt.torchrun ARGS` = `torchrun ARGS` with its
rendezvous store bound to one address.

launcher=local: one torchrun here, static rendezvous; its TCPStore server (which would listen on every
interface) gets a socket bound to --master-addr (127.0.0.1). launcher=ssh: the rendezvous store runs here
on host_ip (`python -m xp.pt.torchrun --xp-store ADDRESS:PORT`), one torchrun per host joins it (c10d
rendezvous) with --local-addr its own address, so the process group's store is on rank 0's host.

Elastic (elastic.enabled=true, across hosts): torchrun's own elastic agent, one per member host, with
--nnodes=MIN:MAX and --max-restarts: an agent that starts on a new host makes the running ones restart their
workers into a larger group; a host that goes makes its peers' collectives fail, and their agents restart the
workers without it (xp.launching.elastic.TorchElastic starts and ends the agents as the members change). Each
restart re-plans the worker's batch from the group's size and resumes from xp's last commit.
"""

from __future__ import annotations

import re
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from xp.launching.engine import LOOPBACK, Engine, Role, check_port, free_port, python

if TYPE_CHECKING:
    from xp.run.plan import Plan
    from xp.launching.engine import JobHandle

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")  # torchrun's failure summary: rank, then exitcode
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


class Torchrun(Engine):
    name = "torchrun"
    per_device = True
    forwarded = ("TORCH", "NCCL_", "GLOO_")

    def check(self) -> None:
        if self.spec.port:
            check_port(self.spec.port, self.spec.bind)

    nodes: str | None = None  # elastic: "MIN:MAX" agents (None: a fixed job, one agent per placed host)
    max_restarts = 0  # elastic: worker-group restarts each agent allows (membership changes count as failures do)

    def roles(self, job: JobHandle) -> list[Role]:
        s = self.spec
        port = self.port = s.port or free_port(s.bind)
        common = ["--max-restarts=0", "--monitor-interval=0.5"]
        if not s.remote:
            argv = [python(), "-m", "xp.pt.torchrun", "--nnodes=1", f"--nproc-per-node={s.workers}",
                    f"--master-addr={LOOPBACK}", f"--master-port={port}", *common, "-m", s.module, *s.worker_argv]
            return [Role("torchrun", argv, {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}, runner=True)]
        # the store is xp's own: a torchrun on the store's host (a Slurm job's first node) must not host another
        # (is_host=false), or the two race for the port
        roles = [Role("rendezvous store", [python(), "-m", "xp.pt.torchrun", f"--xp-store={s.bind}:{port}"],
                      worker=False, service=True)]
        placement = s.placement()
        return [*roles, *(self.agent(job, host, n, len(placement)) for host, n in placement)]

    def agent(self, job: JobHandle, host: str, n: int, nodes: int) -> Role:
        """The torchrun agent on `host` for n processes: of `nodes` hosts, or (elastic) of self.nodes."""
        s = self.spec
        env = {"GLOO_SOCKET_IFNAME": s.interface, "NCCL_SOCKET_IFNAME": s.interface} if s.interface else {}
        conf = f"join_timeout={int(s.timeout_s)},is_host=false"
        if self.nodes:
            # a joining agent waits for the running ones only this long once enough are there (30 s by default)
            conf += ",last_call_timeout=2"
            # torch 2.14's shared TCPStore hangs a group that grows: rank 0 writes its address in the first round
            # only, and a new agent waits for it forever (measured); without sharing, every round writes it
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        argv = [python(), "-m", "xp.pt.torchrun", f"--nnodes={self.nodes or nodes}", f"--nproc-per-node={n}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={s.bind}:{self.port}", f"--rdzv-id={job.id}",
                f"--rdzv-conf={conf}", f"--local-addr={host}", f"--max-restarts={self.max_restarts}",
                "--monitor-interval=0.5", "-m", s.module, *s.worker_argv]
        return Role(f"torchrun on {host}", argv, env, host=host, runner=True)

    def elastic_policy(self, plan: Plan, tracker: Any, launched: Any) -> Any:
        """torchrun's own elastic agent: one per member host, MIN:MAX of them, restarting its workers itself; the
        run's parameters are logged here (the workers of every restart are told the run has them)."""
        from xp.pt.elastic import ElasticAgents
        from xp.run.record import params_of
        from xp.run.entry_points import Registry

        e = plan.elastic
        self.nodes, self.max_restarts = f"{e.min_workers}:{e.max_workers}", e.max_restarts
        tracker.log(params=params_of(plan, Registry().load(plan.backend)))
        return ElasticAgents(plan, lambda metrics, step: tracker.log_metrics(metrics, step=step), launched)

    def failed(self, line: str, exits: dict[int, int], state: dict[str, Any]) -> None:
        if "Root Cause" in line:  # torchrun names the first failure it saw here, the others before it
            state["others"] = dict(exits)
            exits.clear()
        m = _RANK.match(line)
        if m:
            state["rank"] = int(m.group(1))
        m = _EXIT.match(line)
        if m and state.get("rank") is not None:
            exits.setdefault(state["rank"], int(m.group(1)))
            if "others" in state:  # the root cause first, then the others (the job names a killed one first)
                for rank, code in state.pop("others").items():
                    exits.setdefault(rank, code)

    def describe(self) -> str:
        if self.spec.remote:
            return (f"{self.spec.workers} PyTorch DDP processes (one torchrun per host, over {self.spec.via}) on "
                    f"{', '.join(self.hosts())}, rendezvous here on {self.spec.bind}")
        return f"{self.spec.workers} PyTorch DDP processes (torchrun) on {LOOPBACK}"


def bound_store(host: str, port: int, world_size: int | None = None, is_master: bool = False,
                timeout: Any = None, **kwargs: Any) -> Any:
    from torch.distributed import TCPStore

    if is_master:  # the server listens on a socket bound to `host` only (TCPStore would bind all interfaces)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(128)
        kwargs["master_listen_fd"] = s.detach()
    return TCPStore(host, port, world_size, is_master, timeout, **kwargs)


def serve_store(address: str) -> None:
    """Host the c10d rendezvous store on ADDRESS:PORT until ended."""
    import datetime

    host, _, port = address.rpartition(":")
    store = bound_store(host, int(port), None, True, datetime.timedelta(seconds=3600), wait_for_workers=False,
                        multi_tenant=True)
    while store is not None:
        time.sleep(3600)


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].startswith("--xp-store="):
        return serve_store(sys.argv[1].split("=", 1)[1])
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static
    from torch.distributed.run import main as torchrun

    static.TCPStore = bound_store
    sys.exit(torchrun())


if __name__ == "__main__":
    main()
