"""Where a study's trials run, decided once and handed down as one object: the launcher's slots (this machine's,
an ssh host list's, a Slurm cluster's allocations) with a long-lived worker each (xp.launching.pool), or, under
a Hydra launcher of a cluster (submitit), that launcher's jobs in batches (no pool).

The command line makes it (`ahead`: before anything is composed, its zygote starts importing what every
trial needs), the composed command decides it (`decide`: the launcher known, its slots checked, their workers
started while the study opens its stores), and the study's sweeper, which Hydra instantiates, takes it from
there (`current`) and asks it for its pool (`pool`)."""

from __future__ import annotations

import contextvars
import logging
import os
from typing import Any

from xp.launching import hydra_launchers
from xp.launching.pool import Pool
from xp.launching.zygote import Zygote
from xp.launching.trialworker import SLOT_ENV

log = logging.getLogger("xp")

_current: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("xp_placement", default=None)


class Placement:
    def __init__(self, zygote: Zygote | None = None):
        self.launcher: Any = None  # the study's launcher (None: this machine's)
        self.zygote = zygote  # forks this machine's workers (xp.launching.zygote), started before any slot is known
        self.early: Pool | None = None  # the workers started for the slots `decide` saw

    @classmethod
    def ahead(cls) -> Placement:
        """A study command, before anything is composed: its zygote starts now, so its imports overlap all that
        follows (Hydra's own import among it). A study placed elsewhere ends it in `decide`."""
        return cls(Zygote.start({k: v for k, v in os.environ.items() if k != SLOT_ENV}))

    def decide(self, config: dict[str, Any], argv: list[str], launcher: Any, uri: str) -> None:
        """The composed command's placement: its launcher's slots checked (launcher=ssh: every host answers, the
        tracking store `uri` is one they reach), then their workers started, to import their frameworks while this
        process opens its stores and its study."""
        self.launcher = launcher
        node = config.get("sweep")
        on_slots = bool(node) and node.get("scheduler", "slots") == "slots"
        on_slots = on_slots and hydra_launchers.runs_jobs_here(argv)  # (a cluster's Hydra launcher: its jobs)
        remote = launcher is not None and launcher.remote
        if self.zygote is not None and (remote or not on_slots):
            self.zygote.close()  # no slot of this machine will have a worker
            self.zygote = None
        if not on_slots:
            return
        if remote:
            launcher.check_study(uri)
        if not uri.startswith(("sqlite:", "http:", "https:")):
            return  # a new database's schema (PostgreSQL) has no creation lock: the workers open it after this process
        slots = self._slots(config, node.get("parallel"), node.get("trials_per_gpu") or 1)
        trials = node.get("n_trials")  # no more workers than the study can have trials (pool() trims to those left)
        self.early = self._pool(config, slots[:max(1, trials)] if isinstance(trials, int) else slots, uri).spawn()

    def pool(self, config: Any, spec: Any, parallel: int | None, trials: int) -> Pool | None:
        """The pool of a study whose trials run on slots: this machine's, or its launcher's, no more of them than
        the study has `trials` left to run, its placement printed; the workers started early if they are for those
        slots. None for a cluster's Hydra launcher (submitit: the trials are its jobs)."""
        if not hydra_launchers.runs_here(str(config.hydra.launcher.get("_target_", ""))):
            return None
        from xp.tracking.stores import resolve_uri

        offered = self._slots(config, parallel, spec.trials_per_gpu)
        slots = offered[:max(1, trials)]
        log.info(f"study: {len(slots)} slot{'s' if len(slots) > 1 else ''}, a worker each"
                 + (f" (of {len(offered)}: {trials} trials to run)" if len(slots) < len(offered) else "") + ": "
                 + "; ".join(s.describe() for s in slots))
        uri, early = resolve_uri(config.get("tracking_uri")), self.early
        self.early = None
        if early is not None and (early.slots[:len(slots)], early.backend, early.tracking_uri) == (
                slots, _backend(config), uri):
            return early.trim(len(slots))
        if early is not None:  # started for other slots: not this study's
            early.discard()
        return self._pool(config, slots, uri)

    def discard(self) -> None:
        """The workers started ahead that no study took (done already, or stopped before its trials)."""
        if self.early is not None:
            self.early.discard()
            self.early = None
        if self.zygote is not None:  # after the pools' workers: it waits for them
            self.zygote.close()
            self.zygote = None

    def __enter__(self) -> Placement:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.reset(self._token)
        self.discard()

    @staticmethod
    def current() -> Placement:
        """The placement the command made (one of this machine's slots, if it made none)."""
        return _current.get() or Placement()

    def _slots(self, config: Any, parallel: int | None, trials_per_gpu: int) -> list[Any]:
        from xp.launching.launcher import Local

        return (self.launcher or Local()).slots(int(config.get("gpus") or 0), parallel, trials_per_gpu)

    def _pool(self, config: Any, slots: list[Any], uri: str) -> Pool:
        return Pool(slots, backend=_backend(config), tracking_uri=uri, launcher=self.launcher, zygote=self.zygote)


def _backend(config: Any) -> str | None:
    """The backend a study's trials use (its workers import its frameworks before their first trial)."""
    return (config.get("backend") or {}).get("name")
