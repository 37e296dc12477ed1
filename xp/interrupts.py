"""Ctrl-C and SIGTERM held until the work reaches a point where it can stop cleanly.

Python raises KeyboardInterrupt between any two bytecodes: inside a database commit it leaves the connection
half way (SQLAlchemy's session then fails every later call, so the trials a stopped study hands back stay
RUNNING), inside a training step it leaves a state no checkpoint can hold. Under `held_interrupts()` the first
signal is recorded and raised at the next `check()`, or at once while the work only waits (`waiting()`); a second
signal is raised at once, wherever the work is."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from xp.errors import Terminated

# called (in the signal handler: quick, no locks) when SIGINT or SIGTERM arrives, held or not: a study's worker
# bounds its waits for the store from then on (xp.tracking.spool.stopping)
when_signalled: list[Callable[[], None]] = []


def signalled() -> None:
    sys.unraisablehook = _after_a_stop
    for hook in when_signalled:
        hook()


def _after_a_stop(unraisable: "sys.UnraisableHookArgs") -> None:
    """Once a stop signal came, an object whose constructor it cut short may fail in its destructor (MXNet's
    NDArray: "'NDArray' object has no attribute 'handle'"), which Python prints as a traceback on the console:
    nothing the user did or can mend. Those are dropped; anything else goes to Python's own hook."""
    if isinstance(unraisable.exc_value, AttributeError) and \
            getattr(unraisable.object, "__name__", "") == "__del__":
        return
    sys.__unraisablehook__(unraisable)


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
