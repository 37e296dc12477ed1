"""launcher=ray's far end: every process xp starts on a Ray node is an actor pinned there (`Process`), holding
the CPUs and GPUs the process asks for, that runs the command as any transport's far end does (xp.launching.remote
run: what to run arrives on stdin; when stdin closes, or the actor dies with its owner or its node, the process
group ends). So torchrun, horovodrun, ps-lite and a study's trial workers run on Ray unchanged.

On the launching machine each such process is a small Ray driver, `python -m xp.launching.ray_actors exec
SETTINGS HOST COMMAND` (what `RayActors.argv` gives; SETTINGS a private file, so a runtime environment's
variables are on no command line): it connects to the cluster, starts the actor, forwards stdin to it and its
output back, and exits with its exit code, 255 when the node was lost (as ssh does for a host it cannot reach).
`python -m xp.launching.ray_actors nodes ADDRESS` prints the cluster's live nodes (the xp command itself never
connects to Ray).
"""

from __future__ import annotations

import functools
import io
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, cast

from xp.errors import one_line
from xp.launching.hosts import Transport

LOST = 255  # exit code of a process whose node was lost (ssh's for an unreachable host: the job names the host)
MISSING_RAY = "launcher=ray: needs Ray (pip install 'xp[ray]')"


@dataclass(frozen=True)
class RayActors(Transport):
    """A command on a node = a Ray actor there that runs it (see the module's docstring)."""
    name: ClassVar[str] = "ray"
    address: str = ""
    cpus: float = 1.0
    gpus: float = 0.0
    connect_timeout_s: float = 30.0
    anywhere: bool = False  # a node that is gone: the actor goes wherever Ray finds room (a study's slot)
    runtime_env: str = ""  # Ray's runtime environment for the actors, as JSON ("": none)
    group: str = ""  # a job's placement group (`reserve`): each process goes into its host's bundle

    def argv(self, host: str, command: str) -> list[str]:
        return self.driver("exec", host, command)

    def driver(self, what: str, *args: str) -> list[str]:
        """The command of a driver doing `what` (exec, reserve) with these settings."""
        return [sys.executable, "-m", "xp.launching.ray_actors", what, _settings(json.dumps(asdict(self))), *args]


