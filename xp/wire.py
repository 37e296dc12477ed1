"""Typed messages between xp's processes, one codec for every protocol (a study's scheduler and its workers:
xp.studies.channel; a run and the tracking service: xp.tracking.messages): each message a dataclass registered
under its protocol with a name (`kind`), on the wire one line of JSON, {"op": NAME, ...fields}; a `Channel` carries
them over a socket and an `Inbox` gathers several channels' in the order they came.
"""

from __future__ import annotations

import collections
import json
import queue
import socket
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, ClassVar, TypeVar


@dataclass
class Message:
    op: ClassVar[str]


M = TypeVar("M", bound=type[Message])


class Protocol:
    """The messages one pair of processes exchange, by their names on the wire."""

    def __init__(self, name: str):
        self.name, self.kinds = name, dict[str, type[Message]]()

    def kind(self, op: str) -> Callable[[M], M]:
        """A message's class, a dataclass, known on the wire as `op`."""
        def mark(cls: M) -> M:
            cls.op = op
            self.kinds[op] = cls
            return cls
        return mark

    def decode(self, line: bytes) -> Message:
        """ValueError for what is not one of the messages (a stranger's bytes)."""
        data = json.loads(line)
        cls = self.kinds.get(data.pop("op", None)) if isinstance(data, dict) else None
        if cls is None or set(data) - {f.name for f in fields(cls)}:
            raise ValueError(f"not a {self.name} message: {line[:80]!r}")
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"not a {self.name} message: {e}") from None


def encode(msg: Message) -> bytes:
    return (json.dumps({"op": msg.op, **asdict(msg)}) + "\n").encode()


class Channel:
    """Messages over a socket. Read by its owner (recv), or, once `listen` is called, by a thread that puts each
    into an Inbox."""

    def __init__(self, sock: socket.socket, protocol: Protocol):
        self.sock, self.buf, self.protocol = sock, b"", protocol
        self.held: collections.deque[Message] = collections.deque()  # read while waiting for another kind
        self._sending = threading.Lock()  # (two threads' messages never interleave on the wire)

    def send(self, msg: Message) -> None:
        with self._sending:
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
        return self.protocol.decode(line)

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
