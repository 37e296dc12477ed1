"""A study under every fault at once, and a checker that reads what was kept.

    sudo .venv/bin/python benchmarks/chaos.py                      # 300 trials, 100 faults, seed 0 (about 40 min)
    sudo .venv/bin/python benchmarks/chaos.py --trials 40 --faults 20 --seed 7    # the short version (about 4 min)

One Optuna study (PostgreSQL) of short trials, its runs on an MLflow server (runs in SQLite, artifacts in a folder),
run by two commands at once as a user runs them: one on 2 slots of the launching machine (launcher=local), one on 2
ssh hosts (launcher=ssh: the tests' network-namespace hosts, tests/hosts.py). While they run, an injector applies
faults at random moments (seeded; each after the study's progress passed a random share of the budget, so the faults
spread over the whole study and overlap: an outage goes on while the next fault lands):

    worker       SIGKILL of a trial's worker (xp.launching.trialworker, on any host)
    job          SIGKILL of a process of a trial's job other than its worker: on an ssh host the process that runs it
                 there (xp.launching.remote run), on this machine the zygote the workers are forked from
    study        SIGKILL of a study command, then the same command again (as a user would)
    sigint       Ctrl-C (SIGINT to the command's process group), then the same command again
    tracking     SIGKILL of the MLflow server, started again at once
    tracking-out the MLflow server stopped for 5-40 s
    postgres-out PostgreSQL (Optuna's storage) stopped (pg_ctl -m immediate) for 5-40 s
    link-down    an ssh host's link down for 5-30 s (inside its namespace)
    host-gone    an ssh host crashes and does not come back (once a run)
    disk-full    the checkpoint folder full on one host (a tiny tmpfs over it) for 5-30 s

When the study has its budget and both commands ended, the checker (check()) reads only what was kept: Optuna's
storage, MLflow's store (through its server), the checkpoint folders, every host's processes; the namespaces are
checked gone after the hosts are taken down. It reports per fault kind the faults applied and the work each cost, and
every violation of the invariants below; the run exits 1 when it found any:

- every COMPLETE trial has exactly one FINISHED MLflow run, with every epoch's points once, its parameters and its
  model; no parameter set ran in two trials unless the second says why (a retried lost trial, a stopped one run again);
  no trial and no run left RUNNING; no process of the study left on any host;
- the study's answer (kept in the storage, on the parent run, `@best`) equals what the checker recomputes from
  Optuna's values (the best value, a tie to the lowest number);
- the study reached its budget; each run that did not complete (work lost) ended while a fault that could end it was
  under way, and the epochs it had trained are at most what the docs promise for that fault: the trials in flight on
  what the fault hit (a retried trial starts again at its first epoch).

Needs root (namespaces) and Debian's postgresql and openssh-server, as the tests do (./dev.sh test installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

KINDS = ("worker", "job", "study", "sigint", "tracking", "tracking-out", "postgres-out", "link-down", "host-gone",
         "disk-full")
STUDY = """\
study_name: chaos
n_trials: {n}
sampler: random
sampler_seed: {seed}
pruner: none
max_retry: 5
params:
  lr: {{type: float, low: 0.005, high: 0.08, log: true}}
  batch: {{type: categorical, choices: [32, 64]}}
