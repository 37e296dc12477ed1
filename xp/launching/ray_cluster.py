"""launcher=ray: a job's processes and a study's workers on the nodes of a Ray cluster.

The cluster's live nodes are the hosts (their CPUs, or GPUs, the slots) and Ray is the transport: every process
xp starts on a node is a Ray actor pinned there, holding the CPUs and GPUs the process asks for, that runs the
command as any transport's far end does (xp.launching.remote run: what to run arrives on stdin; when stdin
closes, or the actor dies with its owner or its node, the process group ends). So torchrun, horovodrun, ps-lite
and the study's trial workers run on Ray unchanged, and the engines never learn that Ray exists.

On this machine each such process is a small Ray driver, `python -m xp.launching.ray_cluster exec JSON HOST
COMMAND` (what `RayActors.argv` gives): it connects to the cluster, starts the actor, forwards stdin to it and its
output back, and exits with its exit code, 255 when the node was lost (as ssh does for a host it cannot reach).
The xp command itself never connects to Ray: `nodes` asks a short-lived driver the same way. Without
launcher.address (or $RAY_ADDRESS) the command starts a cluster of this machine for itself (`local_cluster`).
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from xp.errors import ConfigError, one_line
from xp.launching.hosts import HostSlots, Transport
from xp.launching.launcher import OnHosts
from xp.launching.slots import Slot
from xp.run.settings import number

LOOPBACK = "127.0.0.1"
LOST = 255  # exit code of a process whose node was lost (ssh's for an unreachable host: the job names the host)
MISSING_RAY = "launcher=ray: needs Ray (pip install 'xp[ray]')"


@dataclass(frozen=True)
class RayOptions:
    """launcher=ray's settings (conf/launcher/ray.yaml)."""
    address: str | None = None  # HOST:PORT of the cluster's head, or auto inside one; null: $RAY_ADDRESS, or local
    cpus_per_process: float = 1.0  # CPUs each process (a job's worker, a study's slot) holds on its node
    gpus_per_process: float = 0.0  # GPUs each job process holds (a study's trial holds its gpus_per_trial)
    connect_timeout_s: float = 30.0  # the cluster, or a node with room for a process, within this long


@dataclass(frozen=True)
class RayActors(Transport):
    """A command on a node = a Ray actor there that runs it (see the module's docstring)."""
    name: ClassVar[str] = "ray"
    address: str = ""
    cpus: float = 1.0
    gpus: float = 0.0
    connect_timeout_s: float = 30.0
    anywhere: bool = False  # a node that is gone: the actor goes wherever Ray finds room (a study's slot)

    def argv(self, host: str, command: str) -> list[str]:
        return [sys.executable, "-m", "xp.launching.ray_cluster", "exec", json.dumps(asdict(self)), host, command]


