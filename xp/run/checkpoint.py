"""Committed training state: after every epoch rank 0 writes the parameters, the optimizer state,
the epoch and the metrics so far into `checkpoint_dir`; `resume=` continues from there.

A commit is a folder `epoch-<N>` written completely under a temporary name, renamed into place,
and then named in `latest` (replaced atomically): a crash at any moment leaves the previous
commit intact. Elastic training relaunches workers from the latest commit; the backend decides
what its state files are (Backend.save_state / load_state).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xp.run.callbacks import Callback
from xp.errors import ConfigError, XPError

log = logging.getLogger("xp")

MB = 2**20
ROOM_WAIT_S = float(os.environ.get("XP_ROOM_WAIT_S", 60))  # how long a study's trial waits at a commit for room on
# a full disk before it fails (a disk filled for a while by another process costs the study no trial)


class NoSpace(XPError):
    """A commit does not fit on the disk of checkpoint_dir (exit 1; the last good commit stays)."""

    exit_code = 1


@dataclass
class Commit:
    folder: Path  # the backend's state files
    epoch: int  # epochs completed
    history: list[dict[str, float]]  # every completed epoch's metrics
    meta: dict[str, Any]


def latest(root: str | Path) -> Commit | None:
    root = Path(root).expanduser()
    try:
        name = (root / "latest").read_text().strip()
    except OSError:
        return None
    folder = root / name
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"resume={root}: the latest commit {name} cannot be read ({e})") from None
    return Commit(folder, int(meta["epoch"]), list(meta["history"]), meta)


def require(root: str | Path) -> Commit:
    commit = latest(root)
    if commit is None:
        raise ConfigError(f"resume={root}: no committed state there (it is written by checkpoint_dir=...)")
    return commit


def _tmp_prefix() -> str:
    return f".tmp-{socket.gethostname()}-"


def sweep_stale(root: str | Path) -> list[Path]:
    """Remove the temporary commit folders and pointers in `root` that processes of this host left when they
    died mid-commit (their pid is gone); those of living processes and of other hosts stay."""
    import psutil

    removed, host = [], socket.gethostname()
    for p in Path(root).expanduser().glob(".*.tmp-*"):
        rest = p.name.split(".tmp-", 1)[1]
        pid = rest if rest.isdigit() else rest[len(host) + 1:] if rest.startswith(host + "-") else ""  # older: PID
        if not pid.isdigit() or (int(pid) != os.getpid() and psutil.pid_exists(int(pid))):
            continue
        (shutil.rmtree if p.is_dir() else os.remove)(p)
        removed.append(p)
    if removed:
        log.info("checkpoint_dir %s: removed %d unfinished commit(s) of dead processes: %s", root, len(removed),
                 ", ".join(p.name for p in removed))
    return removed


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _no_space(root: Path, need: int, free: int, written: int = 0) -> NoSpace:
    last = (root / "latest").read_text().strip() if (root / "latest").exists() else None
    return NoSpace(f"checkpoint_dir={root}: the disk is full: a commit needs {'about' if need else 'more than'} "
                   f"{max(need, written) / MB:.1f} MB, {free / MB:.1f} MB free; free some space or point "
                   "checkpoint_dir elsewhere"
                   + (f" (the last good commit, {last}, is intact: resume=true continues from it)" if last else ""))


def commit(root: str | Path, epoch: int, history: list[dict[str, float]], save: Callable[[Path], None],
           keep: tuple[int, int] = (2, 0), **meta: Any) -> Path:
    """Write the commit `epoch-<epoch>` completely under a temporary name, then rename it into place and name
    it in `latest`. A commit that fails (a full disk) removes its temporary folder; the previous one stays."""
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{epoch}"
    previous = latest_folder(root)
    need = int(_size(previous) * 1.1) + MB if previous else 0  # about what the last commit took
    free = shutil.disk_usage(root).free
    if need > free:
        raise _no_space(root, need, free)
    tmp = root / f".{name}{_tmp_prefix()}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        save(tmp)
        save_random_state(tmp)
        (tmp / "meta.json").write_text(json.dumps({"epoch": epoch, "history": history, **meta}))
    except BaseException as e:
        written = _size(tmp) if tmp.exists() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or "Write incomplete" in str(e)
        if full:  # MXNet's writer says "FileStream.Write incomplete", Python's says ENOSPC
            raise _no_space(root, need, shutil.disk_usage(root).free, written) from None
        raise
    final = root / name
    shutil.rmtree(final, ignore_errors=True)  # a commit of the same epoch from a rolled-back attempt
    os.replace(tmp, final)
    pointer = root / f".latest{_tmp_prefix()}{os.getpid()}"
    try:
        pointer.write_text(name)
    except OSError as e:
        pointer.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_space(root, 4096, shutil.disk_usage(root).free) from None
        raise
    os.replace(pointer, root / "latest")
    done = sorted((p for p in root.glob("epoch-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    for old in set(done) - kept(done, history, *keep):
        shutil.rmtree(old, ignore_errors=True)
    return final


def kept(done: list[Path], history: list[dict[str, float]], last: int, best: int) -> set[Path]:
    """The commits retention keeps (`done`: epoch-N folders in epoch order): the `last` latest, and the `best` with
    the best val_accuracy after their epoch (in `history`, every completed epoch's metrics)."""
    def score(p: Path) -> float:
        n = int(p.name.split("-")[1])
        return history[n - 1].get("val_accuracy", float("-inf")) if 0 < n <= len(history) else float("-inf")

    return set(done[-last:]) | set(sorted(done, key=score, reverse=True)[:best])


def latest_folder(root: Path) -> Path | None:
    try:
        folder = root / (root / "latest").read_text().strip()
    except OSError:
        return None
    return folder if folder.is_dir() else None


RANDOM_STATE = "random_state.json"  # JSON, not pickle: loading a commit runs no code


def save_random_state(folder: Path) -> None:
    """Python's and NumPy's global generators (a framework's own generators are its backend's business:
    the MXNet backends derive theirs from (seed, rank, step) at every step)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    (folder / RANDOM_STATE).write_text(json.dumps({"python": [version, list(words), gauss],
                                                   "numpy": [kind, np.asarray(keys).tolist(), pos, has_gauss, cached]}))


def restore_random_state(folder: Path) -> None:
    path = folder / RANDOM_STATE
    if path.exists():  # commits written before xp kept them have none
        state = json.loads(path.read_text())
        version, words, gauss = state["python"]
        random.setstate((version, tuple(words), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


TRIAL = "trial.json"  # in a study trial's commit folder once its trial ended: complete or not, its objective


def per_trial(root: str, number: int) -> str:
    """A study's trials commit into their own folders under checkpoint_dir: trial-<number>."""
    return str(Path(root).expanduser() / f"trial-{number}")


def keep_best_trial(root: Path, metric: str, direction: str) -> list[Path]:
    """A study's retention, when one of its trials ends: of the trial folders beside `root` whose trial ended
    (TRIAL written), only the complete one with the best `metric` (its last epoch's) stays; pruned and failed
    trials' go; those of trials still running or killed (a resume needs them) stay. Returns what it removed. Two
    trials ending at once agree: a folder goes only where a better one is kept."""
    ended = {}
    for folder in root.parent.glob("trial-*"):
        try:
            ended[folder] = json.loads((folder / TRIAL).read_text())
        except (OSError, ValueError):
            continue  # running, killed, or removed meanwhile by another trial's end
    complete = [f for f, e in ended.items() if e.get("complete")]
    if any(ended[f].get(metric) is None for f in complete):
        return []  # an objective the epochs do not log (a summary's): nothing to rank them by, all stay
    best = (max if direction == "maximize" else min)(complete, key=lambda f: ended[f][metric]) if complete else None
    gone = [f for f in ended if f != best]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return gone


class Checkpointer(Callback):
    """Rank 0 commits after every epoch, keeping `keep` (the latest N, the best M: kept()). `history()` returns
    every completed epoch's metrics, the epochs before this process started included (place it after the callback
    that records them)."""

    def __init__(self, root: str, save: Callable[[Path], None], history: Callable[[], list], rank: int,
                 every: int = 1, keep: tuple[int, int] = (2, 0), last_epoch: int | None = None,
                 study: tuple[str, str] | None = None):
        """`study`: a study's trial (its objective's metric and direction): when it ends, keep_best_trial()."""
        self.root, self.save, self.history, self.rank = root, save, history, rank
        self.every, self.keep, self.last, self.study = every, keep, last_epoch, study
        self.ended: dict[str, float | None] | bool | None = None  # set when training ends: what TRIAL says
        if rank == 0:  # what a process killed mid-commit left: it would fill the disk again. A study's trial looks
            # in its siblings' folders too: a trial lost with its worker is retried under another number, and its
            # own folder is never opened again (found by benchmarks/chaos.py: a killed trial's half-written commit)
            root_path = Path(root).expanduser()
            for folder in [root_path, *(sorted(root_path.parent.glob("trial-*")) if study is not None else [])]:
                if folder.is_dir():
                    sweep_stale(folder)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.rank == 0 and (epoch % self.every == 0 or epoch == self.last):
            self._room(lambda: commit(self.root, epoch, list(self.history()), self.save, keep=self.keep))

    def _room(self, write: Callable[[], Any]) -> None:
        """write(), which may find the disk full: a study's trial waits for room (ROOM_WAIT_S at most, one line),
        trying again every second; a run fails in one line at once (its last good commit intact). Found by
        benchmarks/chaos.py: a host's checkpoint disk full for 30 s failed every trial that committed there."""
        import time

        deadline, said = time.monotonic() + (ROOM_WAIT_S if self.study is not None else 0.0), False
        while True:
            try:
                write()
                if said:
                    log.warning(f"checkpoint_dir={self.root}: room again; training goes on")
                return
            except (NoSpace, OSError) as e:
                if isinstance(e, OSError) and e.errno not in (errno.ENOSPC, errno.EDQUOT) or \
                        time.monotonic() >= deadline:
                    raise
                if not said:
                    full = str(e) if isinstance(e, NoSpace) else f"checkpoint_dir={self.root}: the disk is full"
                    log.warning(f"{full}: the trial waits for room ({ROOM_WAIT_S:.0f} s at most)")
                    said = True
                time.sleep(1.0)

    def on_train_end(self, history: list[dict[str, float]]) -> None:
        if self.study is not None:  # a complete trial (a pruned one never gets here)
            self.ended = {"complete": True, self.study[0]: history[-1].get(self.study[0]) if history else None}

    def on_end(self) -> None:
        """A study's trial that ended (complete: its value; pruned or failed: none; not interrupted, which a resume
        continues) says so in its folder, and the study's retention runs."""
        if self.study is None or self.rank != 0 or self.ended is False:
            return
        root = Path(self.root).expanduser()
        if root.is_dir():
            self._room(lambda: (root / TRIAL).write_text(json.dumps(self.ended or {"complete": False})))
        keep_best_trial(root, *self.study)

    def on_interrupt(self, where: dict[str, Any] | None) -> None:
        """A spot notice or Ctrl-C during training: rank 0 commits what was trained, mid-epoch position included,
        so `resume=true` goes on from that batch."""
        self.ended = False  # (its folder stays: a resume continues it)
        if self.rank != 0:
            return
        history = list(self.history())
        commit(self.root, len(history), history, self.save, keep=self.keep, position=where)
        log.warning(f"interrupted: committed epoch {len(history)}"
                    + (f" and {where['step']} batches of epoch {where['epoch']}" if where else "")
                    + f" to {self.root}; add resume=true to the same command to continue")


class Restore(Callback):
    """A resumed run draws the random numbers the uninterrupted run drew: the commit's random state comes back
    as training begins."""

    def __init__(self, before: Commit):
        self.before = before

    def on_train_begin(self) -> None:
        restore_random_state(self.before.folder)