"""
EPOCHS = 2
# what each kind may cost, in words (docs/reliability.md), and how many trials in flight it may lose (each at most
# EPOCHS: a retried trial starts again at its first epoch). A fault that ends a worker also loses the trials that
# worker had just ended whose records were not yet in the store (a trial counts complete once they are): counted
# apart ("ended, not yet kept"), allowed for those kinds, a violation for the others
ENDED = ", and those it had ended whose records were not yet in the store"
PROMISE = {
    "worker": ("the trial on that worker's slot" + ENDED, 1),
    "job": ("the trial on that slot (this machine's zygote: the trials in flight on this machine's slots, whose "
            "workers die with it)" + ENDED, 1),
    "study": ("the trials in flight on that command's 2 slots" + ENDED, 2),
    "sigint": ("the trials in flight on that command's 2 slots", 2),
    "tracking": ("nothing", 0),
    "tracking-out": ("nothing", 0),
    "postgres-out": ("nothing", 0),
    "link-down": ("the trial on that host" + ENDED, 1),
    "host-gone": ("the trial on that host" + ENDED, 1),
    "disk-full": ("nothing (a trial waits at its commit for room, XP_ROOM_WAIT_S)", 0),
}
KILL_GAP_S = 15.0
SSH_HOSTS = {f"h{i}" for i in range(2, 10)}  # the ssh hosts' names (tests/hosts.py: h1 is the launcher's namespace)
DURATION = {"tracking-out": (5, 40), "postgres-out": (5, 40), "link-down": (5, 30), "disk-full": (5, 30)}


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _store_away(said: str) -> bool:
    """Whether a command's output is the one line of a store or a host that did not answer as it started (a store
    restarting, a host cut off), and no more: what a user runs again (the preflight's refusal, exit 2)."""
    errors = [line for line in said.splitlines() if line.startswith("xp: error: ")]
    return len(errors) == 1 and any(s in errors[0] for s in ("no MLflow server answers", "no server answers at",
                                                            "cannot connect", ": ssh failed (", "as the run starts: run the command again"))


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    until: float | None = None  # an outage: when it ended (None: under way, or never: host-gone)
    detail: str = ""


def _traceback_in(said: str, around: int = 25) -> str:
    """The first traceback in a command's output with the lines before it, quoted in the violation so that a failed
    run (CI's, whose work folder is gone) says what it was."""
    lines = said.splitlines()
    at = next(i for i, line in enumerate(lines) if "Traceback" in line)
    end = next((i for i in range(at + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), at)
    return "\n".join(lines[max(0, at - 5):min(len(lines), end + 1, at + around)])


def may_lose(f: Fault) -> int:
    """How many trials in flight fault `f` may lose: its kind's promise; a job fault on this machine (not an ssh
    host) killed the zygote, which takes the workers it forked with it (they die with their parent: measured, 2 of
    2 trials in flight lost), so the local command's 2 slots' (the short run under the suite's load found it: a
    zygote kill cost 2, promised 1)."""
    return PROMISE["study"][1] if f.kind == "job" and f.target not in SSH_HOSTS else PROMISE[f.kind][1]


@dataclass
class Command:
    """One of the study's two commands, rerun as a user would after it was killed or stopped."""
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None
    runs: int = 0
    exits: list[tuple[int, bool]] = field(default_factory=list)  # (exit code, whether a fault ended it)
    faulted: bool = False
    ended: float = 0.0
    unprompted: int = 0  # its failures with no fault that ends it (violations)

    def start(self) -> None:
        self.runs += 1
        self.faulted = False
        with self.log.open("a") as sink:
            sink.write(f"\n===== {self.name}: run {self.runs} at {time.time():.1f}\n")
            sink.flush()
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                         start_new_session=True)


class Chaos:
    def __init__(self, work: Path, trials: int, faults: int, seed: int, kinds: tuple[str, ...] = KINDS):
        self.work, self.trials, self.n_faults, self.seed, self.kinds = work, trials, faults, seed, kinds
        self.rng = random.Random(seed)
        self.faults: list[Fault] = []
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self.gone: set[str] = set()
        self.busy: set[str] = set()  # what an outage holds now: "tracking", "postgres", a host's name
        self.timers: list[threading.Thread] = []

    # --- the world ----------------------------------------------------------------------------------------------
    def start_world(self, c) -> None:
        import pg

        self.c = c
        h1 = c.launcher
        self.pg = pg.Server("chaos-pw", host=h1.address, enter=tuple(h1.enter())).start()
        self.storage = self.pg.url("optuna")
        self.mlflow_db = self.work / "mlflow.db"
        (self.work / "artifacts").mkdir(exist_ok=True)
        self.mlflow_proc: subprocess.Popen | None = None
        self.uri = f"http://{h1.address}:5000"
        self.start_mlflow()
        self.ckpt = f"/tmp/xp-chaos-{os.getpid()}/ckpt"  # each host's own /tmp (this machine's for h1)
        sweeps = self.work / "sweeps"
        sweeps.mkdir(exist_ok=True)
        (sweeps / "chaos.yaml").write_text(STUDY.format(n=self.trials, seed=self.seed))
        self.hosts_file = hosts_file = self.work / "hosts"
        hosts_file.write_text("".join(f"{h.address}:1\n" for h in c.workers))
        env = dict(os.environ, PYTHONUNBUFFERED="1", XP_SWEEPS_DIR=str(sweeps), XP_OPTUNA_STORAGE=self.storage,
                   XP_STATE_DIR=str(self.work / "state"))
        for k in ("MLFLOW_TRACKING_URI", "XP_PARENT_RUN_ID"):
            env.pop(k, None)
        common = ["-m", "sweep=chaos", f"epochs={EPOCHS}", f"tracking_uri={self.uri}", "experiment=chaos",
                  f"checkpoint_dir={self.ckpt}", "checkpoint.keep_last=1"]
        self.commands = [
            Command("local", c.on_launcher([sys.executable, "-m", "xp", *common, "launcher=local", "sweep.parallel=2",
                                            f"hydra.sweep.dir={self.work}/sweep-local"]), env,
                    self.work / "local.log"),
            Command("ssh", c.on_launcher([sys.executable, "-m", "xp", *common, "launcher=ssh",
                                          f"launcher.hosts_file={hosts_file}", f"launcher.config={c.ssh_config}",
                                          f"host_ip={h1.address}", "network_interface=eth0",
                                          f"hydra.sweep.dir={self.work}/sweep-ssh"]), env, self.work / "ssh.log"),
        ]

    def start_mlflow(self, timeout: float = 90, tries: int = 4) -> None:
        for attempt in range(tries):  # (a start that found its port not yet free exits at once: again)
            try:
                return self._start_mlflow(timeout)
            except RuntimeError as e:
                log(f"the MLflow server did not start ({str(e)[:200]}): again")
                time.sleep(2.0)
        self._start_mlflow(timeout)

    def _start_mlflow(self, timeout: float) -> None:
        h1 = self.c.launcher
        sink = open(self.work / "mlflow-server.log", "a")
        self.mlflow_proc = subprocess.Popen(
            self.c.on_launcher([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                f"sqlite:///{self.mlflow_db}", "--artifacts-destination", str(self.work / "artifacts"),
                                "--host", h1.address, "--port", "5000", "--workers", "1"]),
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        self.c.launcher.daemons[:] = [self.mlflow_proc]  # (not a process of the study: Cluster.processes)
        deadline = time.monotonic() + timeout
        probe = f"import urllib.request; urllib.request.urlopen('{self.uri}/health', timeout=2)"
        while time.monotonic() < deadline:
            if self.mlflow_proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.mlflow_proc.returncode}: "
                                   f"{(self.work / 'mlflow-server.log').read_text()[-300:]}")
            if subprocess.run(self.c.on_launcher([sys.executable, "-c", probe]), capture_output=True).returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"mlflow server did not answer within {timeout} s")

    def kill_mlflow(self) -> None:
        p = self.mlflow_proc
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its session: the server and its uvicorn worker
            p.wait(timeout=30)

    def stop_world(self) -> None:
        if getattr(self, "counter", None) is not None and self.counter.poll() is None:
            self.counter.kill()
            self.counter.wait(timeout=30)
        self.kill_mlflow()
        self.pg.stop()
        import shutil

        shutil.rmtree(Path(self.ckpt).parent, ignore_errors=True)  # this machine's (the hosts' go with their /tmp)

    # --- progress ------------------------------------------------------------------------------------------------
    def start_counter(self) -> None:
        """The study's progress, read where its storage is (h1's namespace) by a process of this script."""
        self.count_file = self.work / "complete"
        self.counter = subprocess.Popen(self.c.on_launcher([sys.executable, __file__, "--count", self.storage,
                                                            str(self.count_file)]), start_new_session=True)

    def complete(self) -> int | None:
        """COMPLETE trials now (None: not known: the storage is away)."""
        try:
            text = self.count_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def watch_commands(self) -> bool:
        """Rerun a command that a fault ended (and one that ended by itself before the budget, which is a violation);
        True when both ended with the study done."""
        done = 0
        for cmd in self.commands:
            if cmd.proc is None:
                cmd.start()
                continue
            rc = cmd.proc.poll()
            if rc is None:
                continue
            if len(cmd.exits) < cmd.runs:
                cmd.exits.append((rc, cmd.faulted))
                cmd.ended = time.monotonic()
                said = cmd.log.read_text().split(f"===== {cmd.name}: run {cmd.runs} ")[-1]
                if "Traceback" in said:
                    self.violate(f"the {cmd.name} command printed a traceback: see {cmd.log}, run {cmd.runs}: "
                                 + _traceback_in(said))
                elif rc != 0 and not cmd.faulted and not (rc == 2 and _store_away(said)):
                    # (a command started while a store is away says so in one line, exit 2: what a user reruns)
                    cmd.unprompted += 1
                    tail = said.strip().splitlines()[-2:]
                    self.violate(f"the {cmd.name} command exited {rc} with no fault that ends it: {' | '.join(tail)}")
            if rc == 0 and self.finished():
                done += 1
                continue
            # ended by a fault: again at once, as a user would; ended with nothing left to run for it while the other
            # command's trials are in flight: again a little later, to keep its slots busy if one of those is lost
            if rc in (0, 2) and time.monotonic() - cmd.ended < 5:  # (2: a store away as it started: a user
                continue  # waits a little before running it again)
            if cmd.unprompted > 20:
                raise RuntimeError(f"the {cmd.name} command fails by itself again and again: see {cmd.log}")
            cmd.start()
        return done == len(self.commands)

    def finished(self) -> bool:
        n = self.complete()
        return n is not None and n >= self.trials

    def violate(self, what: str) -> None:
        with self.lock:
            self.violations.append(what)
        log("VIOLATION:", what)

    # --- faults --------------------------------------------------------------------------------------------------
    def plan(self) -> list[str]:
        if self.n_faults <= 0:
            return []
        kinds = [k for k in self.kinds if k != "host-gone"]
        plan = [kinds[i % len(kinds)] for i in range(self.n_faults - ("host-gone" in self.kinds))]
        self.rng.shuffle(plan)
        if "host-gone" in self.kinds:  # once, late: the other host and this machine's slots carry the rest
            plan.insert(int(len(plan) * self.rng.uniform(0.55, 0.8)), "host-gone")
        return plan

    def live_hosts(self):
        return [h for h in self.c.workers if h.name not in self.gone]

    def procs(self, host, needle: str) -> list[int]:
        return [p for p in host.pids() if needle in cmdline(p)]

    def apply(self, kind: str) -> Fault | None:
        """Apply one fault of `kind` now; None when it has no target at this moment (tried again later)."""
        c, rng = self.c, self.rng
        # a host whose worker or job was killed in the last KILL_GAP_S is left alone meanwhile: three deaths in a
        # row on one slot without a trial finished are a crash loop, which stops the study (xp.launching.pool's
        # DEATHS), not a fault it is promised to ride out
        hit = {f.target for f in self.faults if f.kind in ("worker", "job") and time.time() - f.at < KILL_GAP_S}
        if kind == "worker":
            targets = [(h, p) for h in [c.launcher, *self.live_hosts()] if h.name not in hit
                       for p in self.procs(h, "xp.launching.trialworker")
                       if "zygote" not in cmdline(p) or "xp.launching.trialworker" in cmdline(parent_of(p))]
            targets = [(h, p) for h, p in targets if "connect" in cmdline(p) or h is c.launcher]
            if not targets:
                return None
            h, p = rng.choice(targets)
            os.kill(p, signal.SIGKILL)
            return Fault(kind, h.name, time.time(), detail=f"pid {p}")
        if kind == "job":
            targets = [(h, p) for h in self.live_hosts() if h.name not in hit
                       for p in self.procs(h, "xp.launching.remote run")]
            targets += [(c.launcher, p) for p in self.procs(c.launcher, "xp.launching.trialworker")
                        if "zygote" in cmdline(p) and "xp.launching.trialworker" not in cmdline(parent_of(p))
                        and c.launcher.name not in hit]
            if not targets:
                return None
            h, p = rng.choice(targets)
            what = "the zygote" if h is c.launcher else "xp.launching.remote"
            os.kill(p, signal.SIGKILL)
            return Fault(kind, h.name, time.time(), detail=f"pid {p} ({what})")
        if kind in ("study", "sigint"):
            running = [cmd for cmd in self.commands if cmd.proc is not None and cmd.proc.poll() is None]
            if not running:
                return None
            cmd = rng.choice(running)
            cmd.faulted = True
            if kind == "study":
                os.kill(cmd.proc.pid, signal.SIGKILL)
            else:
                os.killpg(cmd.proc.pid, signal.SIGINT)
            return Fault(kind, cmd.name, time.time())
        if kind == "tracking":
            if "tracking" in self.busy:
                return None
            self.busy.add("tracking")  # (while it starts again: a command started now finds no server)
            try:
                self.kill_mlflow()
                at = time.time()
                self.start_mlflow()
            finally:
                self.busy.discard("tracking")
            return Fault(kind, "mlflow", at, until=time.time())
        if kind in DURATION:
            lo, hi = DURATION[kind]
            seconds = rng.uniform(lo, hi)
            if kind == "tracking-out":
                target = "tracking"
                if target in self.busy:
                    return None
                self.kill_mlflow()
                undo = self.start_mlflow
            elif kind == "postgres-out":
                target = "postgres"
                if target in self.busy:
                    return None
                self.pg.halt()
                undo = self.pg.resume
            else:
                hosts = [h for h in self.live_hosts() if h.name not in self.busy]
                if kind == "disk-full":
                    hosts = [h for h in [c.launcher, *self.live_hosts()] if h.name + ":disk" not in self.busy]
                if not hosts:
                    return None
                h = rng.choice(hosts)
                if kind == "link-down":
                    target = h.name
                    subprocess.run(["ip", "-n", h.netns, "link", "set", "eth0", "down"], check=True, timeout=30)
                    undo = (lambda h=h: subprocess.run(["ip", "-n", h.netns, "link", "set", "eth0", "up"],
                                                       check=True, timeout=30))
                else:
                    target = h.name + ":disk"
                    enter = self.fill(h)
                    if enter is None:
                        return None
                    undo = (lambda enter=enter: self.unfill(enter))
            fault = Fault(kind, target.split(":")[0], time.time(), detail=f"{seconds:.0f} s")
            self.busy.add(target)

            def end(fault=fault, undo=undo, target=target, seconds=seconds) -> None:
                time.sleep(seconds)
                try:
                    undo()
                finally:
                    fault.until = time.time()
                    self.busy.discard(target)

            t = threading.Thread(target=end, daemon=True)
            t.start()
            self.timers.append(t)
            return fault
        if kind == "host-gone":
            hosts = [h for h in self.live_hosts() if h.name not in self.busy]
            if len(self.live_hosts()) < 2 or not hosts:
                return None
            h = rng.choice(hosts)
            self.gone.add(h.name)
            subprocess.run(["ip", "-n", h.netns, "link", "set", "eth0", "down"], check=True, timeout=30)
            c.kill_host(h)
            # what a user does when the next command says the host does not answer: the hosts file without it
            self.hosts_file.write_text("".join(f"{x.address}:1\n" for x in self.live_hosts()))
            return Fault(kind, h.name, time.time())
        raise ValueError(kind)

    def _in_mounts(self, h) -> list[str] | None:
        """Where the host's checkpoint folder is seen: a worker host's mount namespace (its holder's); on the
        launcher, a network namespace only, the local command's own (`ip netns exec` gives each command a copy of
        this machine's mounts: a tmpfs over this machine's folder was copied into a command started meanwhile and
        stayed there after it was removed, every later trial of that command failing: found by the 100-fault
        run); None: no local command runs now."""
        if h.holder is not None:
            return ["nsenter", "-t", str(h.holder.pid), "-m"]
        local = self.commands[0].proc
        return None if local is None or local.poll() is not None else ["nsenter", "-t", str(local.pid), "-m"]

    def fill(self, h) -> list[str] | None:
        """The host's checkpoint folder full: a 64 KiB tmpfs over it, filled; how to enter where it is."""
        enter = self._in_mounts(h)
        if enter is None:
            return None
        script = (f"mkdir -p {self.ckpt} && mount -t tmpfs -o size=64k chaos-full {self.ckpt} && "
                  f"(dd if=/dev/zero of={self.ckpt}/.filler bs=4k count=100 2>/dev/null; true)")
        subprocess.run([*enter, "sh", "-c", script], check=True, timeout=30)
        return enter

    def unfill(self, enter: list[str]) -> None:
        # (the local command may have gone meanwhile, and its mounts with it)
        subprocess.run([*enter, "umount", "-l", self.ckpt], check=False, timeout=30)

    # --- the run ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.start_counter()
        plan = self.plan()
        thresholds = sorted(self.rng.uniform(0.03, 0.92) * self.trials for _ in plan)
        log(f"chaos: {self.trials} trials, {len(plan)} faults ({dict(Counter(plan))}), seed {self.seed}")
        started = time.monotonic()
        pending = list(zip(thresholds, plan))
        postponed: list[str] = []
        while True:
            if self.watch_commands():
                break
            n = self.complete()
            if pending and n is not None and n >= pending[0][0]:
                self.try_fault(pending.pop(0)[1], n, postponed)
            elif postponed and n is not None and self.rng.random() < 0.2:
                self.try_fault(postponed.pop(0), n, postponed, " (later)")
            if time.monotonic() - started > 3 * 3600:
                raise RuntimeError("the chaos run did not end in 3 hours")
            time.sleep(self.rng.uniform(0.2, 1.0))
        for t in self.timers:
            t.join(timeout=60)
        self.unapplied = [k for _, k in pending] + postponed
        log(f"study done: {self.complete()} complete; {len(self.faults)} faults applied, "
            f"{len(self.unapplied)} found no target")

    def try_fault(self, kind: str, n: int, postponed: list[str], when: str = "") -> None:
        """Apply a fault of `kind` now, or postpone it when it has no target at this moment."""
        fault = self.apply(kind)
        if fault is None:
            postponed.append(kind)
            return
        self.faults.append(fault)
        log(f"fault {len(self.faults)}: {kind} on {fault.target} {fault.detail} (complete: {n}){when}")

    def end_commands(self) -> None:
        for cmd in self.commands:
            if cmd.proc is not None and cmd.proc.poll() is None:
                os.killpg(cmd.proc.pid, signal.SIGKILL)
                cmd.proc.wait(timeout=30)


