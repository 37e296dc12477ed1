"""The one path of a record: a run's process appends it to the run's spool file (`Spool.put`: one JSON line,
flushed, so a kill of the process loses none); one `Drain` reads the file from its `delivered` mark and writes the
records to the store in order and in batches, marking how far it got. The drain runs in the tracking service for a
SQLite store (xp.tracking.service), else in the run's own process; whatever a process left undelivered is drained
by the next command on that store, or by `python -m xp.sync` (xp.tracking.leftovers).

While the store is away (a server restarting, a database that does not answer) training goes on, the file grows,
and the drain retries with a bounded backoff; one line says the store went away, one that it is back. Each record
carries its own timestamp and MLflow's stores take a metric (key, value, timestamp, step) once, so a batch sent
again after a lost reply is not counted twice: every record is delivered in order, exactly once. A run that ends
while the store is away keeps its spool, listed in xp's state folder (`$XP_STATE_DIR`, `~/.local/state/xp`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from xp.errors import one_line, redact
from xp.processes import started
from xp.tracking import rows
from xp.tracking.stores import away_reason, refused

log = logging.getLogger("xp")

RECORDS, DELIVERED, RUN = "records.jsonl", "delivered", "run.json"
FLUSH_S = 15.0  # how long a run's end waits for the store to take what is left, before keeping the spool
STORE_WAIT_S = float(os.environ.get("XP_STORE_WAIT_S", 900))  # how long a study's next trial waits for a store that
# went away (its trial is not failed for it; past that, it fails as a run whose store is not usable does)
BACKOFF_S = (0.5, 5.0)  # the drain's wait after a failed send: first, and at most (doubling)
LINGER_S = 1.0  # while a run goes on, its records reach the store at most this often (what comes meanwhile goes
# in the same call: a study's 1-s trial sends its epochs' metrics in one call, not one each; docs/benchmarks.md)
LIMITS = {"metrics": 1000, "params": 100, "tags": 100}  # MLflow's log_batch limits



def state_dir() -> Path:
    return Path(os.environ.get("XP_STATE_DIR") or Path.home() / ".local" / "state" / "xp")


def pending_index() -> Path:
    return state_dir() / "pending"


class Deliverer(Protocol):
    """Who delivers a spool's records: a Drain of the run's process, or the tracking service (service.Served)."""
    away_since: float | None

    def nudge(self) -> None: ...
    def last(self) -> None: ...
    def taken(self, timeout_s: float) -> bool: ...
    @property
    def given_up(self) -> bool: ...
    def settled(self, timeout_s: float) -> None: ...


class Spool:
    """The writing side: a run's records, appended to its file in `folder` by this process, which says so in the
    folder's run.json and the pending index (a killed process's spool is found too). `drain(spool)` makes who
    delivers them: a Drain of this process, or the tracking service's (xp.tracking.service.Served)."""

    def __init__(self, folder: Path, uri: str, run_id: str, drain: Callable[[Spool], Deliverer]):
        self.folder, self.uri, self.run_id = Path(folder).absolute(), uri, run_id
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / RUN).write_text(json.dumps({"uri": uri, "run_id": run_id, "pid": os.getpid(), "host":
                                                   socket.gethostname(), "started": started(os.getpid())}))
        (entry := pending_index() / self.folder.name).parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(str(self.folder))
        records = self.folder / RECORDS
        had = records.read_bytes() if records.exists() else b""  # (a reopened run's, in this process)
        self._seq = max([_read_int(self.folder / DELIVERED), *map(int, re.findall(rb'^{"seq": (\d+)', had, re.M))])
        self._file = open(records, "a")
        if had and not had.endswith(b"\n"):
            self._file.write("\n")  # (a line cut by a kill: the next one starts on a line of its own)
        self._lock = threading.Lock()
        self.drain = drain(self)

    def put(self, op: str, **data: Any) -> None:
        with self._lock:
            self._seq += 1
            self._file.write(json.dumps({"seq": self._seq, "op": op, **data}) + "\n")
            self._file.flush()
        self.drain.nudge()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def end(self, later: bool = False) -> None:
        """Every record of the run is here. Wait (FLUSH_S at most) for the store to take them; or, `later`, let
        the drain go on while this process does more (a study's worker starts its next trial): settle() waits
        for it, as the next run's end does and the process must before it exits."""
        with self._lock:
            self._file.close()
        self.drain.last()
        if later:
            _unsettled.append(self.drain)
        else:
            self.drain.settled(FLUSH_S)


