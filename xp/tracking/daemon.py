"""The tracking service's own process (xp.tracking.service says what it is for), started by the first run that
needs it as `python -m xp.trackingd SOCKET PIDFILE IDENTITY` (that module names the operations it does for
commands, and calls `main` here).

It listens on the Unix socket SOCKET, imports MLflow once, and serves each run's connection on a thread: it
creates the run (Tracker, as the run's process would, with the tags that process gave), then drains the run's
spool (xp.tracking.spool.Drain, reading the file the run's process appends to); the store's lines (away, back,
refused) go to the run's console. A run killed before its end leaves what is not delivered in its spool, as any
killed run does. It says what it is beside its PIDFILE (.json: service.Identity) and, asked (Status), what it
serves. It exits after XP_SERVICE_IDLE_S without a connection, once idle when a newer service of its checkout
started in its state folder (its code changed), or when its socket is removed or taken.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

from xp.errors import ConfigError, one_line, redact
from xp.tracking.messages import (TRACKING, Close, Closed, Last, Op, Open, Refused, Reopen, Result, Say, Serving, Start,
                                  Started, Status)
from xp.tracking.service import IDLE_S, Identity
from xp.tracking.spool import Drain
from xp.wire import Channel, Message

log = logging.getLogger("xp")

STORES = 16  # stores kept open (each holds its connections): the service of a user who meets many closes the rest
_owners: dict[int, Connection] = {}  # thread -> the connection whose run it works for (its lines go there)
_live: set[Connection] = set()
_lock = threading.Lock()
_calls = threading.Lock()
_gates: dict[str, Gate] = {}  # store -> its writers' turns
_ops: dict[type[Op], Callable[..., Any]] = {}  # what the service does for each operation (main's caller names them)
_stores: set[str] = set()  # the stores it served (redacted): `python -m xp.tracking status`
_idle_since = [time.monotonic()]  # since when no run or command has been connected
SUPERSEDED_S = 5.0  # how often an idle service looks for a newer one of its checkout


class Gate:
    """One writer at a time on a store: SQLite takes one write at once anyway, and a study's 16 runs delivering
    side by side on 16 threads each held one of its SQLAlchemy pool's 15 connections (the 16th timed out) and
    waited on the file's lock. The turn is handed to the next waiter alone (no herd of 16 threads woken at each
    write), in order, a run's creation (a trial waits for it) before records (which can wait: what comes
    meanwhile joins their run's next batch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False
        self._urgent: collections.deque[threading.Event] = collections.deque()  # creations waiting, in order
        self._waiting: collections.deque[threading.Event] = collections.deque()  # records waiting, in order

    @contextlib.contextmanager
    def turn(self, urgent: bool = False) -> Iterator[None]:
        mine = None
        with self._lock:
            if self._busy:
                mine = threading.Event()
                (self._urgent if urgent else self._waiting).append(mine)
            self._busy = True
        if mine is not None:
            mine.wait()  # (handed the turn)
        try:
            yield
        finally:
            with self._lock:
                queue = self._urgent or self._waiting
                following = queue.popleft() if queue else None
                self._busy = following is not None
            if following is not None:
                following.set()


def gate(uri: str) -> Gate:
    with _lock:
        return _gates.setdefault(uri, Gate())


class Forward(logging.Handler):
    """xp's lines said on a run's behalf go to that run's process, which says them on its console."""

    def emit(self, record: logging.LogRecord) -> None:
        owner = _owners.get(threading.get_ident())
        if owner is None:
            return
        owner.tell(Say(record.levelno, record.getMessage()))