# --- the checker ---------------------------------------------------------------------------------------------------
def check_stores(storage: str, uri: str, budget: int, faults: list[dict]) -> dict:
    """What Optuna's storage and MLflow's store kept (run where they are reachable: h1's namespace): the report's
    figures and the violations found there."""
    import optuna
    from mlflow.tracking import MlflowClient

    v: list[str] = []
    study = optuna.load_study(study_name="chaos", storage=storage)
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    counted = [t for t in complete if t.number not in retried and "xp.void" not in t.user_attrs]
    if len(counted) < budget:
        v.append(f"the study has {len(counted)} complete trials of its budget {budget}")
    running = [t.number for t in trials if t.state.name == "RUNNING"]
    if running:
        v.append(f"trials left RUNNING: {running}")

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("chaos")
    runs = client.search_runs([exp.experiment_id], max_results=50000) if exp else []
    left = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    if left:
        v.append(f"MLflow runs left RUNNING: {left}")
    by_trial: dict[int, list] = defaultdict(list)
    history: dict[str, list] = {}
    for r in runs:
        if "optuna.trial_number" in r.data.tags:
            by_trial[int(r.data.tags["optuna.trial_number"])].append(r)
            history[r.info.run_id] = client.get_metric_history(r.info.run_id, "val_accuracy")
    for t in complete:
        finished = [r for r in by_trial[t.number] if r.info.status == "FINISHED"]
        if len(finished) != 1:
            v.append(f"trial {t.number} (COMPLETE) has {len(finished)} FINISHED runs")
            continue
        r = finished[0]
        if t.user_attrs.get("mlflow_run_id") != r.info.run_id:
            v.append(f"trial {t.number}: its run {t.user_attrs.get('mlflow_run_id')} is not its FINISHED run "
                     f"{r.info.run_id}")
        steps = sorted(m.step for m in history[r.info.run_id])
        if steps not in (list(range(1, EPOCHS + 1)), list(range(EPOCHS))):
            v.append(f"trial {t.number}: val_accuracy at steps {steps}, not each of its {EPOCHS} epochs once")
        for k, want in t.params.items():
            got = r.data.params.get(k)
            if got is None or float(got) != float(want):
                v.append(f"trial {t.number}: param {k} is {got} in its run, {want} in Optuna")
        model = r.data.tags.get("xp.logged_model", "")
        if not model.startswith("models:/"):
            v.append(f"trial {t.number}: its run logged no model")
        elif not str(client.get_logged_model(model.split("/")[-1]).status).endswith("READY"):
            v.append(f"trial {t.number}: its model {model} is not READY")
        last = max(history[r.info.run_id], key=lambda m: m.step).value if history[r.info.run_id] else None
        if last is None or abs(last - t.value) > 1e-9:  # (the objective: its last epoch's)
            v.append(f"trial {t.number}: Optuna's value {t.value} is not its run's last val_accuracy {last}")

    # no parameter set in two trials unless the later one says why (a lost trial retried, a stopped one queued again)
    seen: dict[tuple, int] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if not t.params or "xp.void" in t.user_attrs:
            continue
        key = tuple(sorted(t.params.items()))
        why = ("failed_trial" in t.system_attrs or "fixed_params" in t.system_attrs or "interrupted_from" in t.user_attrs
               or "duplicate_of" in t.user_attrs)
        if key in seen and not why:
            v.append(f"trial {t.number} ran trial {seen[key]}'s parameters again with no reason recorded")
        seen.setdefault(key, t.number)

    # the answer, recomputed from Optuna's values: the best value, a tie to the lowest number
    if counted:
        best = max(counted, key=lambda t: (t.value, -t.number))
        parents = sorted([r for r in runs if r.data.tags.get("xp.sweep") == "true"],
                         key=lambda r: r.info.end_time or 0)
        if not parents:
            v.append("no parent run")
        else:
            last = parents[-1]
            note = last.data.tags.get("mlflow.note.content", "")
            named = [k for k, val in last.data.tags.items() if k.startswith("xp.best") and "trial" in k]
            if not re.search(rf"best trial: \W*trial {best.number}\b", note):
                v.append(f"the last parent run's description does not name trial {best.number} best: {note[:300]!r}")
            for k in named:
                if last.data.tags[k] != str(best.number):
                    v.append(f"the last parent run's tag {k}={last.data.tags[k]}, the values say {best.number}")
        try:
            version = client.get_model_version_by_alias("chaos", "best")
            if version.run_id != best.user_attrs.get("mlflow_run_id"):
                v.append(f"@best is run {version.run_id} (trial {version.tags.get('trial')}), the best trial "
                         f"{best.number}'s run is {best.user_attrs.get('mlflow_run_id')}")
        except Exception as e:
            v.append(f"no @best model: {str(e).splitlines()[0][:200]}")

    # work lost: each trial's run that is not a COMPLETE trial's ended while a fault that could end it was under way
    kept = {t.user_attrs.get("mlflow_run_id") for t in complete}
    by_number = {t.number: t for t in trials}
    lost = []
    for r in runs:
        if "optuna.trial_number" not in r.data.tags or r.info.run_id in kept:
            continue
        start, end = r.info.start_time / 1000, (r.info.end_time or r.info.start_time) / 1000
        trial = by_number.get(int(r.data.tags["optuna.trial_number"]))
        if trial is not None and trial.datetime_complete is not None:  # (a run that ended, its trial lost later:
            end = max(end, trial.datetime_complete.timestamp())  # its records not yet kept when its worker went)
        near = [i for i, f in enumerate(faults) if start - 60 <= (f["until"] or f["at"]) and f["at"] <= end + 5]
        epochs = len(history.get(r.info.run_id, []))
        if not near:
            v.append(f"trial {r.data.tags['optuna.trial_number']}'s run {r.info.run_id} ended {r.info.status} after "
                     f"{epochs} epochs with no fault under way")
            continue
        # the cause, of the faults under way: one that can lose work (if any), on the run's host or its command
        costly = [i for i in near if PROMISE[faults[i]["kind"]][1] > 0]
        host = r.data.tags.get("xp.host", "")  # (this machine's runs: its own name; an ssh host's: h2, h3, ...)
        on_it = [i for i in costly if faults[i]["target"] in ((host, "ssh") if host in SSH_HOSTS else ("h1", "local"))]
        lost.append((max(on_it or costly or near, key=lambda i: faults[i]["at"]), epochs))
    return {"violations": v, "lost": lost, "complete": len(counted), "trials": len(trials),
            "best": best.number if counted else None}


