"""A Slurm cluster on the emulated hosts of tests/hosts.py: Debian's slurm-wlm and munge, made per test run.

    with SlurmCluster(3) as c:     # h1: the login node and slurmctld; h2, h3: one slurmd each
        c.slurm(["sinfo"])         # a Slurm command on the login node
        c.stop_slurmd("h3")        # a node taken away

- munge: one munged per host with a key made here, its socket at the same path on every host (inside the
  worker hosts' private /tmp; under this run's folder on the login node, which sees this machine's /tmp);
- slurm.conf generated in the run's folder (seen at the same path on every host): no cgroups
  (proctrack/linuxproc, task/none), select/linear, one partition `debug` of the worker hosts, ports on the
  hosts' own addresses only; slurmctld on the login node, slurmd -N NAME on each worker host, as root;
- every daemon runs inside its host's namespaces and ends with the cluster (tests/hosts.py kills every
  process of every namespace, then removes them). Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from hosts import Cluster, Unavailable, _sh

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")
CTLD_PORT, SLURMD_PORT = 6817, 6818


def requirements() -> str | None:
    for path in DAEMONS:
        if not os.access(path, os.X_OK):
            return f"the Slurm tests need {path} (./dev.sh test installs Debian's slurmctld, slurmd, slurm-client, munge)"
    return None


class SlurmCluster(Cluster):
    def __init__(self, hosts: int = 3, cpus: int = 2):
        why = requirements()
        if why:
            raise Unavailable(why)
        super().__init__(hosts)
        self.cpus = cpus
        self.conf = self.etc / "slurm.conf"
        self.munge_dir = self.dir / "munge"  # the login node's; worker hosts use the same path in their /tmp

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm command needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _start(self) -> None:
        super()._start()
        (self.etc / "slurm").mkdir()
        _sh("dd", "if=/dev/urandom", f"of={self.etc / 'munge.key'}", "bs=1024", "count=1")
        os.chmod(self.etc / "munge.key", 0o400)
        self.conf.write_text(self._slurm_conf())
        # slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and task/none; nothing constrains
        (self.etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\n"
                                              "ConstrainRAMSpace=no\nConstrainDevices=no\n")
        for h in self.hosts:
            self._start_munge(h)
        self._daemon(self.launcher, ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for h in self.workers:
            self._daemon(h, ["/usr/sbin/slurmd", "-D", "-N", h.name, "-f", str(self.conf)], "slurmd")
        self.wait_idle(len(self.workers))

    def _slurm_conf(self) -> str:
        run = self.etc / "slurm"  # seen at the same path on every host; per-node files carry the node's name
        lines = [
            f"ClusterName={self.id}", f"SlurmctldHost={socket.gethostname()}({self.launcher.address})",  # the login node is this machine's UTS
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_dir / 'socket'}",
            "SlurmUser=root", "SlurmdUser=root", f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
            f"StateSaveLocation={run / 'ctld-state'}", f"SlurmdSpoolDir={run}/spool-%n",
            f"SlurmctldPidFile={run / 'slurmctld.pid'}", f"SlurmdPidFile={run}/slurmd-%n.pid",
            f"SlurmctldLogFile={run / 'slurmctld.log'}", f"SlurmdLogFile={run}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/linear",
            "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2", "MailProg=/bin/true", "SlurmctldTimeout=30", "SlurmdTimeout=10", "InactiveLimit=0", "KillWait=5",
            "MinJobAge=300", "SchedulerType=sched/backfill", "PropagateResourceLimitsExcept=ALL",
        ]
        for h in self.workers:
            lines.append(f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(h.name for h in self.workers)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _start_munge(self, h) -> None:
        # the same path everywhere: the login node's is under this run's folder, the worker hosts' the same
        # path inside their private /tmp (made below from inside the host)
        _sh(*h.enter(), "mkdir", "-p", str(self.munge_dir))
        self._daemon(h, ["/usr/sbin/munged", "-F", "--force", f"--socket={self.munge_dir / 'socket'}",
                         f"--key-file={self.etc / 'munge.key'}", f"--pid-file={self.munge_dir / 'pid'}",
                         f"--log-file={self.munge_dir / 'log'}", f"--seed-file={self.munge_dir / 'seed'}"], "munged")
        deadline = time.monotonic() + 15
        while _sh(*h.enter(), "test", "-S", str(self.munge_dir / "socket"), check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged on {h.name} did not start: {self._log(h, 'munged')}")
            time.sleep(0.1)

    def _daemon(self, h, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}-{h.name}.out", "w")
        p = subprocess.Popen([*h.enter(), *argv], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, **self.env})
        h.daemons.append(p)
        return p

    def _log(self, h, name: str) -> str:
        text = ""
        for f in (self.dir / f"{name}-{h.name}.out", self.etc / "slurm" / f"{name}.log",
                  self.etc / "slurm" / f"{name}-{h.name}.log"):
            try:
                text += f.read_text()[-600:]
            except OSError:
                pass
        return text

    # --- use -------------------------------------------------------------------------------------
    def slurm(self, argv: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm command on the login node."""
        r = subprocess.run(self.on_launcher(argv), capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **self.env})
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
        return r

    def node_states(self) -> dict[str, str]:
        out = self.slurm(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if sum(s.rstrip("*") == "idle" for s in states.values()) >= n:
                return
            if time.monotonic() > deadline:
                logs = " | ".join(self._log(h, d)[-300:] for h in self.hosts for d in ("slurmctld", "slurmd"))
                raise RuntimeError(f"Slurm nodes not idle within {timeout} s: {states}; {logs}")
            time.sleep(0.5)

    def stop_slurmd(self, name: str) -> None:
        """A node taken away: its slurmd ends (SIGKILL: it says nothing to slurmctld, as a crashed node)."""
        h = self.host(name)
        for p in [p for p in h.daemons if "/usr/sbin/slurmd" in p.args]:
            p.kill()
            p.wait(timeout=10)
            h.daemons.remove(p)

    def start_slurmd(self, name: str) -> None:
        h = self.host(name)
        self._daemon(h, ["/usr/sbin/slurmd", "-D", "-N", h.name, "-f", str(self.conf)], "slurmd")
        self.slurm(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
        self.wait_idle(len(self.workers), timeout=90)


__all__ = ["SlurmCluster", "Unavailable", "requirements", "shutil"]
