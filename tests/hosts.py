"""Emulated hosts for the multi-host tests: Linux network namespaces on a private bridge, each with its own sshd.

    with Cluster(3) as c:          # h1 launches (the login node); h2, h3 are worker hosts
        c.run_on_launcher([...])   # a command in h1's network namespace (it sees this machine's files)
        c.host("h2").address       # 10.X.Y.2

Layout (all of it made here, all of it removed at the end, on failure too):
- a namespace `xp<id>-br` holding the bridge `br0`; one namespace per host joined to it by a veth pair
  (`eth0` inside the host); addresses from a /24 that exists only inside these namespaces; no routes
  anywhere else, so nothing a test sends can leave them. The machine's own interfaces are not touched.
- the launcher h1 is a network namespace only: it sees this machine's files (the test's tmp_path).
- a worker host is a long-lived holder process in its network namespace with its own mount and UTS
  namespaces: its own hostname and a private /tmp (with `shared`, one folder seen at the same path by every
  host, bind-mounted in). Daemons are entered into the holder with nsenter, so they share both.
- Debian's sshd per worker host (own config, host key and client key made per run, `UsePAM no`), listening
  on the host's address only. The checkout and its .venv are at the same path (the hosts share this
  machine's root file system); `hide_checkout` mounts an empty folder over it on one host.
Every wait is bounded. Namespaces need root: without it `Cluster` raises with one line saying so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"


def _descendants(pids: set[int]) -> set[int]:
    """pids and all their descendants (from /proc's parent links)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, grew = set(pids), True
    while grew:
        more = {p for p, pp in parent.items() if pp in found and p not in found}
        found |= more
        grew = bool(more)
    return found


class Unavailable(RuntimeError):
    pass


def _sh(*args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def requirements() -> str | None:
    """Why namespace hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the multi-host tests make network namespaces, which needs root (CI runs as root)"
    for tool in ("ip", "nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the multi-host tests need {tool} (./dev.sh test installs openssh-server and iproute2)"
    if not os.access(SSHD, os.X_OK):
        return f"the multi-host tests need {SSHD} (./dev.sh test installs Debian's openssh-server)"
    return None


@dataclass
class Host:
    name: str
    address: str
    netns: str
    holder: subprocess.Popen | None = None  # worker hosts: the process whose namespaces the host is
    sshd: subprocess.Popen | None = None
    daemons: list[subprocess.Popen] = field(default_factory=list)

    def enter(self) -> list[str]:
        """The prefix that runs a command on this host (its network, mount and UTS namespaces)."""
        if self.holder is None:
            return ["ip", "netns", "exec", self.netns]
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-m", "-u"]

    def pids(self) -> set[int]:
        """Every process in this host's network namespace."""
        out = _sh("ip", "netns", "pids", self.netns, check=False).stdout.split()
        return {int(p) for p in out if p.isdigit()}


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt()


class Cluster:
    def __init__(self, hosts: int = 3):
        why = requirements()
        if why:
            raise Unavailable(why)
        self.id = f"xp{os.getpid() % 100000}"
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)  # two test processes: never one subnet
        self.subnet = f"10.{200 + 25 * (worker % 2) + os.getpid() % 25}.{os.getpid() % 250 + 1}"
        self.dir = Path(tempfile.mkdtemp(prefix="xp-hosts-"))
        self.shared = self.dir / "shared"  # the same folder at the same path on every host
        self.etc = self.dir / "etc"  # keys and daemons' configs, at the same path on every host
        self.bridge_ns = f"{self.id}-br"
        self.hosts = [Host(f"h{i}", f"{self.subnet}.{i}", f"{self.id}-h{i}") for i in range(1, hosts + 1)]
        self.key = self.etc / "id_ed25519"
        self.ssh_config = self.etc / "ssh_config"

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "Cluster":
        import threading

        if threading.current_thread() is threading.main_thread():
            # a SIGTERM (CI cancelling, a killed pytest) unwinds through __exit__: the namespaces go too. As Ctrl-C:
            # pytest (and a pytest-xdist worker) then ends the session and runs every fixture's teardown; SystemExit
            # only failed the test at hand, and an xdist worker then went without its module's teardown
            self._sigterm = signal.signal(signal.SIGTERM, _interrupted)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            if getattr(self, "_sigterm", None) is not None:
                signal.signal(signal.SIGTERM, self._sigterm)

    def _start(self) -> None:
        self.shared.mkdir()
        self.shared.chmod(0o777)
        self.etc.mkdir()
        _sh("ip", "netns", "add", self.bridge_ns)
        _sh("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts, start=1):
            _sh("ip", "netns", "add", h.netns)
            # the veth pair is made inside the bridge's namespace: nothing appears in this machine's namespace
            _sh("ip", "-n", self.bridge_ns, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                "netns", h.netns)
            _sh("ip", "-n", self.bridge_ns, "link", "set", f"v{i}", "master", "br0", "up")
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _sh("ip", "-n", h.netns, "link", "set", "eth0", "up")
            _sh("ip", "-n", h.netns, "link", "set", "lo", "up")
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.etc / "host_key"))
        shutil.copy(self.etc / "id_ed25519.pub", self.etc / "authorized_keys")
        self.ssh_config.write_text(
            "Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            "  ConnectTimeout 5\n".format(key=self.key))
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
        (self.etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts))
        for h in self.hosts[1:]:
            self._start_host(h)
        self._wait_for_sshd()

    def _start_host(self, h: Host) -> None:
        tmp = self.dir / h.name / "tmp"
        mounts = []
        # seen at the same path inside the host's private /tmp (the checkout too, when it is a clone in /tmp)
        for folder in (self.shared, self.etc, ROOT):
            if folder.is_relative_to("/tmp"):
                inner = tmp / folder.relative_to("/tmp")
                inner.mkdir(parents=True)
                mounts.append(f"mount --bind {folder} {inner}")
        tmp.chmod(0o1777)
        mounts.append(f"mount --rbind {tmp} /tmp")
        mounts.append(f"mount --bind {self.etc / 'hosts'} /etc/hosts")  # every host resolves the others' names
        script = " && ".join([*mounts, f"hostname {h.name}", "echo ready", "exec sleep 86400"])
        h.holder = subprocess.Popen(["ip", "netns", "exec", h.netns, "unshare", "--mount", "--uts",
                                     "--propagation", "private", "sh", "-c", script],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = h.holder.stdout.readline()  # bounded: the script either prints or exits
        if line.strip() != "ready":
            raise RuntimeError(f"host {h.name} did not start: {h.holder.stderr.read()[-500:]}")
        cfg = self.etc / f"sshd_config.{h.name}"
        cfg.write_text("\n".join([
            f"ListenAddress {h.address}", "Port 22", f"HostKey {self.etc / 'host_key'}",
            f"AuthorizedKeysFile {self.etc / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PidFile none", "PrintMotd no", "MaxStartups 200", "MaxSessions 200", "LogLevel ERROR", ""]))
        h.sshd = subprocess.Popen([*h.enter(), SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                  stderr=open(self.dir / h.name / "sshd.log", "w"))

    def _wait_for_sshd(self, timeout: float = 30) -> None:
        for h in self.hosts[1:]:
            deadline = time.monotonic() + timeout
            while True:
                r = self.ssh(h, "hostname", check=False, timeout=10)
                if r.returncode == 0 and r.stdout.strip() == h.name:
                    break
                if time.monotonic() > deadline:
                    log = (self.dir / h.name / "sshd.log").read_text()[-500:]
                    raise RuntimeError(f"sshd on {h.name} did not answer within {timeout} s: {r.stderr} {log}")
                time.sleep(0.2)

    def stop(self) -> None:
        """End every process of every host (by namespace), then remove the namespaces and files."""
        for h in self.hosts:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in h.pids():
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + 5
                while h.pids() and time.monotonic() < deadline:
                    time.sleep(0.05)
            for p in (h.holder, h.sshd, *h.daemons):
                if p is not None:
                    try:
                        p.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
        for ns in [h.netns for h in self.hosts] + [self.bridge_ns]:
            _sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- use -------------------------------------------------------------------------------------
    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    @property
    def launcher(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    def ssh(self, h: Host, command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run `command` on host h over ssh, from the launcher."""
        return _sh(*self.launcher.enter(), "ssh", "-F", str(self.ssh_config), h.address, command, check=check,
                   timeout=timeout)

    def on_launcher(self, argv: list[str]) -> list[str]:
        return [*self.launcher.enter(), *argv]

    def processes(self, h: Host) -> list[str]:
        """Command lines of the processes on host h, less the host's own (holder, sshd listener)."""
        own = {p.pid for p in (h.holder, h.sshd) if p is not None}
        own |= _descendants({p.pid for p in h.daemons})  # servers the tests started there (MLflow's workers too)
        found = []
        for pid in sorted(h.pids() - own):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            # (the user's tracking service, xp.trackingd, outlives the command that started it by design;
            # stop() ends it with the host)
            if cmd and not cmd.startswith("nsenter ") and "xp.trackingd" not in cmd:
                found.append(f"{pid} {cmd}")
        return found

    def kill_host(self, h: Host) -> None:
        """The host crashes: every process in its namespace is killed at once (sshd and holder too)."""
        for pid in h.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def hide_checkout(self, h: Host) -> None:
        """The host loses the checkout (an empty folder mounted over it, in its mount namespace only)."""
        _sh("nsenter", "-t", str(h.holder.pid), "-m", "mount", "-t", "tmpfs", "none", str(ROOT))

    def show_checkout(self, h: Host) -> None:
        _sh("nsenter", "-t", str(h.holder.pid), "-m", "umount", str(ROOT), check=False)

    def hosts_file(self, path: Path, names: list[str], slots: int = 1) -> Path:
        part = path.with_name(path.name + ".part")  # whole or not at all: a job polling the list never reads half
        part.write_text("".join(f"{self.host(n).address}:{slots}\n" for n in names))
        part.replace(path)
        return path

    def shape(self, rate: str, delay: str | None = None) -> str:
        """Shape every host's link, both ways (the bridge's veths and the hosts' eth0): netem with rate and delay
        where the kernel has netem, else a token bucket (tbf) at the rate and no delay. Returns what was applied."""
        bits = float(rate[:-4]) * {"g": 1e9, "m": 1e6, "k": 1e3}[rate[-4]]
        burst = max(256 * 1024, int(bits / 8 / 100))  # 10 ms of traffic: tbf needs at least rate / HZ
        applied = None
        for i, h in enumerate(self.hosts, start=1):
            for ns, dev in ((self.bridge_ns, f"v{i}"), (h.netns, "eth0")):
                tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root"]
                if applied != "tbf" and delay:
                    r = _sh(*tc, "netem", "delay", delay, "rate", rate, check=False)
                    if r.returncode == 0:
                        applied = f"netem {rate} {delay}"
                        continue
                    if "unknown" not in r.stderr:
                        raise RuntimeError(f"tc netem: {r.stderr.strip()}")
                _sh(*tc, "tbf", "rate", rate, "burst", str(burst), "latency", "50ms")
                applied = "tbf"
        return f"tbf {rate} (no netem in this kernel: no added delay)" if applied == "tbf" else applied

    def mlflow_server(self, db: Path, timeout: float = 90) -> str:
        """An MLflow tracking server on the launcher's address (what every host reaches), its runs in the SQLite
        file `db`; returns its URI. Ended with the cluster."""
        port = 5000
        artifacts = db.parent / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "mlflow-server.log", "w")
        p = subprocess.Popen(self.on_launcher([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                               f"sqlite:///{db}", "--artifacts-destination", str(artifacts),
                                               "--host", self.launcher.address, "--port", str(port),
                                               "--workers", "1"]),
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job runners
        self.launcher.daemons.append(p)
        uri = f"http://{self.launcher.address}:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.dir / 'mlflow-server.log').read_text()[-800:]}")
            r = _sh(*self.launcher.enter(), sys.executable, "-c",
                    f"import urllib.request; urllib.request.urlopen('{uri}/health', timeout=2)", check=False)
            if r.returncode == 0:
                return uri
            time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer within {timeout} s")
