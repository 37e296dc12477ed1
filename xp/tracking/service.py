"""The tracking service, seen from a run's process: a long-lived process of this user and machine (xp.trackingd,
serving as xp.tracking.daemon says) that creates a SQLite store's runs and drains their spools (xp.tracking.spool),
so that a run does not import MLflow or open its store (3.4 s of a 5-s command).

A run on a SQLite store asks the service to create its MLflow run (`create_run`) and to drain its spool (`Served`);
it appends its records to the spool's file as any run does, and hears back the service's lines about the store
(away, back, refused). If the service cannot start, the run's process creates its run and drains its spool itself;
if the service goes away mid-run, the run's own Drain goes on from the spool's `delivered` mark: the same reader
of the same file, so nothing is lost or sent twice. XP_TRACKING_SERVICE=0 turns the service off.

One service per xp checkout or install (its code, the Python, the MLflow and SQLAlchemy it writes with, the
protocol: `Identity`), user, machine and state folder ($XP_STATE_DIR), started by the first run that needs it
(under a lock: two runs starting at once share one; the command that starts it says so) and gone after
XP_SERVICE_IDLE_S (1800) without runs, once idle when a newer one of its checkout started (its code changed), or at
`python -m xp.tracking stop` (this checkout's; `--every`: every checkout's).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from xp.tracking.messages import TRACKING, Close, Closed, Last, Op, Open, Refused, Result, Say, Start
from xp.tracking.spool import Spool, bounded, said_left, state_dir
from xp.wire import Channel, Message

log = logging.getLogger("xp")

ENV = "XP_TRACKING_SERVICE"  # 0: every run's process does its MLflow work itself
# whether this process may start the service: a command's (xp.cli). The processes launchers place (a study's
# workers, a job's ranks, Ray's actors) use one that is there: none outlives a command on a host it was sent to.
starts = False
START_S = 30.0  # how long a run waits for a new service to answer before doing its MLflow work itself
ASK_S = 60.0  # how long a request other than a run's creation or end may go unanswered (the service is stuck)
CALL_S = 600.0  # ... and the command's MLflow work (xp.readback.work: a study's end waits for its store)
IDLE_S = float(os.environ.get("XP_SERVICE_IDLE_S", 1800))  # a service without a run for this long ends (daemon)
PROTOCOL = 4  # the messages between a run and the service; a change makes another service (4: its operations typed)
DAEMON = "xp.trackingd"  # the service's process: python -m DAEMON SOCKET PIDFILE IDENTITY


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


PUBLIC = " public"  # after an Identity's MLflow version: a service on MLflow's public API only


@dataclass
class Identity:
    """What a service is keyed by (a change of any makes another service), and where it serves: written by the
    service beside its .pid (.json), said by `python -m xp.tracking status`."""
    checkout: str  # xp's code: its folder
    python: str
    changed_ns: int  # the latest change of xp's code
    mlflow: str  # the MLflow and SQLAlchemy it writes with (+ " public": on MLflow's public API only)
    sqlalchemy: str
    protocol: int
    state: str  # xp's state folder
    pid: int = 0  # (the service's own, as it starts)
    started: float = 0.0
    socket: str = ""

    @property
    def public(self) -> bool:
        """On MLflow's public API only (XP_MLFLOW_PUBLIC=1): said in its MLflow's field."""
        return self.mlflow.endswith(PUBLIC)


@functools.lru_cache(maxsize=1)
def identity() -> Identity:
    """This process's service's, read once a process (installed versions: nothing imported)."""
    from importlib.metadata import version

    import xp
    from xp.tracking.gate import public_only

    code = Path(xp.__file__).parent
    return Identity(str(code), sys.executable, max(p.stat().st_mtime_ns for p in code.rglob("*.py")),
                    version("mlflow") + (PUBLIC if public_only() else ""), version("sqlalchemy"), PROTOCOL,
                    str(state_dir()))


def _code() -> str:
    i = identity()
    return f"{i.python}|{i.checkout}|{i.changed_ns}|mlflow {i.mlflow}|sqlalchemy {i.sqlalchemy}|protocol {i.protocol}"


def beside(sock: Path, suffix: str) -> Path:
    """The service's file `suffix` (.pid, .lock, .log), in the state folder."""
    return state_dir() / "service" / (sock.stem + suffix)


class Link:
    """One connection to the service. Its reader thread says the lines the service says for the run, and hands
    the answers to `ask`."""

    def __init__(self, sock: socket.socket):
        self.channel = Channel(sock, TRACKING)
        self._answers: queue.Queue[Message | None] = queue.Queue()
        self._send_lock = threading.Lock()
        self.gone = False
        threading.Thread(target=self._read, name="xp-tracking-service", daemon=True).start()

    def _read(self) -> None:
        try:
            while (msg := self.channel.recv()) is not None:
                if isinstance(msg, Say):
                    log.log(msg.level, "%s", msg.msg)
                else:
                    self._answers.put(msg)
        except (OSError, ValueError):
            pass
        self.gone = True
        self._answers.put(None)

    def send(self, msg: Message) -> None:
        try:
            with self._send_lock:
                self.channel.send(msg)
        except OSError as e:
            self.gone = True
            raise Unavailable(f"the tracking service went away ({e.strerror or e})") from None

    def ask(self, msg: Message, timeout_s: float = ASK_S) -> Message:
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
        self.channel.close()


