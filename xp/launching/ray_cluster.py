"""launcher=ray: a job's processes and a study's workers on the nodes of a Ray cluster.

The cluster's live nodes are the hosts (their CPUs, or GPUs, the slots) and Ray is the transport: every process
xp starts on a node is a Ray actor pinned there (xp.launching.ray_actors, the far end), so torchrun, horovodrun,
ps-lite and the study's trial workers run on Ray unchanged, and the engines never learn that Ray exists. The xp
command itself never connects to Ray: a short-lived driver per process, and one that lists the nodes. Without
launcher.address (or $RAY_ADDRESS) the command starts a cluster of this machine for itself (`local_cluster`).
A study's slots follow the cluster: a slot whose node is lost goes where Ray has room, or is dropped, and the
nodes that join are new slots (`grown`).

Token authentication (Ray 2.60): a cluster started while ~/.ray/auth_token exists asks every driver for a token. xp
passes on what the user's environment or Ray's own file gives, to a cluster that asks for it (`nodes`: asked again
with RAY_AUTH_MODE=token), and its own cluster always has a token of its own (`local_cluster`), whatever the home
folder holds. A cluster that asks for a token xp has not got is one line saying what to set.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xp.errors import ConfigError
from xp.launching.hosts import HostSlots
from xp.launching.launcher import OnHosts
from xp.launching.ray_actors import MISSING_RAY, RayActors, refused
from xp.launching.slots import Slot
from xp.run.settings import number

if TYPE_CHECKING:
    from xp.run.plan import Plan

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RayOptions:
    """launcher=ray's settings (conf/launcher/ray.yaml)."""
    address: str | None = None  # HOST:PORT of the cluster's head, or auto inside one; null: $RAY_ADDRESS, or local
    cpus_per_process: float = 1.0  # CPUs each process (a job's worker, a study's slot) holds on its node
    gpus_per_process: float = 0.0  # GPUs each job process holds (a study's trial holds its gpus_per_trial)
    connect_timeout_s: float = 30.0  # the cluster, or a node with room for a process, within this long
    grow_every_s: float = 30.0  # a study asks the cluster for nodes that joined this often (0: its slots are fixed)
    runtime_env: dict | None = None  # Ray's runtime environment of every process xp starts (env_vars, pip, ...)