class Connection:
    """One run: its creation, then its spool's drain, until its end."""

    def __init__(self, sock: socket.socket):
        self.channel = Channel(sock, TRACKING)
        self.tracker: Any = None  # (xp.tracking.tracker.Tracker, once the run is asked for)
        self.drain: ServedDrain | None = None  # (once the run's process opened its spool)
        self.created: str | None = None  # the run made for it (its id)
        self.serves = True  # a run's or a command's (not `status` asking what the service serves)
        self._send_lock = threading.Lock()

    def tell(self, msg: Message) -> None:
        """Send `msg` to the run's process, which may have gone meanwhile (what cannot go is let go)."""
        try:
            with self._send_lock:
                self.channel.send(msg)
        except OSError:
            pass

    def serve(self) -> None:
        _owners[threading.get_ident()] = self
        try:
            while (msg := self.channel.recv()) is not None:
                self.handle(msg)
        except (OSError, ValueError):
            pass
        finally:
            _owners.pop(threading.get_ident(), None)
            if self.drain is not None:
                self.drain.drop()  # its process is gone (or went on by itself): what is left stays in the spool
            elif self.created is not None:
                self._orphaned(self.created)
            self.channel.close()
            with _lock:
                _live.discard(self)

    def handle(self, msg: Message) -> None:
        if not isinstance(msg, Status):
            _idle_since[0] = time.monotonic()
        if isinstance(msg, Start):
            self.tell(self.start(msg))
        elif isinstance(msg, Open):
            self.open(Path(msg.folder), msg.artifact_uri)
        elif isinstance(msg, Last) and self.drain is not None:
            self.drain.last()
        elif isinstance(msg, Op):
            self.tell(self.call(msg))
        elif isinstance(msg, Status):
            self.serves = False
            with _lock:
                connections = sum(c.serves for c in _live)
            self.tell(Serving(sorted(_stores), connections, round(time.monotonic() - _idle_since[0], 1)))
        elif isinstance(msg, Close) and self.drain is not None:
            self.tell(Closed(self.drain.close(msg.wait), self.drain.left()))

    def start(self, msg: Start) -> Message:
        from xp.tracking.stores import open_client, trim
        from xp.tracking.tracker import Tracker

        _stores.add(redact(msg.uri))
        self.tracker = tracker = Tracker(msg.uri, msg.experiment, msg.run_name, parent_run_id=msg.parent,
                                         tags=msg.tags, tidy=msg.tidy, start_ms=msg.start_ms,
                                         settle_later=msg.settle_later, stamped=True,
                                         resumes=tuple(msg.resumes) if msg.resumes else None)  # type: ignore[arg-type]
        try:
            with gate(tracker.uri).turn(urgent=True):
                trim(STORES)
                open_client(tracker.uri, recheck=True)  # (the store may be replaced or broken since the last run)
                if tracker.resumes and (reopen := tracker.interrupted()):
                    return Reopen(reopen, str(tracker.experiment_id))
                run_id, artifact_uri = tracker._created()
                self.created = run_id
        except ConfigError as e:
            return Refused(str(e))
        except Exception as e:  # noqa: BLE001 - the run's process says it, as it would have
            return Refused(f"MLflow store {redact(tracker.uri)} is not usable: {type(e).__name__}: {one_line(e)[:300]}")
        return Started(run_id, artifact_uri, str(tracker.experiment_id), int(tracker.start_ms or 0))

    def _orphaned(self, run_id: str) -> None:
        """The run's process went before it opened its spool (killed as its run was made, or it gave up waiting and
        made its own): nobody else ends the run made for it, which the next command's reaper may have looked for
        before it existed (found by tests/test_kill.py under load: a run left RUNNING). Ended FAILED here."""
        from xp.states import RunStatus
        from xp.tracking.ending import end_for

        try:
            with gate(self.tracker.uri).turn():
                end_for(self.tracker.client, run_id, "its process went as its run was made", RunStatus.FAILED)
        except Exception as e:  # noqa: BLE001 - the store away: the next command's reaper ends it (its process is gone)
            log.warning("run %s: its process went as it was made; it could not be ended here: %s", run_id,
                        one_line(e)[:200])

    def call(self, op: Op) -> Message:
        """A command's MLflow work `op`, by the function the service's process names for its kind (xp.trackingd),
        one at a time (MLflow's registry reads its tracking store from a global: two at once could cross)."""
        _stores.add(redact(op.uri))
        try:
            with _calls:
                return Result(_ops[type(op)](**op.args()))
        except Exception as e:  # noqa: BLE001 - the command meets it as it would have
            return Refused(f"{type(e).__name__}: {one_line(e)[:300]}")

    def open(self, folder: Path, artifact_uri: str | None) -> None:
        tracker = self.tracker
        assert tracker is not None
        run_id = folder.name.rsplit("-", 1)[0]
        self.drain = ServedDrain(folder, tracker.uri, run_id, lambda: tracker.client, artifact_uri)
        self.drain.tell = lambda level, line: self.tell(Say(level, line))
        self.drain.nudge()