@functools.cache
def _settings(text: str) -> str:
    """A file only this user reads, holding `text` (removed when this process exits)."""
    import atexit

    fd, path = tempfile.mkstemp(prefix="xp-ray-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    atexit.register(lambda: os.remove(path) if os.path.exists(path) else None)
    return path


def refused(host: str, port: int, timeout_s: float) -> OSError | None:
    """Why nothing answers at host:port (None: something does)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return e
    return None


# --- the drivers (python -m xp.launching.ray_actors ...) ------------------------------------------------------
def _connect(address: str, timeout_s: float) -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise SystemExit(MISSING_RAY) from None
    host, _, port = address.rpartition(":")
    # Ray waits a minute for a head that is not there: a refused connection is at once
    if host and port.isdigit() and (e := refused(host, int(port), timeout_s)):
        raise SystemExit(f"launcher.address={address}: no Ray cluster answers there ({e.strerror or e})")
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(int(timeout_s)))
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False,
                 namespace="xp")
    except Exception as e:  # no cluster there: Ray says so in its own words
        said = one_line(e)[:200]
        if host in ("127.0.0.1", "localhost", "::1"):  # Ray connects through this machine's address instead
            try:  # (Ray's private API, for a hint only: left out under a Ray where it moved)
                from ray._private.services import resolve_ip_for_localhost

                said += f"; Ray connects to {host} through this machine's address {resolve_ip_for_localhost(host)}"
            except (ImportError, AttributeError):
                pass
        raise SystemExit(f"launcher.address={address}: no Ray cluster answers there ({said})") from None
    return ray


def _live(ray: Any) -> list[dict]:
    return [{"id": n["NodeID"], "address": n["NodeManagerAddress"], "CPU": n["Resources"].get("CPU", 0.0),
             "GPU": n["Resources"].get("GPU", 0.0)} for n in ray.nodes() if n["Alive"]]


class Process:
    """The actor: one command in a shell on its node, its output read by the driver and kept in the actor's log
    (Ray's worker-*.out on the node, which the MLflow runs of its processes name: tags xp.ray.*); Ray's dashboard
    shows it by its label ("xp study slot 0", "xp job ID process 2")."""

    def __init__(self, command: str, label: str):
        import ray

        from xp.tracking.naming import PLACED_ENV

        self.label, ctx = label, ray.get_runtime_context()
        try:
            log = os.readlink("/proc/self/fd/1")  # Ray's file for this worker's output
        except OSError:
            log = "?"
        where = {"xp.ray.actor": ctx.get_actor_id(), "xp.ray.node": ctx.get_node_id(),
                 "xp.ray.log": f"{ray.util.get_node_ip_address()}:{log}"}
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env={**os.environ, PLACED_ENV: json.dumps(where)})
        assert self.proc.stdin is not None and self.proc.stdout is not None  # (pipes, as asked)
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()

    def __repr__(self) -> str:
        return self.label

    def _pump(self) -> None:
        while chunk := os.read(self.stdout.fileno(), 65536):
            self.out.put(chunk)
            try:
                os.write(1, chunk)  # the actor's log too
            except OSError:
                pass
        self.out.put(None)

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def write(self, data: bytes | None) -> None:
        try:
            if data is None:
                self.stdin.close()
            else:
                self.stdin.write(data)
                self.stdin.flush()
        except (OSError, ValueError):
            pass  # it ended: its exit code says how

    def read(self, wait_s: float) -> tuple[bytes, int | None]:
        """What it wrote since the last call (waiting up to wait_s for something), and its exit code once it
        has ended and said everything."""
        chunks: list[bytes] = []
        deadline = time.monotonic() + wait_s
        while True:
            try:
                chunk = self.out.get(timeout=max(0.0, deadline - time.monotonic()) if not chunks else 0)
            except queue.Empty:
                return b"".join(chunks), None
            if chunk is None:
                return b"".join(chunks), self.proc.wait()
            chunks.append(chunk)


def run_there(t: RayActors, host: str, command: str) -> int:
    """The driver of one process on `host` (see the module's docstring); returns its exit code."""
    ray = _connect(t.address, t.connect_timeout_s)
    actor = _place(ray, t, host, command)
    return actor if isinstance(actor, int) else _follow(ray, actor, host)


def _place(ray: Any, t: RayActors, host: str, command: str) -> Any:
    """The actor that runs `command` on `host`, started; or the exit code when it could not be."""
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = next((n for n in _live(ray) if n["address"] == host), None)
    if node is None and not t.anywhere:
        print(f"ray: no live node at {host}", file=sys.stderr, flush=True)
        return LOST
    if node is None and ray.available_resources().get("CPU", 0.0) < t.cpus:  # its node lost, no room elsewhere
        print(f"ray: no live node at {host}, and no room elsewhere for a process of {t.cpus:g} CPUs", file=sys.stderr,
              flush=True)
        return LOST
    line, holds, probe, label = b"", True, False, f"xp process on {host}"  # one that takes a slot holds resources
    if "xp.launching.remote run" in command:  # xp's own: what to run is the first line on stdin
        line = sys.stdin.buffer.readline()
        try:
            spec = json.loads(line)
            holds = spec.get("slot", True)  # a job's service (a ps-lite server) takes no slot
            label = _label(spec.get("env", {}), host)
        except (ValueError, AttributeError):
            pass
    elif "xp.launching.remote" in command:  # probing or reaping a node: no share of it, nor the runtime environment
        holds, probe, label = False, True, f"xp probe of {host}"
    where = NodeAffinitySchedulingStrategy(node["id"], soft=t.anywhere) if node else "DEFAULT"
    if t.group and holds and node:
        where = _bundle(t.group, node["id"]) or where
    runtime_env = json.loads(t.runtime_env) if t.runtime_env and not probe else None
    actor = ray.remote(Process).options(num_cpus=t.cpus if holds else 0, num_gpus=t.gpus if holds else 0,
                                        max_concurrency=4, max_restarts=0, scheduling_strategy=where,
                                        runtime_env=runtime_env)
    actor = actor.remote(command, label)
    try:
        ray.get(actor.node.remote(), timeout=t.connect_timeout_s)
    except GetTimeoutError:
        print(f"ray: no room on {host if node else 'any node'} for a process of {t.cpus:g} CPUs and {t.gpus:g} GPUs "
              f"within {t.connect_timeout_s:g} s", file=sys.stderr, flush=True)
        ray.kill(actor)
        return LOST
    except RayActorError as e:
        print(f"ray: the process on {host} did not start ({one_line(e)[:200]})", file=sys.stderr, flush=True)
        return LOST
    if line:
        actor.write.remote(line)
    return actor


def _bundle(group: str, node: str) -> Any:
    """Where a job's process on `node` goes: its host's bundle of the job's placement group (None: no such group,
    or no bundle there)."""
    from ray.util.placement_group import get_placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        pg = get_placement_group(group)
    except ValueError:  # (a study's slots have none)
        return None
    on = placement_group_table(pg).get("bundles_to_node_id", {})
    index = next((int(i) for i, n in on.items() if n == node), None)
    return None if index is None else PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)


def reserve(t: RayActors, placement: list[tuple[str, int]]) -> int:
    """A job's placement group (`t.group`): a bundle on each host's node of its processes' CPUs and GPUs, spread
    one per node, all ready or none; held while this driver lives (its stdin open: the job's launcher keeps it),
    removed by Ray when it ends. Says "ready" on stdout; exit 2 with one line when the cluster has no room."""
    _connect(t.address, t.connect_timeout_s)
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"CPU": n * t.cpus, **({"GPU": n * t.gpus} if t.gpus else {}), f"node:{host}": 0.001}
               for host, n in placement]
    pg = placement_group(bundles, strategy="STRICT_SPREAD", name=t.group)
    if not pg.wait(timeout_seconds=t.connect_timeout_s):
        remove_placement_group(pg)
        asked = ", ".join(f"{host}: {n * t.cpus:g} CPUs" + (f" {n * t.gpus:g} GPUs" if t.gpus else "")
                          for host, n in placement)
        print(f"launcher=ray: the cluster has no room for the job's processes within {t.connect_timeout_s:g} s "
              f"(asked: {asked})", file=sys.stderr, flush=True)
        return 2
    print("ready", flush=True)
    sys.stdin.buffer.read()  # held until the launcher lets go (or dies)
    return 0