class Ray(OnHosts):
    """The live nodes of the Ray cluster at launcher.address; each process an actor on its node."""
    name = "ray"
    nodes = "the Ray cluster's nodes"
    Options = RayOptions
    _found: list[dict] | None = None  # the cluster's live nodes, as last asked
    _asked: tuple[int, int | None, int] = (0, None, 1)  # a study's slots: gpus_per_trial, parallel, trials_per_gpu
    _holder: subprocess.Popen | None = None  # the driver holding a job's placement group (`reserve`)

    def __init__(self, settings: Any = None):
        super().__init__(settings)
        self.group = f"xp-job-{os.getpid()}-{time.monotonic_ns() % 10**9}"  # its job's placement group

    @classmethod
    def read_options(cls, raw: dict[str, Any]) -> RayOptions:
        o = super().read_options(raw)
        for key, lo, hi in (("cpus_per_process", 0, 1024), ("gpus_per_process", 0, 64), ("connect_timeout_s", 1, 3600),
                            ("grow_every_s", 0, 86400)):
            number({f"launcher.{key}": getattr(o, key)}, f"launcher.{key}", lo, hi)
        if o.runtime_env is not None and not isinstance(o.runtime_env, dict):
            raise ConfigError(f"launcher.runtime_env={o.runtime_env!r}: a mapping of Ray's runtime environment "
                              "(launcher.runtime_env={env_vars:{KEY:VALUE}}), or null")
        return o

    @property
    def grow_every_s(self) -> float:
        return float(self.options.grow_every_s)

    def given(self) -> str | None:
        return self.options.address or os.environ.get("RAY_ADDRESS")

    def cluster(self) -> str:
        return self.given() or local_cluster(float(self.options.connect_timeout_s))

    def address(self) -> str | None:
        return self.settings.host_ip or (None if self.given() else LOOPBACK)

    def check_plan(self, plan: Plan) -> None:
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
                         float(o.connect_timeout_s), anywhere, json.dumps(o.runtime_env) if o.runtime_env else "",
                         "" if anywhere else self.group)

    def reserve(self, placement: list[tuple[str, int]]) -> None:
        """A job's processes, all of them or none: a placement group of a bundle per host (its processes' CPUs and
        GPUs, on that node), held by a driver until `reap` (or this process's end) lets go."""
        holder = subprocess.Popen(self.transport().driver("reserve", json.dumps(placement)), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stderr is not None  # pipes: asked for above
        if holder.stdout.readline().strip() != "ready":  # (the driver waits connect_timeout_s at most)
            said = [ln for ln in holder.stderr.read().splitlines() if ln.strip()]
            holder.wait(timeout=30)
            raise ConfigError(said[-1] if said else f"launcher=ray: the job's placement group failed "
                                                    f"({holder.returncode})")
        self._holder = holder

    def reap(self, hosts: list[str], job: str) -> None:
        super().reap(hosts, job)
        if self._holder is not None and self._holder.stdin is not None:  # the placement group goes with its driver
            self._holder.stdin.close()
            try:
                self._holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._holder.kill()
            self._holder = None

    def slots(self, gpus_per_trial: int, parallel: int | None, trials_per_gpu: int) -> list[Slot]:
        self._asked = (gpus_per_trial, parallel, trials_per_gpu)
        return self._offered(parallel)

    def _offered(self, parallel: int | None) -> list[Slot]:
        """The slots the live nodes offer a study's trials (as `slots` was asked), `parallel` at most."""
        from xp.launching.slots import host_slots

        gpus, _, per_gpu = self._asked
        hosts = self.hosts(gpus=gpus) if gpus else self.hosts()  # a trial's GPUs: a node's slots are its GPUs
        return host_slots([HostSlots(h.name, h.slots * max(1, gpus)) for h in hosts], gpus, parallel, per_gpu)

    def grown(self, have: list[Slot], index: int) -> list[Slot]:
        """The slots of nodes that joined since the study's slots (`have`) were given, up to sweep.parallel (a
        study that asked for N slots keeps N), numbered from `index`."""
        parallel, self._found = self._asked[1], None
        try:
            offered = self._offered(None)
        except ConfigError:  # no node with room now
            return []
        room = min(len(offered), parallel or len(offered)) - len(have)
        held, new = collections.Counter(s.host for s in have), list[Slot]()
        for s in offered:
            if held[s.host]:
                held[s.host] -= 1
            elif len(new) < room:
                new.append(dataclasses.replace(s, index=index + len(new)))
        return new

    def start_worker(self, slot: Slot, command: dict[str, Any]) -> subprocess.Popen:
        """A study's worker: an actor holding the slot's CPUs and its trial's share of GPUs (Ray gives the actor
        its devices: the slot's device numbers are not used); a slot whose node was lost is placed where Ray
        finds room."""
        from xp.launching.hosts import start_there

        gpus, _, per_gpu = self._asked
        command = {**command, "env": {k: v for k, v in command["env"].items() if k != "CUDA_VISIBLE_DEVICES"}}
        return start_there(self.transport(gpus=gpus / per_gpu if gpus else 0.0, anywhere=True), slot.host, command)


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
    # a token of its own, whatever ~/.ray/auth_token holds (its presence turns tokens on at `ray start --head`): the
    # head and every driver of this command's (they inherit this environment) use it
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    argv = [ray, "start", "--head", "--block", f"--port={port}", f"--node-ip-address={LOOPBACK}",
            f"--temp-dir={folder}", "--include-dashboard=false", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}"]  # not Ray's fixed 52365: a second cluster here starts too
    log = tempfile.TemporaryFile()  # what ray start says: the line of its failure
    holder = subprocess.Popen([sys.executable, "-m", "xp.launching.remote", "run"], stdin=subprocess.PIPE,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    stdin = holder.stdin
    assert stdin is not None  # a pipe: asked for above
    stdin.write(json.dumps({"argv": argv, "env": {"RAY_USAGE_STATS_ENABLED": "0"}}).encode() + b"\n")
    stdin.flush()

    def stop() -> None:
        stdin.close()  # the holder ends the head's process group: SIGTERM, SIGKILL after a grace
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + timeout_s
    while refused(LOOPBACK, port, 1.0):
        if holder.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            said = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
            raise ConfigError(f"launcher=ray: no launcher.address, and a Ray cluster of this machine did not start "
                              f"within {timeout_s:g} s ({said[-1].strip()[:200] if said else 'ray start --head'})")
        time.sleep(0.2)
    print(f"xp: launcher=ray: a Ray cluster of this machine for this command at {LOOPBACK}:{port} "
          "(no launcher.address)", flush=True)
    return f"{LOOPBACK}:{port}"


AUTH_FAILED = ("InvalidAuthToken", "Unauthenticated", "no authentication token was found")  # what Ray says then
TOKEN_FILE = os.path.join("~", ".ray", "auth_token")  # Ray's own token file


def auth_failed(address: str) -> str:
    """The line for a cluster that asked for a token xp was not given, or refused the one it was."""
    mode, given = os.environ.get("RAY_AUTH_MODE"), token_source()
    if mode == "token" and given:
        what = f"refused the token of {given}"
    else:
        what = "asks for a token (token authentication) and xp was given none" + \
               (f" (RAY_AUTH_MODE={mode})" if mode and mode != "token" else "")
    return (f"launcher.address={address}: the Ray cluster there {what}: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, "
            f"or {TOKEN_FILE}) to the cluster's token (`ray get-auth-token` on its head) and RAY_AUTH_MODE=token")


def nodes(address: str, timeout_s: float) -> list[dict]:
    """The cluster's live nodes: [{"id", "address", "CPU", "GPU"}], asked by a short-lived driver (xp itself
    never connects to Ray). A cluster that asks for a token, where the user's environment or Ray's own file has one
    and RAY_AUTH_MODE is unset: asked again in token mode, which every later driver of this command keeps (a driver
    in token mode cannot run actors on a cluster without tokens: the mode follows the cluster). One line
    (ConfigError) when Ray is missing, no cluster answers, or it asks for a token xp has not got."""
    rc, out, err = _ask(address, timeout_s)
    if rc == AUTH and "RAY_AUTH_MODE" not in os.environ and token_source():
        os.environ["RAY_AUTH_MODE"] = "token"
        rc, out, err = _ask(address, timeout_s)
    if rc == AUTH:
        raise ConfigError(auth_failed(address))
    if rc != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        raise ConfigError(lines[-1] if lines else f"launcher.address={address}: asking Ray failed ({rc})")
    return json.loads(out.strip().splitlines()[-1])


AUTH = -1000  # _ask's return code for a cluster that refused the driver for want of a token


def _ask(address: str, timeout_s: float) -> tuple[int, str, str]:
    """Run the nodes driver; its return code, output and errors. Ray logs a refused token at its first call and
    then retries until its timeout: that line ends the driver at once (AUTH)."""
    import select

    proc = subprocess.Popen([sys.executable, "-m", "xp.launching.ray_actors", "nodes", address, str(timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None  # pipes: asked for above
    deadline, err = time.monotonic() + timeout_s + 30, list[str]()
    try:
        while True:
            if time.monotonic() > deadline:
                raise ConfigError(f"launcher.address={address}: no Ray cluster answered within {timeout_s + 30:g} s")
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            line = proc.stderr.readline() if ready else None
            if line == "":  # its errors closed: it ends
                break
            if line:
                err.append(line)
                if any(said in line for said in AUTH_FAILED):
                    return AUTH, "", "".join(err)
        out = proc.stdout.read()
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), out, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def token_source() -> str | None:
    """Where the user's token is, as Ray looks for it: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file, Ray's own file;
    None where there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path and os.path.isfile(path):
        return path
    return TOKEN_FILE if os.path.isfile(os.path.expanduser(TOKEN_FILE)) else None
