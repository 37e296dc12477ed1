"""Ctrl-C and SIGTERM held until the work reaches a point where it can stop cleanly.

Python raises KeyboardInterrupt between any two bytecodes: inside a database commit it leaves the connection
half way (SQLAlchemy's session then fails every later call, so the trials a stopped study hands back stay
RUNNING), inside a training step it leaves a state no checkpoint can hold. Under `held_interrupts()` the first
signal is recorded and raised at the next `check()`, or at once while the work only waits (`waiting()`); a second
signal is raised at once, wherever the work is."""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from xp.errors import Terminated

# A shell's prefix for a Python process that shares the terminal's Ctrl-C but handles it only once it can: ignored
# until then (an ignored signal passes through exec; in the interpreter's start, Ctrl-C was a KeyboardInterrupt
# traceback on the terminal), the process then installs its handler (xp.launching.remote, a study's local worker).
CTRL_C_ONCE_HANDLED = "trap '' INT && exec"

# called (in the signal handler: quick, no locks) when SIGINT or SIGTERM arrives, held or not: a study's worker
# bounds its waits for the store from then on (xp.tracking.spool.stopping)
when_signalled: list[Callable[[], None]] = []


def signalled(signum: int) -> BaseException:
    """A stop signal came: the error it raises (KeyboardInterrupt for SIGINT, Terminated for SIGTERM), now or at
    the next check. The first is recorded (stop_in)."""
    error = KeyboardInterrupt() if signum == signal.SIGINT else Terminated()
    if not came:
        came.append(error)
    sys.unraisablehook = _after_a_stop
    for hook in when_signalled:
        hook()
    return error


came: list[BaseException] = []  # the first stop this process got: it is stopping from then on


def stop_in(error: BaseException | None) -> BaseException | None:
    """The stop behind `error`: itself, one in its chain (a stop that landed inside a library's work, whose
    cleanup then failed otherwise: an OmegaConf node left half made, "'NoneType' object has no attribute ..."), or,
    once this process got a stop, that one (a library may have swallowed it and failed later for it); else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (KeyboardInterrupt, Terminated)):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return came[0] if came else None


def on_stop_signal(signum: int, frame: object) -> None:
    """A command's handler of SIGINT and SIGTERM: raises the stop at once (as Python's own handler raises
    KeyboardInterrupt), and records it (stop_in)."""
    raise signalled(signum)


def _after_a_stop(unraisable: "sys.UnraisableHookArgs") -> None:
    """Once a stop signal came, an object whose constructor it cut short may fail in its destructor (MXNet's
    NDArray: "'NDArray' object has no attribute 'handle'"), which Python prints as a traceback on the console:
    nothing the user did or can mend. Those are dropped. The stop itself may have been raised where Python cannot
    raise (a destructor, a weakref's callback such as the import system's module locks): Python would print it and
    go on, the stop lost. It is raised again in the main thread once this hook has returned. Anything else goes to
    Python's own hook."""
    global _hooking
    _hooking += 1
    try:
        error = unraisable.exc_value
        if isinstance(error, AttributeError) and getattr(unraisable.object, "__name__", "") == "__del__":
            return
        if isinstance(error, (KeyboardInterrupt, Terminated)) and threading.current_thread() is threading.main_thread():
            _raise_again(error)
            return
        sys.__unraisablehook__(unraisable)
    finally:
        _hooking -= 1


_hooking = 0  # _after_a_stop is running (where a stop raised would be lost again)


def _raise_again(error: BaseException) -> None:
    """`error` raised in the main thread as its signal's handler would raise it, but outside _after_a_stop: a
    thread trips the signal once the hook is done, and a handler raises the error once, then gives the signal back
    to the handler it had."""
    signum = signal.SIGINT if isinstance(error, KeyboardInterrupt) else signal.SIGTERM
    before = signal.getsignal(signum) or signal.SIG_DFL  # (None: a handler set outside Python)

    def trip() -> None:
        deadline = time.monotonic() + 10
        while _hooking and time.monotonic() < deadline:
            time.sleep(0.001)
        if signal.getsignal(signum) is again:  # (not when a signal that came meanwhile raised it)
            _thread.interrupt_main(signum)

    def again(_signum: int, _frame: object) -> None:
        if _hooking:  # it came while a hook runs, where it would be lost again: raised once the hook is done
            threading.Thread(target=trip, daemon=True).start()
            return
        signal.signal(signum, before)
        raise error

    signal.signal(signum, again)
    threading.Thread(target=trip, daemon=True).start()


class Interrupts:
    def __init__(self) -> None:
        self.pending: list[BaseException] = []
        self._waiting = False

    def _handler(self, signum: int, frame: object) -> None:
        error = signalled(signum)
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
