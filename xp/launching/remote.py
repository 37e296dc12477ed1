"""The host side of a job launched over ssh: `python -m xp.launching.remote probe|run|reap`.

- `probe`: what the launcher checks before anything starts: this host's name, Python and interfaces (JSON).
- `run`: read one line of JSON from stdin ({"argv": [...], "env": {...}}: what to run, and the launcher's
  variables, kept off any command line), run argv in its own process group, and end that group when the
  launcher goes away (the ssh session's stdin closes: the launcher ended the job, died, or lost the host) or
  on SIGTERM/SIGHUP. Exits with argv's exit code (128+N for a signal N, as a shell does). `run --spec FILE`
  (a batch job): the JSON from FILE, removed once read; the job ends when its batch system ends it.
- `state PID...`: each process's state letter (T: stopped), to name which worker of a stalled job stalled.
- `reap JOB`: end every process of this host that carries XP_JOB=JOB in its environment (the launcher's job
  id: every process the job started here, also those a runner such as horovodrun started itself), and print
  what was ended. Only processes whose environment this user can read; never this process.

Imports only the standard library: it runs before anything else is known to work on the host.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import cast

JOB_ENV = "XP_JOB"
GRACE_S = 5.0  # what argv gets between SIGTERM and SIGKILL when the job ends


def probe() -> int:
    addresses: dict[str, list[str]] = {}
    for _, name in socket.if_nameindex():
        addresses[name] = []
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            addresses[name] = [a.address for a in addrs if a.family == socket.AF_INET]
    except ImportError:
        pass
    try:
        socket.gethostbyname(socket.gethostname())
        resolves = True
    except OSError:
        resolves = False
    print(json.dumps({"hostname": socket.gethostname(), "python": sys.version.split()[0],
                      "interfaces": addresses, "resolves": resolves}))
    return 0


def _spec(spec_file: str | None) -> dict:
    if spec_file:  # a batch job (a study's worker as a Slurm job): its spec in a file only its user reads, gone once read
        with open(spec_file, "rb") as f:
            spec = json.loads(f.read() or b"{}")
        os.unlink(spec_file)
    else:
        spec = json.loads(sys.stdin.buffer.readline() or b"{}")
    if not spec.get("argv"):
        print("xp.launching.remote run: expected a line of JSON on stdin: {\"argv\": [...], \"env\": {...}}", file=sys.stderr)
        os._exit(2)
    return spec


class _Group:
    """argv's process group, ended once: on a signal to this process, or when the launcher goes away."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None  # once started
        self.signalled = threading.Event()
        self._ending = threading.Lock()

    def end(self) -> None:
        """SIGTERM to the group, SIGKILL after a grace. On a thread: the main thread reaps argv meanwhile (a signal
        handler that waited for it itself, inside the main thread's wait, could not: it waited out the grace and
        killed a child that was ending cleanly)."""
        if self.proc is None or not self._ending.acquire(blocking=False):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=GRACE_S)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self, *_: object) -> None:
        if not self.signalled.is_set():
            self.signalled.set()
            threading.Thread(target=self.end, daemon=True).start()

    def watch_stdin(self) -> None:
        try:
            while cast(io.BufferedReader, sys.stdin.buffer).read1(1024):
                pass
        except (OSError, ValueError):
            pass
        self.end()  # the launcher is gone: so is the job


def run(spec_file: str | None = None) -> None:
    spec = _spec(spec_file)
    group = _Group()
    # Handled before argv starts, so that a signal is never lost in between. Ctrl-C came ignored until here
    # (hosts.start_there's shell traps it: a Ctrl-C during this interpreter's start would have been a traceback);
    # argv gets SIGINT's default back, as a handler, unlike an ignored signal, does not pass through exec.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, group.stop)
    if group.signalled.is_set():
        os._exit(143)
    group.proc = child = subprocess.Popen(spec["argv"], env={**os.environ, **spec.get("env", {})},
                                          start_new_session=True, stdin=subprocess.DEVNULL)
    if group.signalled.is_set():  # a signal while argv started: its handler found no process to end
        group.end()
    if not spec_file:  # a batch job ends when its batch system ends it (SIGTERM)
        threading.Thread(target=group.watch_stdin, daemon=True).start()
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)  # whatever it left in its group
    except ProcessLookupError:
        pass
    sys.stdout.flush()
    # at once: the thread reading stdin must not hold up the exit
    os._exit(143 if group.signalled.is_set() else 128 - code if code < 0 else code)


def reap(job: str) -> int:
    marker = f"{JOB_ENV}={job}".encode()
    me = os.getpid()

    def mine() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (me, os.getppid()):
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found

    ended = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = mine()
        for pid in pids:
            try:
                os.kill(pid, sig)
                ended.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = mine()
        if not pids:
            break
    print(json.dumps({"ended": sorted(set(ended)), "left": mine()}))
    return 0


def state(pids: list[str]) -> int:
    """Each pid's state letter as /proc tells it (T: stopped), or "gone"."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{int(pid)}/stat") as f:
                out[pid] = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            out[pid] = "gone"
    print(json.dumps(out))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        return probe()
    if argv[:1] == ["state"]:
        return state(argv[1:])
    if argv[:1] == ["reap"] and len(argv) == 2:
        return reap(argv[1])
    if argv == ["run"] or (argv[:2] == ["run", "--spec"] and len(argv) == 3):
        run(argv[2] if len(argv) == 3 else None)
    print("usage: python -m xp.launching.remote probe | run [--spec FILE] | state PID... | reap JOB", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
