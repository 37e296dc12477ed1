"""The tracking service, seen from a run's process: its MLflow work done by a long-lived process of this user and
machine (xp.tracking.serve), so that a run does not import MLflow or open its store (3.4 s of a 5-s command).

A run on a SQLite store asks the service to create its MLflow run, then appends its records to its spool's file
as before (xp.tracking.spool: durable first) and hands each to the service, which delivers them in order,
exactly once, and logs the run's model. The service's lines about the store (away, back, refused) come back to
the run's console. If the service cannot start or goes away, the run's process does its MLflow work itself from
its spool, where the service left off: nothing is lost or sent twice. A killed run's records wait in its spool
as they always did. XP_TRACKING_SERVICE=0 turns the service off.

One service per xp install (its code, the MLflow and SQLAlchemy it writes with, the protocol), user, machine and
state folder ($XP_STATE_DIR), started by the first run that needs it (under a lock: two runs starting at once share
one; the command that starts it says so) and gone after XP_SERVICE_IDLE_S (1800) without runs, or at
`python -m xp.tracking stop`.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from xp.tracking.spool import (FLUSH_S, RECORDS, _read_int, _read_records, _unsettled, bounded, claim, said_left,
                               state_dir, DELIVERED)

log = logging.getLogger("xp")

ENV = "XP_TRACKING_SERVICE"  # 0: every run's process does its MLflow work itself
# whether this process may start the service: a command's (xp.cli). The processes launchers place (a study's
# workers, a job's ranks, Ray's actors) use one that is there: none outlives a command on a host it was sent to.
starts = False
START_S = 30.0  # how long a run waits for a new service to answer before doing its MLflow work itself
ASK_S = 60.0  # how long a request other than a run's creation or end may go unanswered (the service is stuck)
CALL_S = 600.0  # ... and the command's MLflow work (xp.tracking.served: a study's end waits for its store)
IDLE_S = float(os.environ.get("XP_SERVICE_IDLE_S", 1800))  # a service without a run for this long ends (serve)


class Unavailable(Exception):
    """The service did not start, or went away: the run's process does its MLflow work itself."""


def usable(uri: str) -> bool:
    """Whether runs on `uri` go through the service: SQLite stores (a file of this machine, which the service
    opens as the run would); a server or a database on the network, which only the run's process may reach, not."""
    return os.environ.get(ENV, "1") != "0" and uri.startswith("sqlite:///")


def socket_path() -> Path:
    """The service's address: in xp's state folder, named by this machine, this Python and this xp's code (a
    changed xp starts its own service), or in the temporary folder where that path is too long for a socket.
    Beside it in the state folder, whatever the socket's place: its .pid, .lock and .log files (`beside`)."""
    key = hashlib.sha1(f"{_code()}|{state_dir()}".encode()).hexdigest()[:12]
    name = f"{socket.gethostname()}-{key}.sock"
    path = state_dir() / "service" / name
    if len(str(path)) > 100:  # (sun_path: 108 bytes)
        path = Path(tempfile.gettempdir()) / f"xp-{os.getuid()}" / name
    return path


PROTOCOL = 2  # the messages between a run and the service; a change makes another service (2: keyed by versions)


@functools.lru_cache(maxsize=1)
def _code() -> str:
    """What the service depends on, read once a process: this Python, this xp's code (its folder, its files' latest
    change), the MLflow and SQLAlchemy it writes with (their installed versions: nothing imported), the protocol."""
    from importlib.metadata import version

    import xp

    code = Path(xp.__file__).parent
    return (f"{sys.executable}|{code}|{max(p.stat().st_mtime_ns for p in code.rglob('*.py'))}|"
            f"mlflow {version('mlflow')}|sqlalchemy {version('sqlalchemy')}|protocol {PROTOCOL}")


def beside(sock: Path, suffix: str) -> Path:
    """The service's file `suffix` (.pid, .lock, .log), in the state folder."""
    return state_dir() / "service" / (sock.stem + suffix)


