"""A study's Optuna storage that rides out its database going away (a PostgreSQL server restarting, a network
partition): each call that finds the server away waits for it and is made again, instead of ending the study in a
traceback with its trials in flight lost. Found by benchmarks/chaos.py: PostgreSQL stopped for 5-40 s ended both of
a study's commands (`server closed the connection unexpectedly` in the scheduler's tell, then in its give-back).

Only the study's command reaches the storage (its slots' workers tell it their results over their channels), so this
is the one place that waits. One line says the storage is away and how long the study waits (`XP_STORE_WAIT_S`,
900 s, as for the tracking store), one when it is back; past the wait the call fails as it did before.

A call is made again only when the database did not answer (SQLAlchemy's OperationalError or InterfaceError, also
when Optuna wrapped it in its StorageInternalError). A write whose answer was lost after the database committed it is
made again too: setting a trial's state then finds it finished already, which is the state asked for (taken as
done); a trial created twice leaves one without parameters, which the next command voids (xp.studies.sweeper)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger("xp")

BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # between tries, seconds


def _away(error: BaseException) -> BaseException | None:
    """The error in `error` (or what it wraps) that says the database did not answer; None: a call was wrong."""
    from sqlalchemy import exc

    seen: BaseException | None = error
    for _ in range(4):  # the error, and what Optuna wrapped
        if seen is None:
            return None
        if isinstance(seen, (exc.OperationalError, exc.InterfaceError)) or \
                (isinstance(seen, exc.DBAPIError) and seen.connection_invalidated):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def private_ok() -> bool:
    """Whether the Optuna installed is one whose private parts used here xp is tested with (4.x, 5.x): its
    BaseHeartbeat (a storage that is one has its dead sweepers' trials failed and retried: fail_stale_trials asks
    isinstance) and _CachedStorage (what optuna.create_study wraps an RDBStorage in: finished trials read once)."""
    import optuna

    return int(optuna.__version__.split(".")[0]) in (4, 5)


def rdb(make: Callable[[], Any], where: str, wait_s: float) -> Any:
    """A database's storage (`make()`: an RDBStorage, which connects as it is made) that rides out an outage: made
    when the database answers (within `wait_s`), its calls waiting for it whenever it goes away."""
    state = _State(where, wait_s)
    inner = state.call(make)
    if not private_ok():  # (without Optuna's heartbeats and cache then: its dead sweepers' trials are not retried)
        return _riding(inner, state, ())
    import optuna
    from optuna.storages._heartbeat import BaseHeartbeat

    return _riding(optuna.storages._CachedStorage(inner), state, (BaseHeartbeat,))


class _State:
    """Whether the database is away, since when, shared by every thread calling the storage (one line when it goes
    away, one when it is back)."""

    def __init__(self, where: str, wait_s: float):
        self.where, self.wait_s, self.lock = where, wait_s, threading.Lock()
        self.since: float | None = None

    def call(self, fn: Callable[[], Any]) -> Any:
        import optuna

        tries = 0
        while True:
            try:
                result = fn()
            except optuna.exceptions.UpdateFinishedTrialError:
                raise
            except Exception as e:
                away = _away(e)
                if away is None:
                    raise
                with self.lock:
                    now = time.monotonic()
                    if self.since is None:
                        self.since = now
                        log.warning(f"study storage {self.where} is away ({type(away).__name__}): the study waits for "
                                    f"it (at most {self.wait_s:.0f} s; XP_STORE_WAIT_S)")
                    elif now - self.since > self.wait_s:
                        raise
                time.sleep(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                tries += 1
                continue
            with self.lock:
                if self.since is not None:
                    log.warning(f"study storage {self.where} is back after {time.monotonic() - self.since:.0f} s: "
                                "the study goes on")
                    self.since = None
            return result


def _riding(inner: Any, state: _State, extra: tuple[type, ...]) -> Any:
    import optuna

    bases = (optuna.storages.BaseStorage, *extra)
    names = {n for b in bases for n in dir(b) if not n.startswith("__") and callable(getattr(b, n))}

    def forward(name: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call(name, args, kwargs)
        call.__name__ = name
        return call

    cls = type("RidingStorage", bases, {**{n: forward(n) for n in names}, "__init__": _init, "_call": _call,
                                        "__getattr__": _getattr})
    return cls(inner, state)


def _init(self: Any, inner: Any, state: _State) -> None:
    self._inner, self._state = inner, state


def _getattr(self: Any, name: str) -> Any:  # what only the inner storage has (RDBStorage's engine, say)
    if name.startswith("_inner"):
        raise AttributeError(name)
    return getattr(self._inner, name)


def _call(self: Any, name: str, args: tuple, kwargs: dict) -> Any:
    import optuna

    method, first = getattr(self._inner, name), [True]

    def once() -> Any:
        try:
            return method(*args, **kwargs)
        except optuna.exceptions.UpdateFinishedTrialError:
            if not first[0] and name == "set_trial_state_values":
                # its first try was committed, its answer lost: the trial is in the state asked for
                return self._inner.get_trial(args[0]).state == args[1]
            raise
        finally:
            first[0] = False

    return self._state.call(once)
