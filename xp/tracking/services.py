"""The tracking services of a state folder, as `python -m xp.tracking status | stop` sees them: which run, whose each
is (xp.tracking.service.Identity: a checkout's code and Python), what each serves, and ending this checkout's. A
service asks `superseded` whether a newer one of its checkout took its place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xp.tracking.messages import Serving, Status
from xp.tracking.service import DAEMON, Identity, Link, Unavailable, _connected, identity
from xp.tracking.spool import state_dir


def running(folder: Path | None = None) -> list[tuple[Any, Identity | None]]:
    """The services that serve xp's state folder `folder` (or this process's): each a psutil process and what it
    said it is (None: a service of an xp from before services said it)."""
    import psutil

    found = []
    for pid_file in ((folder or state_dir()) / "service").glob("*.pid"):
        try:
            process = psutil.Process(int(pid_file.read_text()))
            if not {DAEMON, "xp.tracking.daemon"} & set(process.cmdline()):
                continue
        except (OSError, ValueError, psutil.Error):
            continue
        try:
            said = Identity(**json.loads(pid_file.with_suffix(".json").read_text()))
        except (OSError, ValueError, TypeError):
            said = None
        found.append((process, said if said is not None and said.pid == process.pid else None))
    return found


def _checkout(said: Identity) -> tuple[str, str]:
    return said.checkout, said.python


def mine(said: Identity | None) -> bool:
    """Whether a service is this checkout's (this xp's code, this Python)."""
    return said is not None and _checkout(said) == _checkout(identity())


def superseded(said: Identity, folder: Path) -> int | None:
    """A newer service of the same checkout and Python in the same state folder (its xp's code changed since, or
    its MLflow), by its process id: the service `said` is no longer the one its runs start. (One on MLflow's public
    API only, XP_MLFLOW_PUBLIC=1, stands beside the other: both serve.)"""
    newer = [other.pid for process, other in running(folder) if other is not None and other.pid != said.pid and
             _checkout(other) == _checkout(said) and other.started > said.started and
             other.public == said.public]
    return newer[0] if newer else None


def ask_status(said: Identity) -> Serving | None:
    """What a live service serves, asked on its socket; None where it does not answer."""
    try:
        link = Link(_connected(Path(said.socket)))
    except OSError:
        return None
    try:
        answer = link.ask(Status(), 5.0)
        return answer if isinstance(answer, Serving) else None
    except Unavailable:
        return None
    finally:
        link.close()


def stop(folder: Path | None = None, every: bool = False) -> list[tuple[int, Identity | None]]:
    """End this checkout's services (`every`: every service) that serve xp's state folder `folder` (or this
    process's), by their process ids; returns them, with what each said it is. Their runs go on, each delivering
    its own records (Served)."""
    import signal

    import psutil

    ended = []
    for process, said in running(folder):
        if not (every or mine(said)):
            continue
        try:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except psutil.TimeoutExpired:
                if process.status() != psutil.STATUS_ZOMBIE:  # (ended, not yet reaped by its parent: a run of ours)
                    continue
            ended.append((process.pid, said))
        except psutil.Error:
            pass
    for pid, _ in ended:
        for pid_file in ((folder or state_dir()) / "service").glob("*.pid"):
            try:
                if int(pid_file.read_text()) == pid:
                    pid_file.unlink(missing_ok=True)
                    pid_file.with_suffix(".json").unlink(missing_ok=True)
            except (OSError, ValueError):
                pass
    return ended