class Channel:
    """One run's connection to the service. Its reader thread logs the lines the service says for the run and
    hands the answers to `ask`."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._send_lock = threading.Lock()
        self.gone = False
        self.on_event: Callable[[str], None] = lambda event: None  # what the service tells unasked (RemoteSpool)
        threading.Thread(target=self._read, name="xp-tracking-service", daemon=True).start()

    def _read(self) -> None:
        try:
            with self.sock.makefile("rb") as f:
                for line in f:
                    msg = json.loads(line)
                    if "log" in msg:
                        log.log(int(msg["log"]), "%s", msg["msg"])
                    elif "event" in msg:
                        self.on_event(msg["event"])
                    else:
                        self._answers.put(msg)
        except (OSError, ValueError):
            pass
        self.gone = True
        self._answers.put(None)

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as e:
            self.gone = True
            raise Unavailable(f"the tracking service went away ({e.strerror or e})") from None

    def ask(self, msg: dict[str, Any], timeout_s: float = ASK_S) -> dict[str, Any]:
        self.send(msg)
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            answer = None
        if answer is None:
            self.close()
            raise Unavailable("the tracking service went away" if self.gone else
                              f"the tracking service did not answer in {timeout_s:.0f} s")
        return answer

    def close(self) -> None:
        self.gone = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect() -> Channel:
    """A connection to the service, which is started first if there is none (Unavailable: none could be)."""
    path = socket_path()
    try:
        return Channel(_connected(path))
    except OSError:
        if not starts:
            raise Unavailable("no tracking service here") from None
    _started(path)
    try:
        return Channel(_connected(path))
    except OSError:
        raise Unavailable(f"the tracking service did not start (its log: {beside(path, '.log')})") from None


def ahead(uri: str) -> None:
    """A command whose runs the service will serve starts it now, if it is not there, on a thread of its own:
    the service imports MLflow on another core while the command composes its runs and imports its framework."""
    path = socket_path() if usable(uri) else None
    if path is not None and not path.exists():
        threading.Thread(target=_started, args=(path,), name="xp-tracking-service-start", daemon=True).start()


def _started(path: Path) -> None:
    """A service listens at `path`: one was, or one is started, under a lock (two runs starting at once: the
    second finds the first's service), which is held until it listens (START_S at most)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # (the user's alone)
    beside(path, ".lock").parent.mkdir(parents=True, exist_ok=True)
    with open(beside(path, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _connected(path).close()
            return
        except OSError:
            pass
        path.unlink(missing_ok=True)  # a dead service's socket
        process = _spawn(path)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                _connected(path).close()
                print(f"xp: started the tracking service (process {process.pid}): it writes this machine's SQLite "
                      f"MLflow stores for xp's runs and ends after {IDLE_S / 60:.0f} minutes without one; python -m "
                      "xp.tracking stop ends it now", flush=True)  # (stdout: before Hydra sets its logging up)
                return
            except OSError:
                time.sleep(0.02)


def _connected(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def _spawn(path: Path) -> subprocess.Popen:
    """The service, in its own session (a run's Ctrl-C is not its), with nothing of the run's console or
    environment that says where a run is (it is told per run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XP_PLACED_TAGS", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")}
    with open(beside(path, ".log"), "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "xp.tracking.serve", str(path), str(beside(path, ".pid"))],
                                cwd="/", env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                close_fds=True)


def create_run(request: dict[str, Any]) -> tuple[Channel, dict[str, Any]]:
    """The run `request` describes, created by the service: (the run's channel, the service's answer: run_id,
    artifact_uri, experiment_id; or error, the line the store's refusal makes). Unavailable: do it here."""
    channel = connect()
    wait = float(request.get("wait_s", 0.0)) + 180.0  # (a new store's first-use lock, an outage's wait)
    return channel, channel.ask({"op": "start", **request}, wait)


class CallFailed(Exception):
    """What the service said when the command's MLflow work it did for it failed (the store away, say)."""


def call(uri: str, work: Callable[..., Any], **args: Any) -> Any:
    """`work(uri=uri, **args)`, the command's MLflow work (one of xp.tracking.served.CALLS) on the store `uri`,
    done by the service; by this process where the service does not serve that store or cannot be reached.
    CallFailed: the service's one line for an exception it met, which the caller takes as it would the exception."""
    if usable(uri):
        try:
            channel = connect()
            try:
                answer = channel.ask({"op": "call", "work": work.__name__, "args": {"uri": uri, **args}}, CALL_S)
            finally:
                channel.close()
            if "error" in answer:
                raise CallFailed(answer["error"])
            return answer["result"]
        except Unavailable as e:
            log.info("%s: this process does its MLflow work itself", e)
    return work(uri=uri, **args)


class RemoteSpool:
    """A run's spool whose records the service delivers (xp.tracking.spool.Spool's part of the run's process):
    each record is appended to the spool's file, then handed to the service. Should the service go away, a
    Spool of this process (`local`) goes on from what the file and the service's `delivered` say."""

    def __init__(self, folder: Path, uri: str, run_id: str, channel: Channel, local: Callable[[], Any],
                 artifact_uri: str | None):
        folder = folder.absolute()  # (the service's working folder is not the run's)
        self.folder, self.uri, self.run_id, self.channel, self._make_local = folder, uri, run_id, channel, local
        claim(folder, uri, run_id)
        self._seq = max([_read_int(folder / DELIVERED), *(r["seq"] for r in _read_records(folder / RECORDS))])
        self._file: Any = open(folder / RECORDS, "a")
        self._lock = threading.RLock()
        self._closing = False
        self._left = 0  # records the service had not delivered when the run ended
        self.local: Any = None
        self._away: float | None = None  # when the service said the store went away
        self._done = threading.Event()  # the service said the ended run is all delivered
        channel.on_event = self._event
        self._tell({"op": "spool", "folder": str(folder), "artifact_uri": artifact_uri})

    def _event(self, event: str) -> None:
        if event == "away":
            self._away = time.monotonic()
        elif event == "back":
            self._away = None
        elif event == "done":
            self._done.set()

    def _tell(self, msg: dict[str, Any]) -> None:
        try:
            self.channel.send(msg)
        except Unavailable as e:
            self._go_local(e)

    def _go_local(self, why: Exception) -> None:
        """The service is gone: this process delivers the run's records itself, from where it left off."""
        with self._lock:
            if self.local is not None:
                return
            log.info("%s: this process delivers run %s's records itself", why, self.run_id)
            if self._file is not None:
                self._file.close()
                self._file = None
            self.channel.close()
            self.local = self._make_local()
            if self._closing:
                self.local._last()
            self.local.resume()

    def put(self, op: str, **data: Any) -> None:
        with self._lock:
            if self.local is None:
                self._seq += 1
                record = {"seq": self._seq, "op": op, **data}
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()
                self._tell({"op": "put", "record": record})
                return
        self.local.put(op, **data)

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def delivered(self) -> bool:
        return self._done.is_set()

    @property
    def away_since(self) -> float | None:
        """When the store went away, as the service said (None: it answers)."""
        return self.local.away_since if self.local is not None else self._away

    def left(self) -> int:
        return self.local.left() if self.local is not None else self._left

    def _last(self) -> None:
        with self._lock:
            self._closing = True
            if self._file is not None:
                self._file.close()
                self._file = None
        if self.local is not None:
            self.local._last()
        else:
            self._tell({"op": "last"})

    def end(self, later: bool = False) -> None:
        """As Spool.end: wait (FLUSH_S at most) for the store to take the run's records, or (`later`) let the
        service go on delivering while this process does more (settle() waits for it)."""
        self._last()
        if later:
            _unsettled.append(self)
        else:
            self._settled(FLUSH_S)

    def _settled(self, timeout_s: float) -> None:
        if self._done.is_set():  # (ended with end(later=True), and delivered since)
            self.channel.close()
            return
        if self.local is None:
            wait = bounded(timeout_s)
            try:
                answer = self.channel.ask({"op": "close", "wait": wait}, wait + 30.0)
                self.channel.close()
                self._left = int(answer.get("left", 0))
                if answer.get("done"):
                    return
                said_left(self.uri, self.run_id, self._left, self.folder)
                return
            except Unavailable as e:
                self._go_local(e)
        self.local._settled(timeout_s)


def running(folder: Path | None = None) -> list[Any]:
    """The services that serve xp's state folder `folder` (or this process's), as psutil processes."""
    import psutil

    found = []
    for pid_file in ((folder or state_dir()) / "service").glob("*.pid"):
        try:
            process = psutil.Process(int(pid_file.read_text()))
            if "xp.tracking.serve" in process.cmdline():
                found.append(process)
        except (OSError, ValueError, psutil.Error):
            pass
    return found


def stop(folder: Path | None = None) -> list[int]:
    """End the services that serve xp's state folder `folder` (or this process's), by their process ids;
    returns those ids. Their runs go on, each delivering its own records (RemoteSpool)."""
    import signal

    import psutil

    ended = []
    for process in running(folder):
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(10)
            ended.append(process.pid)
        except psutil.Error:
            pass
    for pid_file in ((folder or state_dir()) / "service").glob("*.pid"):
        pid_file.unlink(missing_ok=True)
    return ended
