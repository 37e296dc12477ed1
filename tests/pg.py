"""A real, throwaway PostgreSQL server for the tests: Debian's binaries, a data folder in /tmp,
TCP on 127.0.0.1 only (no Unix socket), password authentication, stopped and removed at the end."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
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
    def __init__(self, password: str):
        self.password, self.bin = password, binaries()
        self.folder = Path(tempfile.mkdtemp(prefix="xp-pg-"))
        self.data = self.folder / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        # postgres refuses to run as root: as root, run it as Debian's postgres user
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, text=True, timeout=timeout)

    def start(self) -> "Server":
        pwfile = self.folder / "pw"
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(self.folder, "postgres")
            shutil.chown(pwfile, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='' -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "start", "-D", str(self.data), "-w", "-t", "60", "-o", options,
                  "-l", str(self.folder / "log"))
        import psycopg

        conn = psycopg.connect(self.url("postgres"), connect_timeout=10)
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            for db in ("mlflow", "optuna"):  # apart: both keep their schema version in alembic_version
                conn.execute(f"CREATE DATABASE {db}")
        finally:
            conn.close()
        return self

    def url(self, database: str, password: str | None = None) -> str:
        return f"postgresql://{USER}:{password or self.password}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
