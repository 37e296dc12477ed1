"""This machine's study workers forked from one warm process (the zygote), both ends of it.

A study command starts the zygote first (xp.launching.placement): a trial worker process that imports what
does not depend on a slot (MLflow, Hydra, xp's run: 2-3 s of CPU) while the command composes its study, then
forks a worker for each of this machine's slots as the pool asks (`Zygote.fork`: the slot's variables), each of
which calls the pool back with its slot's secret, as a worker on another host does, pins itself to its slot
and imports its frameworks (never imported in the zygote: their thread pools and devices follow the slot). So
16 workers cost one import instead of 16 (on 2 cores, 16 imports side by side held a 1,000-trial study's
first trial back 15-20 s) and share the zygote's memory. The zygote reaps its workers and says when each ended
(Exited), which is how the pool learns it (`Forked`, the handle it keeps); it ignores Ctrl-C (its workers'
trials take it) and leaves when told, once its workers have, or when the command is gone.
"""

from __future__ import annotations

import gc
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from xp.interrupts import CTRL_C_ONCE_HANDLED
from xp.studies.channel import Channel, Exit, Exited, Forked
from xp.studies.channel import Fork

CTRL_C_ENV = "XP_SLOT_CTRL_C"  # "1": the worker handles Ctrl-C, which its shell ignored while it started
LEAVE_S = 30.0  # how long a zygote told to leave waits for its workers before it goes (they die with it)


def local_worker(env: dict[str, str], *label: str) -> tuple[subprocess.Popen, Channel]:
    """A worker process on this machine (or, without a slot in `env`, the zygote: `label` zygote, which ps shows,
    and its forked workers too), and this end of its channel. Where the study handles Ctrl-C, the worker shares
    it (its trial's run ends KILLED), once it handles it (CTRL_C_ENV): until then its shell ignores it (a Ctrl-C
    lost there is the study's stop, whose SIGTERM ends the worker)."""
    ours, theirs = socket.socketpair()
    argv = [sys.executable, "-m", "xp.launching.trialworker", str(theirs.fileno()), *label]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        argv, env = ["/bin/sh", "-c", f'{CTRL_C_ONCE_HANDLED} "$@"', "sh", *argv], {**env, CTRL_C_ENV: "1"}
    proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
    theirs.close()
    return proc, Channel(ours)