def check(chaos: Chaos) -> dict:
    """Read what was kept and report faults per kind, work lost per fault, and every violation."""
    v = chaos.violations
    faults = [f.__dict__ for f in chaos.faults]
    request = chaos.work / "check.json"
    request.write_text(json.dumps({"storage": chaos.storage, "uri": chaos.uri, "budget": chaos.trials,
                                   "faults": faults}))
    r = subprocess.run(chaos.c.on_launcher([sys.executable, __file__, "--check-stores", str(request)]),
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"the store checker failed: {r.stderr[-3000:]}")
    stores = json.loads(r.stdout.strip().splitlines()[-1])
    v.extend(stores["violations"])

    # processes: nothing of the study left on any host (the servers this script started aside)
    for h in [chaos.c.launcher, *chaos.live_hosts()]:
        left = [p for p in chaos.c.processes(h) if "postgres" not in p and "--count" not in p]
        if left:
            v.append(f"processes left on {h.name}: {left}")
    # checkpoints: no half-written commit anywhere
    for h in [chaos.c.launcher, *chaos.live_hosts()]:
        r = subprocess.run([*(chaos._in_mounts(h) or []), "find", chaos.ckpt, "(", "-name", "*.tmp*", "-o", "-name",
                            "*.part*", ")"], capture_output=True, text=True, timeout=30)
        if r.stdout.strip():
            v.append(f"half-written commits on {h.name}: {r.stdout.split()[:5]}")

    lost_by_fault: dict[int, int] = defaultdict(int)
    runs_by_fault: dict[int, list[int]] = defaultdict(list)
    for i, epochs in stores["lost"]:
        lost_by_fault[i] += epochs
        runs_by_fault[i].append(epochs)
    report: dict = {"complete": stores["complete"], "budget": chaos.trials, "trials": stores["trials"],
                    "faults": len(chaos.faults), "best": stores["best"], "by_kind": {}}
    for kind in KINDS:
        idx = [i for i, f in enumerate(chaos.faults) if f.kind == kind]
        if not idx:
            continue
        costs = sorted(lost_by_fault.get(i, 0) for i in idx)
        finished = 0
        for i in idx:
            # faults on the same target close together share what they may cost (which one ended a run is not
            # known: the checker gives it to the latest)
            f = chaos.faults[i]
            allowed = sum(may_lose(g) for g in chaos.faults if g.target == f.target and abs(g.at - f.at) < 60)
            # a trial in flight (it trained part of its epochs), or one that had trained them all: it ended there,
            # its records not yet in the store (a trial counts complete once they are: Kept), lost with its worker
            in_flight = [e for e in runs_by_fault.get(i, []) if 0 < e < EPOCHS]
            ended = [e for e in runs_by_fault.get(i, []) if e >= EPOCHS]
            finished += len(ended)
            if len(in_flight) > allowed or (PROMISE[kind][1] == 0 and ended):
                v.append(f"the {kind} fault on {f.target} at {f.at:.0f} cost {lost_by_fault[i]} epochs ({len(in_flight)} "
                         f"trials in flight, {len(ended)} ended), more than promised ({PROMISE[kind][0]})")
        report["by_kind"][kind] = {"applied": len(idx), "lost_epochs_median": costs[len(costs) // 2],
                                   "lost_epochs_max": costs[-1], "lost_ended": finished, "promise": PROMISE[kind][0]}
    report["violations"] = v
    report["commands"] = {cmd.name: {"runs": cmd.runs, "exits": cmd.exits} for cmd in chaos.commands}
    return report


def count_loop(storage: str, out: Path) -> None:
    """--count: the study's trials done as xp counts them towards its budget (xp.studies.trial._counts) into `out`
    every second (what paces the faults)."""
    import optuna

    from xp.studies.trial import _counts

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    while True:
        try:
            n = _counts(optuna.load_study(study_name="chaos", storage=storage))[0]
            part = out.with_suffix(".part")
            part.write_text(str(n))
            part.replace(out)
        except Exception:
            out.unlink(missing_ok=True)
        time.sleep(1.0)


def table(report: dict) -> str:
    lines = ["| fault | applied | work lost per fault, epochs (median; max) | trials lost that had ended, records not "
             "yet kept | promised at most |", "|---|---|---|---|---|"]
    for kind, r in report["by_kind"].items():
        lines.append(f"| {kind} | {r['applied']} | {r['lost_epochs_median']}; {r['lost_epochs_max']} | "
                     f"{r['lost_ended']} | {r['promise']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import hosts

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--count"]:
        count_loop(argv[1], Path(argv[2]))
        return 0
    if argv[:1] == ["--check-stores"]:
        q = json.loads(Path(argv[1]).read_text())
        print(json.dumps(check_stores(q["storage"], q["uri"], q["budget"], q["faults"])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--faults", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds")
    ap.add_argument("--work", type=Path, default=None, help="folder for the stores and logs (default: a new one)")
    ap.add_argument("--report", type=Path, default=None, help="write the report (JSON) here")
    args = ap.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    unknown = set(kinds) - set(KINDS)
    if unknown:
        print(f"chaos: unknown fault kinds {sorted(unknown)}; valid: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    why = hosts.requirements()
    if why:
        print(f"chaos: {why}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="xp-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(work, args.trials, args.faults, args.seed, kinds)
    log(f"chaos: work folder {work}")
    with hosts.Cluster(3) as c:
        try:
            chaos.start_world(c)
            try:
                chaos.run()
                report = check(chaos)
            finally:
                chaos.end_commands()
                chaos.stop_world()
        finally:
            ns = [h.netns for h in c.hosts]
    left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if n in ns or n == c.bridge_ns]
    if left:
        report["violations"].append(f"namespaces left: {left}")
    report["seed"], report["work"] = args.seed, str(work)
    print(table(report))
    print(f"violations: {len(report['violations'])}")
    for line in report["violations"]:
        print(" -", line)
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
