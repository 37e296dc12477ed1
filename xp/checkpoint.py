"""Committed training state: after every epoch rank 0 writes the parameters, the optimizer state,
the epoch and the metrics so far into `checkpoint_dir`; `resume=` continues from there.

A commit is a folder `epoch-<N>` written completely under a temporary name, renamed into place,
and then named in `latest` (replaced atomically): a crash at any moment leaves the previous
commit intact. Elastic training relaunches workers from the latest commit; the backend decides
what its state files are (Backend.save_state / load_state).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from xp.callbacks import Callback
from xp.errors import ConfigError

KEEP = 2  # commits kept: the latest and the one before


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


def commit(root: str | Path, epoch: int, history: list[dict[str, float]], save: Callable[[Path], None],
           **meta: Any) -> Path:
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{epoch}"
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save(tmp)
    (tmp / "meta.json").write_text(json.dumps({"epoch": epoch, "history": history, **meta}))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)  # a commit of the same epoch from a rolled-back attempt
    os.replace(tmp, final)
    pointer = root / f".latest.tmp-{os.getpid()}"
    pointer.write_text(name)
    os.replace(pointer, root / "latest")
    done = sorted((p for p in root.glob("epoch-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    for old in done[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


class Checkpointer(Callback):
    """Rank 0 commits after every epoch. `history()` returns every completed epoch's metrics, the
    epochs before this process started included (place it after the callback that records them)."""

    def __init__(self, root: str, save: Callable[[Path], None], history: Callable[[], list], rank: int,
                 **meta: Any):
        self.root, self.save, self.history, self.rank, self.meta = root, save, history, rank, meta

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.rank == 0:
            commit(self.root, epoch, list(self.history()), self.save, **self.meta)