def connect() -> Link:
    """A connection to the service, which is started first if there is none (Unavailable: none could be)."""
    path = socket_path()
    try:
        return Link(_connected(path))
    except OSError:
        if not starts:
            raise Unavailable("no tracking service here") from None
    _start(path)
    try:
        return Link(_connected(path))
    except OSError:
        raise Unavailable(f"the tracking service did not start (its log: {beside(path, '.log')})") from None


def ahead(uri: str) -> None:
    """A command whose runs the service will serve starts it now, if it is not there, on a thread of its own:
    the service imports MLflow on another core while the command composes its runs and imports its framework."""
    path = socket_path() if usable(uri) else None
    if path is not None and not path.exists():
        threading.Thread(target=_start, args=(path,), name="xp-tracking-service-start", daemon=True).start()


def _start(path: Path) -> None:
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
    # the service runs this process's xp, wherever it is imported from (a checkout not installed, say)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(identity().checkout).parent), env.get("PYTHONPATH")]))
    with open(beside(path, ".log"), "ab") as out:
        return subprocess.Popen([sys.executable, "-m", DAEMON, str(path), str(beside(path, ".pid")),
                                 json.dumps(asdict(identity()))], cwd="/", env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, start_new_session=True, close_fds=True)


def create_run(request: Start) -> tuple[Link, Message]:
    """The run `request` describes, created by the service: (the run's link, the service's answer: Started, Reopen
    or Refused). Unavailable: do it here."""
    link = connect()
    return link, link.ask(request, request.wait_s + 180.0)  # (a new store's first-use lock, an outage's wait)


class CallFailed(Exception):
    """What the service said when the command's MLflow work it did for it failed (the store away, say)."""


def call(op: Op, work: Callable[..., Any]) -> Any:
    """The command's MLflow work `op` (an operation of the protocol: its store and arguments), done by the service
    (the function xp.trackingd names for its kind: `work`); by this process, `work(**op.args())`, where the
    service does not serve that store or cannot be reached. CallFailed: the service's one line for an exception
    it met, which the caller takes as it would the exception."""
    if usable(op.uri):
        try:
            link = connect()
            try:
                answer = link.ask(op, CALL_S)
            finally:
                link.close()
            if isinstance(answer, Refused):
                raise CallFailed(answer.error)
            assert isinstance(answer, Result)
            return answer.value
        except Unavailable as e:
            log.info("%s: this process does its MLflow work itself", e)
    return work(**op.args())


class Served:
    """The drain of a run's spool in the service, as the run's process sees it (Spool.drain): the service reads
    the spool's file by itself. Should the service go away, `local()`, this process's Drain, goes on from the
    `delivered` mark."""

    away_since: float | None = None  # (a store away for the service: its creation of the next run waits for it)

    def __init__(self, spool: Spool, link: Link, local: Callable[[], Any], artifact_uri: str | None):
        self.spool, self.link, self._make_local = spool, link, local
        self.local: Any = None  # (this process's Drain, once the service went away)
        self._lock = threading.Lock()
        self._closing = False
        self._tell(Open(str(spool.folder), artifact_uri))

    def _tell(self, msg: Message) -> None:
        try:
            self.link.send(msg)
        except Unavailable as e:
            self._go_local(e)

    def _go_local(self, why: Exception) -> None:
        with self._lock:
            if self.local is not None:
                return
            log.info("%s: this process delivers run %s's records itself", why, self.spool.run_id)
            self.link.close()
            self.local = local = self._make_local()
        if self._closing:
            local.last()
        local.nudge()

    def nudge(self) -> None:
        if self.local is not None:
            self.local.nudge()  # (the service reads the file by itself)

    def last(self) -> None:
        self._closing = True
        if self.local is not None:
            self.local.last()
        else:
            self._tell(Last())

    @property
    def given_up(self) -> bool:
        """This process's drain (once the service went away) delivers no more; the service's never gives up."""
        return self.local is not None and self.local.given_up

    def taken(self, timeout_s: float) -> bool:
        # (the service's drain: settled asks it to close, and it says what waits, as before)
        return self.local.taken(timeout_s) if self.local is not None else True

    def settled(self, timeout_s: float) -> None:
        if self.local is None:
            wait = bounded(timeout_s)
            try:
                answer = self.link.ask(Close(wait), wait + 30.0)
                self.link.close()
                assert isinstance(answer, Closed)
                if not answer.done:
                    said_left(self.spool.uri, self.spool.run_id, answer.left, self.spool.folder)
                return
            except Unavailable as e:
                self._go_local(e)
        self.local.settled(timeout_s)
