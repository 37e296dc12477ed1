"""The one channel between a study's scheduler and its workers, whatever carries it (a socket pair on this machine,
a TCP connection a worker elsewhere makes back): the messages they exchange, typed, and where the scheduler waits
for them (`Inbox`: every worker's messages in the order they came, not file descriptors, so a carrier without one
fits too).

    scheduler -> worker:  Fork (to the zygote: a worker to fork for a slot), RunTrial, Prune (the answer to
                          ShouldPrune), Exit
    zygote -> scheduler:  Forked (the forked worker's process id), Exited (a forked worker's exit code)
    worker -> scheduler:  Hello (a worker elsewhere calling back, with its slot's secret), Ready, Error,
                          Report, ShouldPrune, Attr, Done

On the wire each is one line of JSON, {"op": KIND, ...fields}.
"""

from __future__ import annotations

import collections
import json
import queue
import socket
import threading
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar, TypeVar

from xp.states import TrialState


@dataclass
class Message:
    op: ClassVar[str]


M = TypeVar("M", bound=type[Message])


def _kind(op: str) -> Callable[[M], M]:
    """A message's class, a dataclass, known on the wire as `op`."""
    def mark(cls: M) -> M:
        cls.op = op
        KINDS[op] = cls
        return cls
    return mark


KINDS: dict[str, type[Message]] = {}


@_kind("fork")
@dataclass
class Fork(Message):
    """To the zygote (xp.launching.zygote): fork a worker with these variables, without those, in this folder."""
    env: dict[str, str]
    unset: list[str]
    cwd: str


@_kind("trial")
@dataclass
class RunTrial(Message):
    """One trial to run: its parameters, the study's config they are set on, where its files and run go."""
    number: int
    params: dict[str, Any]
    study: str
    sweep: str
    base: list[str]  # the command line's overrides (and the user's config folders) the trial composes from
    task: list[str]  # ... and its parameters: its .hydra/overrides.yaml
    output_dir: str
    parent: str | None  # the study's MLflow parent run
    config: dict[str, Any] | None = None  # the study's composed config (its parameters are set on it)
    first: bool = True  # the worker's first trial (it tidies what a previous process left)


@_kind("prune")
@dataclass
class Prune(Message):
    prune: bool


@_kind("exit")
@dataclass
class Exit(Message):
    pass


@_kind("forked")
@dataclass
class Forked(Message):
    """From the zygote (xp.launching.zygote): the worker it forked for the last Fork asked, its process id."""
    pid: int


@_kind("exited")
@dataclass
class Exited(Message):
    """From the zygote: one of its workers ended, with this exit code (negative: the signal that ended it)."""
    pid: int
    code: int


@_kind("hello")
@dataclass
class Hello(Message):
    token: str


@_kind("ready")
@dataclass
class Ready(Message):
    pid: int


@_kind("error")
@dataclass
class Error(Message):
    error: str


@_kind("report")
@dataclass
class Report(Message):
    value: float
    step: int


@_kind("should_prune")
@dataclass
class ShouldPrune(Message):
    pass


@_kind("attr")
@dataclass
class Attr(Message):
    key: str
    value: Any


@_kind("done")
@dataclass
class Done(Message):
    """How a trial ended: its state (COMPLETE, PRUNED, FAIL), its objectives' values, the failure's line, and
    whether the trial changed the worker's process for good (mixed precision: the worker leaves)."""
    state: str = TrialState.FAIL  # a TrialState's value (a plain string off the wire)
    values: list[float] = field(default_factory=list)
    error: str | None = None
    recycle: bool = False


def encode(msg: Message) -> bytes:
    return (json.dumps({"op": msg.op, **asdict(msg)}) + "\n").encode()


def decode(line: bytes) -> Message:
    """ValueError for what is not one of the messages (a stranger's bytes)."""
    data = json.loads(line)
    cls = KINDS.get(data.pop("op", None)) if isinstance(data, dict) else None
    if cls is None or set(data) - {f.name for f in fields(cls)}:
        raise ValueError(f"not a study message: {line[:80]!r}")
    try:
        return cls(**data)
    except TypeError as e:
        raise ValueError(f"not a study message: {e}") from None


class Channel:
    """Messages over a socket. Read by its owner (recv), or, once `listen` is called, by a thread that puts each
    into an Inbox."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""
        self.held: collections.deque[Message] = collections.deque()  # read while waiting for another kind

    def send(self, msg: Message) -> None:
        self.sock.sendall(encode(msg))

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message (blocking, at most `timeout` s: TimeoutError); None once the other end closed."""
        return self.held.popleft() if self.held else self._read(timeout)

    def recv_kind(self, kind: type[Message]) -> Message | None:
        """The next message of `kind`; the others that come first are held for recv()."""
        while True:
            msg = self._read()
            if msg is None or isinstance(msg, kind):
                return msg
            self.held.append(msg)

    def _read(self, timeout: float | None = None) -> Message | None:
        self.sock.settimeout(timeout)
        try:
            while b"\n" not in self.buf:
                data = self.sock.recv(65536)
                if not data:
                    return None
                self.buf += data
        except ConnectionResetError:  # closed too, with our last message unread (a stopped study's scheduler)
            return None
        finally:
            self.sock.settimeout(None)
        line, self.buf = self.buf.split(b"\n", 1)
        return decode(line)

    def listen(self, inbox: Inbox, source: Any) -> None:
        """From now on each message goes to `inbox` as (source, message), and the channel's end as (source, None)."""
        def read() -> None:
            try:
                while (msg := self.recv()) is not None:
                    inbox.put(source, msg)
            except (OSError, ValueError):  # reset, or bytes that are no message: the channel is done either way
                pass
            inbox.put(source, None)

        threading.Thread(target=read, name="xp-channel", daemon=True).start()

    def hang_up(self) -> None:
        """Stop reading: what already arrived is still read, then the channel ends (its listener says so). For a
        worker whose process is gone while its connection is not (a lost node's)."""
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self) -> None:
        self.hang_up()
        self.sock.close()


class Inbox:
    """Where the scheduler waits: (source, message) from every channel listening into it, in the order they came;
    (source, None) when a channel ended."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple[Any, Message | None]] = queue.SimpleQueue()

    def put(self, source: Any, msg: Message | None) -> None:
        self.queue.put((source, msg))

    def get(self, timeout: float) -> tuple[Any, Message | None] | None:
        """The next one, waiting at most `timeout` s (None: nothing came)."""
        try:
            return self.queue.get(timeout=max(0.0, timeout)) if timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return None