class Zygote:
    """The command's end: asks for workers (fork), follows their ends."""

    def __init__(self, proc: subprocess.Popen, channel: Channel, env: dict[str, str]):
        self.proc, self.channel, self.env = proc, channel, env
        self.waiting: queue.SimpleQueue[ForkedWorker] = queue.SimpleQueue()  # asked for, pid not yet known: in order
        self.exits: dict[int, int] = {}
        self.forked = 0  # workers asked for
        self.gone = False
        self.changed = threading.Condition()
        threading.Thread(target=self._read, name="xp-zygote", daemon=True).start()

    @classmethod
    def start(cls, env: dict[str, str]) -> Zygote:
        return cls(*local_worker(env, "zygote"), env)

    def fork(self, variables: dict[str, str]) -> ForkedWorker:
        """A worker with the slot's `variables` and what changed in this process's environment since the zygote
        started; its handle. It calls back as a remote worker does."""
        env = {**{k: v for k, v in os.environ.items() if self.env.get(k) != v}, **variables}
        handle = ForkedWorker(self)
        self.forked += 1
        with self.changed:
            self.waiting.put(handle)
            try:
                self.channel.send(Fork(env, [k for k in self.env if k not in os.environ], os.getcwd()))
            except OSError:  # it is gone: so is this worker (the pool's wait for its call says so in one line)
                self.gone = True
        return handle

    def _read(self) -> None:
        try:
            while (msg := self.channel.recv()) is not None:
                with self.changed:
                    if isinstance(msg, Forked):
                        self.waiting.get_nowait().pid = msg.pid
                    elif isinstance(msg, Exited):
                        self.exits[msg.pid] = msg.code
                    self.changed.notify_all()
        except (OSError, ValueError):
            pass
        with self.changed:
            self.gone = True  # and with it its workers (they die with their parent)
            self.changed.notify_all()

    def returncode(self, handle: ForkedWorker) -> int | None:
        with self.changed:
            return self.exits.get(handle.pid, -signal.SIGKILL if self.gone else None)

    def wait(self, handle: ForkedWorker, timeout: float | None, forked: bool = False) -> int | None:
        """Wait at most `timeout` s for the worker's end (`forked`: only for its pid); its exit code, if it ended."""
        with self.changed:
            self.changed.wait_for(lambda: (handle.pid if forked else handle.pid in self.exits) or self.gone, timeout)
        return self.returncode(handle)

    def close(self) -> None:
        """Its workers ended (or were told to): it leaves once they have gone. One that forked none (a study
        placed elsewhere) holds nothing: it ends at once, even in the middle of its imports."""
        try:
            self.channel.send(Exit())
        except OSError:
            pass
        try:
            self.proc.wait(timeout=LEAVE_S + 5 if self.forked else 0.1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.channel.close()


class ForkedWorker:
    """A forked worker's handle, as a Popen's (poll, wait, terminate, kill): its pid once the zygote said it, its
    exit code once it said that (or was gone: its workers die with it)."""

    def __init__(self, zygote: Zygote):
        self.zygote, self.pid = zygote, 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self.zygote.returncode(self)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self.zygote.wait(self, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self.pid:  # asked for a moment ago: signalled once it exists
            self.zygote.wait(self, 10.0, forked=True)
        if self.pid and self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"pid {self.pid}"


def serve(channel: Channel) -> None:
    """The zygote's own loop: a worker forked for each Fork message, its pid said (Forked) and, once reaped, its
    exit code (Exited). Returns only in a forked worker (its slot's variables applied, its signals as they were:
    the caller goes on as a worker that connects back); the zygote itself ends here."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in handlers:
        signal.signal(s, signal.SIG_IGN)
    gc.freeze()  # the imports' objects stay shared with the workers: no collection writes to their pages
    children: set[int] = set()
    leave_by: float | None = None
    while leave_by is None or (children and time.monotonic() < leave_by):
        msg = _next(channel) if leave_by is None else None
        if leave_by is not None:
            time.sleep(0.2)  # the last workers' ends, awaited
        if isinstance(msg, Fork):
            pid = os.fork()
            if pid == 0:
                return _become_worker(channel, msg, handlers)
            children.add(pid)
            _say(channel, Forked(pid))
        elif isinstance(msg, Exit):
            leave_by = time.monotonic() + LEAVE_S
        children -= _reap(channel)
    os._exit(0)


def _next(channel: Channel) -> Any:
    """The command's next message within 0.2 s (None: none came); Exit when the command is gone."""
    try:
        msg = channel.recv(timeout=0.2)
    except TimeoutError:
        return None
    except (OSError, ValueError):
        return Exit()
    return Exit() if msg is None else msg


def _become_worker(channel: Channel, slot: Fork, handlers: dict[signal.Signals, Any]) -> None:
    from xp.run.worker import die_with_parent

    channel.sock.close()
    for s, handler in handlers.items():
        signal.signal(s, handler)
    die_with_parent()  # (cleared by fork) the zygote's end is its workers'
    os.environ.update(slot.env)
    for k in slot.unset:
        os.environ.pop(k, None)
    os.chdir(slot.cwd)


def _reap(channel: Channel) -> set[int]:
    ended: set[int] = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)
        _say(channel, Exited(pid, os.waitstatus_to_exitcode(status)))


def _say(channel: Channel, msg: Any) -> None:
    try:
        channel.send(msg)
    except OSError:  # the command is gone: its workers follow (their channels end), then the zygote
        pass