class Ray(OnHosts):
    """The live nodes of the Ray cluster at launcher.address; each process an actor on its node."""
    name = "ray"
    nodes = "the Ray cluster's nodes"
    Options = RayOptions
    _found: list[dict] | None = None  # the cluster's live nodes, asked once
    _trial_gpus = 0.0  # a study's slot: the GPUs its actor holds (its trial's, over trials_per_gpu)

    @classmethod
    def read_options(cls, raw: dict[str, Any]) -> RayOptions:
        o = super().read_options(raw)
        for key, lo, hi in (("cpus_per_process", 0, 1024), ("gpus_per_process", 0, 64), ("connect_timeout_s", 1, 3600)):
            number({f"launcher.{key}": getattr(o, key)}, f"launcher.{key}", lo, hi)
        return o

    def given(self) -> str | None:
        return self.options.address or os.environ.get("RAY_ADDRESS")

    def cluster(self) -> str:
        return self.given() or local_cluster(float(self.options.connect_timeout_s))

    def address(self) -> str | None:
        return self.settings.host_ip or (None if self.given() else LOOPBACK)

    def check_plan(self, plan: Any) -> None:
        if plan.elastic.enabled:
            raise ConfigError("elastic.enabled=true: launcher=ray places a fixed set of processes; "
                              "use launcher=ssh with elastic.discovery for hosts that come and go")

    def _nodes(self) -> list[dict]:
        if self._found is None:
            self._found = nodes(self.cluster(), self.options.connect_timeout_s)
        return self._found

    def hosts(self, gpus: float | None = None) -> list[HostSlots]:
        """Every live node with room for a process: slots = its CPUs (GPUs, for processes that hold GPUs) over
        what a process holds."""
        gpus = self.options.gpus_per_process if gpus is None else gpus
        key, each = ("GPU", gpus) if gpus else ("CPU", self.options.cpus_per_process)
        found = [HostSlots(n["address"], int(n[key] // each) if each else 1) for n in self._nodes()]
        if not any(h.slots for h in found):
            have = ", ".join(f"{n['address']}: {n['CPU']:g} CPUs, {n['GPU']:g} GPUs" for n in self._nodes())
            raise ConfigError(f"launcher=ray: no node of the cluster at {self.cluster()} has {each:g} {key}s for a "
                              f"process ({have})")
        return [h for h in found if h.slots]

    def transport(self, gpus: float | None = None, anywhere: bool = False) -> RayActors:
        o = self.options
        return RayActors(self.cluster(), float(o.cpus_per_process), float(o.gpus_per_process if gpus is None else gpus),
                         float(o.connect_timeout_s), anywhere)

    def slots(self, gpus_per_trial: int, parallel: int | None, trials_per_gpu: int) -> list[Slot]:
        from xp.launching.slots import host_slots

        self._trial_gpus = gpus_per_trial / trials_per_gpu if gpus_per_trial else 0.0
        if not gpus_per_trial:
            return super().slots(0, parallel, trials_per_gpu)
        hosts = [HostSlots(h.name, h.slots * gpus_per_trial) for h in self.hosts(gpus=gpus_per_trial)]
        return host_slots(hosts, gpus_per_trial, parallel, trials_per_gpu)

    def start_worker(self, slot: Slot, told: dict[str, Any]) -> subprocess.Popen:
        """A study's worker: an actor holding the slot's CPUs and its trial's share of GPUs (Ray gives the actor
        its devices: the slot's device numbers are not used); a slot whose node was lost is placed where Ray
        finds room."""
        from xp.launching.hosts import start_there

        told = {**told, "env": {k: v for k, v in told["env"].items() if k != "CUDA_VISIBLE_DEVICES"}}
        return start_there(self.transport(gpus=self._trial_gpus, anywhere=True), slot.host, told)


@functools.cache
def local_cluster(timeout_s: float) -> str:
    """launcher.address unset, no $RAY_ADDRESS: a Ray cluster of this machine for this command, a head on 127.0.0.1
    with its CPUs and GPUs, held by xp.launching.remote run (its process group ends when this process exits or dies:
    its stdin closes). Its address."""
    import atexit
    import shutil
    import tempfile

    from xp.launching.engine import free_port

    ray = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray is None:
        raise ConfigError(MISSING_RAY)
    port, folder = free_port(), tempfile.mkdtemp(prefix="xp-ray-")
    argv = [ray, "start", "--head", "--block", f"--port={port}", f"--node-ip-address={LOOPBACK}",
            f"--temp-dir={folder}", "--include-dashboard=false", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}"]  # not Ray's fixed 52365: a second cluster here starts too
    log = tempfile.TemporaryFile()  # what ray start says: the line of its failure
    holder = subprocess.Popen([sys.executable, "-m", "xp.launching.remote", "run"], stdin=subprocess.PIPE,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    holder.stdin.write(json.dumps({"argv": argv, "env": {"RAY_USAGE_STATS_ENABLED": "0"}}).encode() + b"\n")
    holder.stdin.flush()

    def stop() -> None:
        holder.stdin.close()  # the holder ends the head's process group: SIGTERM, SIGKILL after a grace
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + timeout_s
    while _refused(LOOPBACK, port, 1.0):
        if holder.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            said = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
            raise ConfigError(f"launcher=ray: no launcher.address, and a Ray cluster of this machine did not start "
                              f"within {timeout_s:g} s ({said[-1].strip()[:200] if said else 'ray start --head'})")
        time.sleep(0.2)
    print(f"xp: launcher=ray: a Ray cluster of this machine for this command at {LOOPBACK}:{port} "
          "(no launcher.address)", flush=True)
    return f"{LOOPBACK}:{port}"


def _refused(host: str, port: int, timeout_s: float) -> OSError | None:
    """Why nothing answers at host:port (None: something does)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return e
    return None


def nodes(address: str, timeout_s: float) -> list[dict]:
    """The cluster's live nodes: [{"id", "address", "CPU", "GPU"}], asked by a short-lived driver (xp itself
    never connects to Ray). One line (ConfigError) when Ray is missing or no cluster answers."""
    try:
        r = subprocess.run([sys.executable, "-m", "xp.launching.ray_cluster", "nodes", address, str(timeout_s)],
                           capture_output=True, text=True, timeout=timeout_s + 30)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"launcher.address={address}: no Ray cluster answered within {timeout_s + 30:g} s") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        raise ConfigError(lines[-1] if lines else f"launcher.address={address}: asking Ray failed ({r.returncode})")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --- the drivers (python -m xp.launching.ray_cluster ...) ------------------------------------------------------
def _connect(address: str, timeout_s: float) -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise SystemExit(MISSING_RAY) from None
    host, _, port = address.rpartition(":")
    # Ray waits a minute for a head that is not there: a refused connection is at once
    if host and port.isdigit() and (e := _refused(host, int(port), timeout_s)):
        raise SystemExit(f"launcher.address={address}: no Ray cluster answers there ({e.strerror or e})")
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(int(timeout_s)))
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False,
                 namespace="xp")
    except Exception as e:  # no cluster there: Ray says so in its own words
        raise SystemExit(f"launcher.address={address}: no Ray cluster answers there ({one_line(e)[:200]})") from None
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

        from xp.tracking.tracker import PLACED_ENV

        self.label, ctx = label, ray.get_runtime_context()
        try:
            log = os.readlink("/proc/self/fd/1")  # Ray's file for this worker's output
        except OSError:
            log = "?"
        where = {"xp.ray.actor": ctx.get_actor_id(), "xp.ray.node": ctx.get_node_id(),
                 "xp.ray.log": f"{ray.util.get_node_ip_address()}:{log}"}
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env={**os.environ, PLACED_ENV: json.dumps(where)})
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()

    def __repr__(self) -> str:
        return self.label

    def _pump(self) -> None:
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
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
                self.proc.stdin.close()
            else:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it ended: its exit code says how

    def read(self, wait_s: float) -> tuple[bytes, int | None]:
        """What it wrote since the last call (waiting up to wait_s for something), and its exit code once it
        has ended and said everything."""
        chunks, deadline = [], time.monotonic() + wait_s
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
    told, holds, label = b"", True, f"xp process on {host}"  # one that takes a slot holds its CPUs and GPUs
    if "xp.launching.remote run" in command:  # xp's own: what to run is the first line on stdin
        told = sys.stdin.buffer.readline()
        try:
            spec = json.loads(told)
            holds = spec.get("slot", True)  # a job's service (a ps-lite server) takes no slot
            label = _label(spec.get("env", {}), host)
        except (ValueError, AttributeError):
            pass
    elif "xp.launching.remote" in command:  # probing or reaping a node: no share of it
        holds, label = False, f"xp probe of {host}"
    where = NodeAffinitySchedulingStrategy(node["id"], soft=t.anywhere) if node else "DEFAULT"
    actor = ray.remote(Process).options(num_cpus=t.cpus if holds else 0, num_gpus=t.gpus if holds else 0,
                                        max_concurrency=4, max_restarts=0, scheduling_strategy=where)
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
    if told:
        actor.write.remote(told)
    return actor


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
            while data := sys.stdin.buffer.read1(65536):
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
    if argv[:1] == ["nodes"] and len(argv) in (2, 3):
        ray = _connect(argv[1], float(argv[2]) if len(argv) == 3 else 30.0)
        print(json.dumps(_live(ray)))
        return 0
    if argv[:1] == ["exec"] and len(argv) == 4:
        code = run_there(RayActors(**json.loads(argv[1])), argv[2], argv[3])
        sys.stdout.flush()
        os._exit(code)  # Ray's threads must not hold up the exit
    print("usage: python -m xp.launching.ray_cluster nodes ADDRESS [TIMEOUT_S] | exec JSON HOST COMMAND",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