class ServedDrain(Drain):
    """A run's drain here: its records wait for the store's turn (Gate; its model and artifacts do not: their
    files are most of their work)."""

    def _send(self, records: list[dict[str, Any]]) -> None:
        with gate(self.uri).turn() if records[0]["op"] not in ("model", "artifact") else contextlib.nullcontext():
            super()._send(records)


def _warm() -> None:
    """MLflow imported (once, on this thread: concurrent imports of it fail) and its SQLite store's modules."""
    import mlflow.entities, mlflow.store.tracking.sqlalchemy_store, mlflow.tracking  # noqa: F401, E401


def _still_ours(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


def main(argv: list[str], ops: dict[type[Op], Callable[..., Any]]) -> int:
    """SOCKET PIDFILE IDENTITY (service.Identity, as JSON): serve there, doing `ops` for commands, until idle for
    IDLE_S, superseded by a newer service of the same checkout once idle, or told to go (SIGTERM, its socket
    taken)."""
    from xp.tracking.services import superseded

    path, pid_file = Path(argv[0]), Path(argv[1])
    said = Identity(**json.loads(argv[2]))
    said.pid, said.started, said.socket = os.getpid(), time.time(), str(path)
    _ops.update(ops)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))  # (the starting run holds the lock and removed a dead service's socket)
    server.listen(64)
    inode = path.stat().st_ino
    pid_file.with_suffix(".json").write_text(json.dumps(asdict(said)))  # (what it is: `python -m xp.tracking status`)
    pid_file.write_text(str(os.getpid()))  # (who serves: `services.stop`)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    log.setLevel(logging.INFO)
    log.addHandler(Forward())
    log.propagate = True
    # told to stop (services.stop): it leaves at its loop's next turn (its runs go on without it: service.Served). A
    # handler that raised was lost when the signal came as it imported MLflow (under the import system's locks)
    told = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: told.set())
    log.info("xp tracking service %d on %s", os.getpid(), path)
    _warm()
    server.settimeout(1.0)
    why, looked = f"idle {IDLE_S:.0f} s", 0.0
    while _still_ours(path, inode) and not told.is_set():
        try:
            sock, _ = server.accept()
        except socket.timeout:
            with _lock:
                busy = any(c.serves for c in _live)
            if busy:
                _idle_since[0] = time.monotonic()
            elif time.monotonic() - _idle_since[0] > IDLE_S:
                break
            elif time.monotonic() - looked > SUPERSEDED_S:  # nothing to deliver: a newer one of its checkout ends it
                looked = time.monotonic()
                if (newer := superseded(said, pid_file.parent.parent)) is not None:
                    why = f"superseded by service {newer} (the same checkout's, started since)"
                    break
            continue
        sock.settimeout(None)
        connection = Connection(sock)
        with _lock:
            _live.add(connection)
        threading.Thread(target=connection.serve, name=f"run-{sock.fileno()}", daemon=True).start()
    if _still_ours(path, inode):
        path.unlink()  # new runs start a new service from now on
    if pid_file.exists() and pid_file.read_text() == str(os.getpid()):
        pid_file.unlink(missing_ok=True)
        pid_file.with_suffix(".json").unlink(missing_ok=True)
    server.close()
    log.info("xp tracking service %d: %s, gone", os.getpid(), "told to stop" if told.is_set() else why)
    return 0
