"""The tracking service's own process (xp.tracking.service says what it is for): `python -m xp.tracking.daemon
SOCKET PIDFILE`, started by the first run that needs it.

It listens on the Unix socket SOCKET, imports MLflow once, and serves each run's connection on a thread: it
creates the run (Tracker, as the run's process would, with the tags that process gave), then drains the run's
spool (xp.tracking.spool.Drain, reading the file the run's process appends to); the store's lines (away, back,
refused) go to the run's console. A run killed before its end leaves what is not delivered in its spool, as any
killed run does. It exits after XP_SERVICE_IDLE_S without a connection, or when its socket is removed or taken.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from xp.errors import ConfigError, one_line, redact
from xp.tracking.messages import TRACKING, Call, Close, Closed, Last, Open, Refused, Reopen, Result, Say, Start, Started
from xp.tracking.service import IDLE_S
from xp.tracking.spool import Drain
from xp.wire import Channel, Message

log = logging.getLogger("xp")

STORES = 16  # stores kept open (each holds its connections): the service of a user who meets many closes the rest
_owners: dict[int, Connection] = {}  # thread -> the connection whose run it works for (its lines go there)
_live: set[Connection] = set()
_lock = threading.Lock()
_calls = threading.Lock()
_gates: dict[str, Gate] = {}  # store -> its writers' turns


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
        if isinstance(msg, Start):
            self.tell(self.start(msg))
        elif isinstance(msg, Open):
            self.open(Path(msg.folder), msg.artifact_uri)
        elif isinstance(msg, Last) and self.drain is not None:
            self.drain.last()
        elif isinstance(msg, Call):
            self.tell(self.call(msg.work, msg.args))
        elif isinstance(msg, Close) and self.drain is not None:
            self.tell(Closed(self.drain.close(msg.wait), self.drain.left()))

    def start(self, msg: Start) -> Message:
        from xp.tracking.stores import open_client, trim
        from xp.tracking.tracker import Tracker

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

    def call(self, work: str, args: dict[str, Any]) -> Message:
        """A command's MLflow work (`work`: "MODULE:NAME", a function an xp module offers in its CALLS, e.g.
        xp.readback.work), one at a time (MLflow's registry reads its tracking store from a global: two at once
        could cross)."""
        import importlib

        try:
            module, name = work.split(":")
            if not module.startswith("xp."):
                raise ValueError(f"not xp's: {work}")
            with _calls:
                return Result(importlib.import_module(module).CALLS[name](**args))
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


def main(argv: list[str]) -> int:
    path, pid_file = Path(argv[0]), Path(argv[1])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))  # (the starting run holds the lock and removed a dead service's socket)
    server.listen(64)
    inode = path.stat().st_ino
    pid_file.write_text(str(os.getpid()))  # (who serves: `service.stop`)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    log.setLevel(logging.INFO)
    log.addHandler(Forward())
    log.propagate = True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # (its runs go on without it: service.Served)
    log.info("xp tracking service %d on %s", os.getpid(), path)
    _warm()
    server.settimeout(1.0)
    idle_since = time.monotonic()
    while _still_ours(path, inode):
        try:
            sock, _ = server.accept()
        except socket.timeout:
            with _lock:
                busy = bool(_live)
            if busy:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_S:
                break
            continue
        sock.settimeout(None)
        connection = Connection(sock)
        with _lock:
            _live.add(connection)
        idle_since = time.monotonic()
        threading.Thread(target=connection.serve, name=f"run-{sock.fileno()}", daemon=True).start()
    if _still_ours(path, inode):
        path.unlink()  # new runs start a new service from now on
        pid_file.unlink(missing_ok=True)
    server.close()
    log.info("xp tracking service %d: idle %.0f s, gone", os.getpid(), IDLE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