class Drain:
    """The reading side: delivers the records of the spool in `folder` to run `run_id` of store `uri` through the
    MlflowClient `client()` makes, in order, from the folder's `delivered` mark; on a thread of its own (nudge)
    or called (deliver_some)."""

    def __init__(self, folder: Path, uri: str, run_id: str, client: Callable[[], Any],
                 artifact_uri: str | None = None):
        import mlflow.entities  # noqa: F401  imported here, not first on the drain thread (a concurrent import fails)

        self.folder, self.uri, self.run_id, self.client = Path(folder), uri, run_id, client
        self.artifact_uri = artifact_uri  # the run's, where the caller knows it (else read from the run)
        self._artifacts: Any = None  # the run's artifact repository, made at its first artifact
        self._delivered = _read_int(self.folder / DELIVERED)
        self._offset, self._queue = 0, list[dict[str, Any]]()
        self.tell: Callable[[int, str], None] = log.log  # where its lines go (the service's: to the run's process)
        self._lock = threading.Lock()
        self._wake, self._ending, self._abandoned = threading.Event(), threading.Event(), threading.Event()
        self._closing = False
        self._sent = 0.0  # when the drain last sent something (time.monotonic())
        self._thread: threading.Thread | None = None
        self.away_since: float | None = None  # when the store stopped answering (None: it answers)
        self._mark_fd: int | None = None  # the `delivered` file, written in place (one write: whole or not at all)

    def _read(self) -> None:
        """The records appended since the last read (whole lines only: the writer may be mid-line)."""
        try:
            with open(self.folder / RECORDS, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        whole = data[:data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by a kill mid-write
                continue
            if record["seq"] > max(self._delivered, self._queue[-1]["seq"] if self._queue else 0):
                self._queue.append(record)

    def left(self, op: str | None = None) -> int:
        """How many records (of kind `op`: "end", say) the store has not taken."""
        with self._lock:
            self._read()
            return sum(1 for r in self._queue if op in (None, r["op"]))

    def nudge(self) -> None:
        """New records are in the file: start the drain's thread if it has not started."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="xp-tracking-drain", daemon=True)
                self._thread.start()
        self._wake.set()

    def last(self) -> None:
        """No more records come: the drain ends once it has delivered them."""
        with self._lock:
            self._closing = True
        self._ending.set()
        self.nudge()

    def drop(self) -> None:
        """Deliver no more: what is left stays in the spool (its process was killed: leftovers delivers it)."""
        self._abandoned.set()
        self.last()

    @property
    def given_up(self) -> bool:
        """It delivers no more (closed or dropped): what it has not delivered waits in its spool."""
        return self._abandoned.is_set() and bool(self.left())

    def taken(self, timeout_s: float) -> bool:
        """Wait (timeout_s at most) for the store to take every record, the drain going on after; True if it did."""
        deadline = time.monotonic() + timeout_s
        while self.left() and not self._abandoned.is_set() and time.monotonic() < deadline:
            self._abandoned.wait(0.1)
        return not self.left()

    def close(self, timeout_s: float = FLUSH_S) -> bool:
        """Wait (timeout_s at most) for the store to take every record; True if it did (the spool folder goes)."""
        self.last()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():  # (the drain may close its own spool)
            thread.join(timeout=timeout_s)
        self._abandoned.set()
        done = not self.left()
        if self._mark_fd is not None:
            os.close(self._mark_fd)
            self._mark_fd = None
        if done:
            shutil.rmtree(self.folder, ignore_errors=True)
            (pending_index() / self.folder.name).unlink(missing_ok=True)
            try:
                self.folder.parent.rmdir()  # the run's mlflow-spool/, when it was the only spool there
            except OSError:
                pass
        return done

    def settled(self, timeout_s: float) -> None:
        if not self.close(bounded(timeout_s)):
            said_left(self.uri, self.run_id, self.left(), self.folder)

    def _loop(self) -> None:
        wait = BACKOFF_S[0]
        while not self._abandoned.is_set():
            self._wake.wait(LINGER_S)
            self._wake.clear()
            self._ending.wait(self._sent + LINGER_S - time.monotonic())  # (what comes meanwhile joins the call)
            if not self.left():
                if self._closing:
                    return
                continue
            if self.deliver_some():
                wait = BACKOFF_S[0]
                self._wake.set()  # (more may wait)
                continue
            if self._abandoned.wait(wait):  # the store is away: try again, less and less often
                return
            wait = min(2 * wait, BACKOFF_S[1])

    def deliver_some(self) -> bool:
        """Send the oldest records (one batch, or one artifact or end); False if the store is away."""
        with self._lock:
            self._read()
            records = _batch(self._queue)
        if not records:
            return True
        try:
            self._send(records)
        except Exception as e:
            if refused(e):
                self.tell(logging.WARNING, f"MLflow refused {_what(records)} of run {self.run_id} "
                                           f"({one_line(e)[:200]}): left out")
            else:
                if self.away_since is None:
                    self.away_since = time.monotonic()
                    self.tell(logging.WARNING, f"tracking store {redact(self.uri)} is away ({away_reason(e)}): "
                                               f"training goes on; its records wait in {self.folder}")
                return False
        if self.away_since is not None:
            self.tell(logging.WARNING, f"tracking store {redact(self.uri)} is back after "
                                       f"{time.monotonic() - self.away_since:.0f} s: delivering what waited")
            self.away_since = None
        self._sent = time.monotonic()
        with self._lock:
            del self._queue[:len(records)]
            self._delivered = records[-1]["seq"]
        self._mark(self._delivered)
        return True

    def _mark(self, seq: int) -> None:
        if self._mark_fd is None:
            self._mark_fd = os.open(self.folder / DELIVERED, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._mark_fd, b"%020d" % seq, 0)  # (fixed width: each overwrites the whole number)
        if self._abandoned.is_set():  # (a send that outlived close(): the mark is not kept open)
            os.close(self._mark_fd)
            self._mark_fd = None

    def _send(self, records: list[dict[str, Any]]) -> None:
        client = self.client()
        first = records[0]
        if first["op"] == "artifact":
            if self._artifacts is None:
                from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

                where = self.artifact_uri or client.get_run(self.run_id).info.artifact_uri
                self._artifacts = get_artifact_repository(where, tracking_uri=self.uri)
            self._artifacts.log_artifact(str(self.folder / first["file"]), first.get("dest"))
        elif first["op"] == "model":
            from xp.tracking.models import send_model

            send_model(client, self.run_id, self.folder, first)
        elif first["op"] == "end":
            rows.end_run(client, self.run_id, first["status"], first.get("time"))
        else:
            rows.log_batch(client, self.run_id, records)


def said_left(uri: str, run_id: str, left: int, folder: Path) -> None:
    """One line: a run's end did not see the store take `left` records, which wait in `folder`."""
    if _stop_by is not None:  # stopping: what is left is delivered by the command that started this process
        log.info("run %s stopped: %d records wait in %s for delivery", run_id, left, folder)
        return
    log.warning("tracking store %s did not answer: %d records of run %s wait in %s; the next xp command on the "
                "store delivers them, or now: python -m xp.sync", redact(uri), left, run_id, folder)


_unsettled: list[Any] = []  # the drains of runs ended with end(later=True), in order: they may still deliver
_stop_by: float | None = None  # the process stops (stopping()): no wait for a store goes past this moment


def stopping(within_s: float) -> None:
    """This process was told to stop (a study's worker: Ctrl-C, SIGTERM): from now on no wait for a store lasts past
    `within_s` from now; what is not delivered by then stays in its spool (durable, in the pending index), for the
    process that started this one to deliver once every worker has gone (one writer: no contention) or for xp.sync."""
    global _stop_by
    by = time.monotonic() + within_s
    _stop_by = by if _stop_by is None else min(_stop_by, by)  # (the scheduler's SIGTERM after Ctrl-C: no later)


def bounded(timeout_s: float) -> float:
    """A wait of timeout_s, cut to what is left before a stop's moment (stopping())."""
    return timeout_s if _stop_by is None else max(0.0, min(timeout_s, _stop_by - time.monotonic()))


def settle(timeout_s: float = FLUSH_S, away_only: bool = False, keep: bool = False) -> None:
    """Wait (timeout_s at most, in all) for the stores to take the records of the runs ended with end(later=True);
    away_only: only if one of those stores is away (the next run would not start either). `keep`: a drain whose store
    has not taken everything by then goes on delivering (a study's worker, which lives on: were it given up, nobody
    would deliver its records while the worker lives, and its run stayed RUNNING; found by benchmarks/chaos.py);
    without, it is given up and its records wait for the next command or xp.sync."""
    if away_only and all(d.away_since is None for d in _unsettled):
        return
    deadline, going = time.monotonic() + bounded(timeout_s), []
    while _unsettled:
        drain = _unsettled.pop(0)
        if keep and not drain.taken(max(0.0, deadline - time.monotonic())):
            going.append(drain)
            continue
        drain.settled(max(0.0, deadline - time.monotonic()))
    _unsettled[:0] = going


def ended_later() -> list[Any]:
    """The drains of the runs ended with end(later=True) that may still deliver (a study's worker: its trials')."""
    return list(_unsettled)


def kept(drains: list[Any], timeout_s: float) -> bool | None:
    """Whether the store took every record of `drains` within timeout_s: True; False: not yet; None: never (a
    drain given up with records left, which wait in its spool for the next command or xp.sync)."""
    deadline = time.monotonic() + timeout_s
    for drain in drains:
        if not drain.taken(max(0.0, deadline - time.monotonic())):
            return None if drain.given_up else False
    return True


def _batch(queue: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The oldest records that go in one call: consecutive batches within MLflow's limits, or one other record."""
    if not queue or queue[0]["op"] != "batch":
        return queue[:1]
    out: list[dict[str, Any]] = []
    counts = dict.fromkeys(LIMITS, 0)
    for r in queue:
        if r["op"] != "batch" or any(counts[k] + len(r.get(k, [])) > n for k, n in LIMITS.items()) and out:
            break
        out.append(r)
        for k in LIMITS:
            counts[k] += len(r.get(k, []))
    return out


def _what(records: list[dict[str, Any]]) -> str:
    return ", ".join(sorted({r["op"] for r in records}))


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