def _label(env: dict[str, str], host: str) -> str:
    from xp.launching.trialworker import SLOT_ENV
    from xp.run.worker import JOB_ENV, ROLE_ENV

    if SLOT_ENV in env:
        return f"xp study slot {json.loads(env[SLOT_ENV]).get('index', '?')}"
    return f"xp job {env.get(JOB_ENV, '?')} process {env.get(ROLE_ENV, '?')} on {host}"


def _follow(ray: Any, actor: Any, host: str) -> int:
    """Forward stdin to the actor's process and its output here until it ends; its exit code. SIGTERM, Ctrl-C or
    a hang-up close its stdin (the far end then ends its process group)."""
    from ray.exceptions import RayActorError

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())

    def feed() -> None:
        try:
            while data := cast(io.BufferedReader, sys.stdin.buffer).read1(65536):  # (what readline left first)
                actor.write.remote(data)
        except (OSError, ValueError):
            pass
        stop.set()

    threading.Thread(target=feed, daemon=True).start()
    closed, out = False, sys.stdout.buffer
    while True:
        if stop.is_set() and not closed:
            actor.write.remote(None)
            closed = True
        try:
            data, code = ray.get(actor.read.remote(0.5))
        except RayActorError:
            print(f"ray: node {host} was lost (its process with it)", file=sys.stderr, flush=True)
            return LOST
        if data:
            out.write(data)
            out.flush()
        if code is not None:
            return code


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C before the process is followed: ended, quietly
    if argv[:1] == ["nodes"] and len(argv) in (2, 3):
        ray = _connect(argv[1], float(argv[2]) if len(argv) == 3 else 30.0)
        print(json.dumps(_live(ray)))
        return 0
    if argv[:1] == ["reserve"] and len(argv) == 3:
        with open(argv[1]) as f:
            code = reserve(RayActors(**json.load(f)), [tuple(p) for p in json.loads(argv[2])])
        sys.stdout.flush()
        os._exit(code)
    if argv[:1] == ["exec"] and len(argv) == 4:
        with open(argv[1]) as f:
            code = run_there(RayActors(**json.load(f)), argv[2], argv[3])
        sys.stdout.flush()
        os._exit(code)  # Ray's threads must not hold up the exit
    print("usage: python -m xp.launching.ray_actors nodes ADDRESS [TIMEOUT_S] | exec SETTINGS HOST COMMAND | "
          "reserve SETTINGS PLACEMENT",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
