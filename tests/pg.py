"""A real, throwaway PostgreSQL server for the tests: Debian's binaries, a data folder in /tmp,
TCP on 127.0.0.1 only (no Unix socket), password authentication, stopped and removed at the end."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

USER = "xp"


def binaries() -> Path:
    """The folder of initdb and pg_ctl (Debian keeps them out of PATH, in /usr/lib/postgresql/N/bin)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not versions:
        raise RuntimeError("PostgreSQL's server is not installed (./dev.sh test installs Debian's postgresql; "
                           "or apt-get install postgresql)")
    return Path(versions[-1]).parent


class Server:
    """host, enter: where it listens, and the prefix that runs a command there (the emulated hosts' login node
    for the Slurm tests: `ip netns exec NS`); by default 127.0.0.1 on this machine."""

    def __init__(self, password: str, host: str = "127.0.0.1", enter: tuple[str, ...] = ()):
        self.password, self.bin, self.host, self.enter = password, binaries(), host, list(enter)
        self.folder = Path(tempfile.mkdtemp(prefix="xp-pg-"))
        self.data = self.folder / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        # postgres refuses to run as root: as root, run it as Debian's postgres user
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run([*self.enter, *self.as_user, *args], check=True, capture_output=True, text=True,
                       timeout=timeout)

    def start(self) -> "Server":
        pwfile = self.folder / "pw"
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(self.folder, "postgres")
            shutil.chown(pwfile, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        if self.host != "127.0.0.1":  # initdb allows loopback only: the hosts of the emulated /24 too
            with open(self.data / "pg_hba.conf", "a") as f:
                f.write(f"host all all {self.host.rsplit('.', 1)[0]}.0/24 scram-sha-256\n")
        self.resume()
        # apart: MLflow and Optuna both keep their schema version in alembic_version; CREATE DATABASE cannot run
        # in a transaction (autocommit)
        create = ("import psycopg, sys\nconn = psycopg.connect(sys.argv[1], connect_timeout=10, autocommit=True)\n"
                  "for db in ('mlflow', 'optuna'):\n    conn.execute(f'CREATE DATABASE {db}')\nconn.close()\n")
        subprocess.run([*self.enter, sys.executable, "-c", create, self.url("postgres")], check=True,
                       capture_output=True, text=True, timeout=60)
        return self

    def halt(self) -> None:
        """The server goes away at once (pg_ctl's immediate mode: no shutdown checkpoint, as a crash)."""
        self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60")

    def resume(self) -> None:
        """(Re)start the server on its data folder, address and port."""
        options = f"-c listen_addresses={self.host} -p {self.port} -c unix_socket_directories='' -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "start", "-D", str(self.data), "-w", "-t", "60", "-o", options,
                  "-l", str(self.folder / "log"))

    def url(self, database: str, password: str | None = None) -> str:
        return f"postgresql://{USER}:{password or self.password}@{self.host}:{self.port}/{database}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
