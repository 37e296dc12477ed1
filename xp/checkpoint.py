"""Committed training state: after every epoch rank 0 writes the parameters, the optimizer state,
the epoch and the metrics so far into `checkpoint_dir`; `resume=` continues from there.

A commit is a folder `epoch-<N>` written completely under a temporary name, renamed into place,
and then named in `latest` (replaced atomically): a crash at any moment leaves the previous
commit intact. Elastic training relaunches workers from the latest commit; the backend decides
what its state files are (Backend.save_state / load_state).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xp.callbacks import Callback
from xp.errors import ConfigError

log = logging.getLogger("xp")



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
           keep: int = 2, **meta: Any) -> Path:
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{epoch}"
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save(tmp)
    save_random_state(tmp)
    (tmp / "meta.json").write_text(json.dumps({"epoch": epoch, "history": history, **meta}))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)  # a commit of the same epoch from a rolled-back attempt
    os.replace(tmp, final)
    pointer = root / f".latest.tmp-{os.getpid()}"
    pointer.write_text(name)
    os.replace(pointer, root / "latest")
    done = sorted((p for p in root.glob("epoch-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


RANDOM_STATE = "random_state.json"  # JSON, not pickle: loading a commit runs no code


def save_random_state(folder: Path) -> None:
    """Python's and NumPy's global generators (a framework's own generators are its backend's business:
    the MXNet backends derive theirs from (seed, rank, step) at every step)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    (folder / RANDOM_STATE).write_text(json.dumps({"python": [version, list(words), gauss],
                                                   "numpy": [kind, keys.tolist(), pos, has_gauss, cached]}))


def restore_random_state(folder: Path) -> None:
    path = folder / RANDOM_STATE
    if path.exists():  # commits written before xp kept them have none
        state = json.loads(path.read_text())
        version, words, gauss = state["python"]
        random.setstate((version, tuple(words), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


class Checkpointer(Callback):
    """Rank 0 commits after every epoch. `history()` returns every completed epoch's metrics, the
    epochs before this process started included (place it after the callback that records them)."""

    def __init__(self, root: str, save: Callable[[Path], None], history: Callable[[], list], rank: int,
                 every: int = 1, keep: int = 2, last_epoch: int | None = None):
        self.root, self.save, self.history, self.rank = root, save, history, rank
        self.every, self.keep, self.last = every, keep, last_epoch

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.rank == 0 and (epoch % self.every == 0 or epoch == self.last):
            commit(self.root, epoch, list(self.history()), self.save, keep=self.keep)


def resolve_resume(config: dict[str, Any], uri: str) -> tuple[dict[str, Any], str | None]:
    """resume=true | RUN_ID | FOLDER -> (the config resuming from the folder, the MLflow run to continue).

    true: the latest run of the experiment that did not finish and committed a state (runs left
    RUNNING by a dead process are ended FAILED first); RUN_ID: that run. Both continue the same run
    (run the same command again, adding resume=...). A folder starts a new run from its commit.
    """
    import re

    from xp.tracking import Tracker

    value = config.get("resume")
    if value is True or str(value).lower() == "true" or re.fullmatch(r"[0-9a-f]{32}", str(value)):
        tracker = Tracker(uri, config.get("experiment") or "xp", "")
        try:
            tracker.experiment_id = tracker._experiment_id()
            tracker.end_orphans()
            if value is True or str(value).lower() == "true":
                runs = tracker.client.search_runs(
                    [tracker.experiment_id], "attributes.status != 'FINISHED' and attributes.status != 'RUNNING'",
                    order_by=["attributes.start_time DESC"], max_results=200)
                runs = [r for r in runs if r.data.params.get("checkpoint_dir") not in (None, "None")]
                if not runs:
                    raise ConfigError("resume=true: no interrupted run with a checkpoint_dir in experiment "
                                      f"{config.get('experiment') or 'xp'}")
                run = runs[0]
            else:
                run = tracker.client.get_run(str(value))
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"resume={value}: cannot find that run ({type(e).__name__})") from None
        if run.info.status == "RUNNING":
            raise ConfigError(f"resume={value}: run {run.info.run_id} is still running")
        folder = run.data.params.get("checkpoint_dir")
        if run.info.status == "FINISHED":  # its summary is logged: more epochs are a new run
            raise ConfigError(f"resume={value}: run {run.info.run_id} finished; to train on from its last commit "
                              f"start a new run from its folder: resume={folder}")
        if folder in (None, "None"):
            raise ConfigError(f"resume={value}: run {run.info.run_id} committed no state (it had no checkpoint_dir)")
        require(folder)
        return {**config, "resume": folder, "checkpoint_dir": folder}, run.info.run_id
    require(value)
    return config, None


def commit_interrupted(plan: Any, backend: Any, history: list[dict[str, float]]) -> None:
    """A spot notice or Ctrl-C during training: rank 0 commits what was trained, mid-epoch position included,
    so `resume=true` goes on from that batch."""
    if not plan.checkpoint_dir or plan.rank != 0:
        return
    where = backend.partial()
    commit(plan.checkpoint_dir, len(history), history, backend.save_state, keep=plan.checkpoint_keep, position=where)
    log.warning(f"interrupted: committed epoch {len(history)}"
                + (f" and {where['step']} batches of epoch {where['epoch']}" if where else "")
                + f" to {plan.checkpoint_dir}; add resume=true to the same command to continue")
