"""Ctrl-C and SIGTERM held until the work reaches a point where it can stop cleanly.

Python raises KeyboardInterrupt between any two bytecodes: inside a database commit it leaves the connection
half way (SQLAlchemy's session then fails every later call, so the trials a stopped study hands back stay
RUNNING), inside a training step it leaves a state no checkpoint can hold. Under `held_interrupts()` the first
signal is recorded and raised at the next `check()`, or at once while the work only waits (`waiting()`); a second
signal is raised at once, wherever the work is."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from xp.errors import Terminated

# called (in the signal handler: quick, no locks) when SIGINT or SIGTERM arrives, held or not: a study's worker
# bounds its waits for the store from then on (xp.tracking.spool.stopping)
when_signalled: list[Callable[[], None]] = []


def signalled() -> None:
    for hook in when_signalled:
        hook()


class Interrupts:
    def __init__(self) -> None:
        self.pending: list[BaseException] = []
        self._waiting = False

    def _handler(self, signum: int, frame: object) -> None:
        error = KeyboardInterrupt() if signum == signal.SIGINT else Terminated()
        signalled()
        again = bool(self.pending)
        self.pending.append(error)
        if again or self._waiting:
            raise self.pending[0]

    def check(self) -> None:
        """A point where the work can stop: a signal that came is raised here."""
        if self.pending:
            raise self.pending[0]

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The work only waits (on a queue, a socket): a signal is raised as it comes."""
        self.check()
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False


@contextmanager
def held_interrupts() -> Iterator[Interrupts]:
    """SIGINT and SIGTERM held (see the module) while the block runs; in a thread other than the main one,
    where no signal arrives, nothing changes."""
    held = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    before = {s: signal.signal(s, held._handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield held
    finally:
        for s, h in before.items():
            signal.signal(s, h)
