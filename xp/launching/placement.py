"""Where a study's trials run, chosen once (`choose`) and handed down as one object: `OnSlots`, the launcher's
slots (this machine's, an ssh host list's, a Slurm cluster's allocations, a Ray cluster's nodes) with a long-lived
worker each (xp.launching.pool), or `InBatches`, a Hydra launcher's jobs (hydra/launcher=submitit_*, or
sweep.scheduler=hydra), so many at a time.

The command line makes the placement (`with_zygote`: before anything is composed, its zygote starts importing
what every trial needs), the composed command chooses it (`decide`: the launcher known, its slots checked by the
launcher, their workers started while the study opens its stores), and the study's sweeper, which Hydra
instantiates, takes it from there (`current`, `chosen`) and asks it for its pool (`pool`)."""

from __future__ import annotations

import contextvars
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xp.launching import hydra_launchers
from xp.launching.pool import Pool
from xp.launching.zygote import Zygote
from xp.launching.trialworker import SLOT_ENV

if TYPE_CHECKING:
    from xp.launching.launcher import Launcher
    from xp.launching.slots import Slot
    from xp.studies.study import StudySpec

log = logging.getLogger("xp")

_current: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("xp_placement", default=None)


@dataclass(frozen=True)
class OnSlots:
    """A study's trials kept in flight on its launcher's slots (None: this machine's), a worker each: `parallel`
    of them (None: one per slot the launcher offers), trials of `gpus` GPUs, `trials_per_gpu` to a GPU."""
    launcher: Launcher | None
    gpus: int
    parallel: int | None
    trials_per_gpu: int

    def slots(self) -> list[Slot]:
        """The slots the launcher offers (one line, ConfigError, when it cannot place them)."""
        from xp.launching.launcher import Local

        return (self.launcher or Local()).slots(self.gpus, self.parallel, self.trials_per_gpu)


@dataclass(frozen=True)
class InBatches:
    """A study's trials as a Hydra launcher's jobs, `parallel` at a time (None: one)."""
    parallel: int | None


def choose(spec: StudySpec, hydra_launcher: str, launcher: Launcher | None, gpus: int) -> OnSlots | InBatches:
    """The one decision where a study's trials run, from its spec (xp.studies.study.StudySpec: sweep.scheduler,
    sweep.parallel, sweep.trials_per_gpu), the Hydra launcher's name ("": Hydra's default) and xp's launcher: on
    slots unless the study asks for Hydra's batches or its Hydra launcher runs its jobs elsewhere (a cluster's)."""
    if spec.scheduler == "slots" and hydra_launchers.runs_jobs_here(hydra_launcher):
        return OnSlots(launcher, gpus, spec.parallel, spec.trials_per_gpu)
    return InBatches(spec.parallel)


class Placement:
    def __init__(self, zygote: Zygote | None = None):
        self.choice: OnSlots | InBatches | None = None  # where the study's trials run (None: not chosen yet)
        self.spec: StudySpec | None = None  # the study's, as the command line's preflight read it (decide)
        self.offered: list[Slot] | None = None  # the slots the launcher offered (decide), asked once
        self.zygote = zygote  # forks this machine's workers (xp.launching.zygote), started before any slot is known
        self.started: Pool | None = None  # the workers started for the slots `decide` saw

    @classmethod
    def with_zygote(cls) -> Placement:
        """A study command, before anything is composed: its zygote starts now, so its imports overlap all that
        follows (Hydra's own import among it). A study placed elsewhere ends it in `decide`."""
        return cls(Zygote.start({k: v for k, v in os.environ.items() if k != SLOT_ENV}))

    def decide(self, config: dict[str, Any], choice: OnSlots | InBatches, spec: StudySpec, uri: str) -> None:
        """The composed command's placement, `choice` (`choose`) for the study `spec`; on slots, the launcher's
        checked (launcher=ssh: every host answers, the tracking store `uri` is one they reach; this machine's: it
        can place them), then workers started for the first of them (no more than the study's trials), to import
        their frameworks while this process opens its stores and its study."""
        self.choice, self.spec = choice, spec
        launcher = choice.launcher if isinstance(choice, OnSlots) else None
        remote = launcher is not None and launcher.remote
        if self.zygote is not None and (remote or not isinstance(choice, OnSlots)):
            self.zygote.close()  # no slot of this machine will have a worker
            self.zygote = None
        if not isinstance(choice, OnSlots):
            return
        if launcher is not None and remote:
            launcher.check_study(uri)
        self.offered = slots = choice.slots()
        if not uri.startswith(("sqlite:", "http:", "https:")):
            return  # a new database's schema (PostgreSQL) has no creation lock: the workers open it after this process
        # no more workers than the study can have trials (pool() trims to those left)
        self.started = self._pool(config, slots[:max(1, spec.n_trials)], uri).spawn()

    def chosen(self, config: Any, spec: Any) -> OnSlots | InBatches:
        """Where the study's trials run: as `decide` chose, or (a command whose config tree xp did not compose:
        --config-path) chosen now from the study's composed config, on this machine's slots."""
        if self.choice is None:
            self.choice = choose(spec, config.hydra.runtime.choices.get("hydra/launcher") or "", None,
                                 int(config.get("gpus") or 0))
        return self.choice

    def pool(self, config: Any, trials: int) -> Pool | None:
        """The pool of a study whose trials run on slots, no more of them than the study has `trials` left to run,
        its placement printed; the workers started early if they are for those slots. None: the study's trials
        are a Hydra launcher's jobs (InBatches)."""
        from xp.tracking.stores import resolve_uri

        if not isinstance(self.choice, OnSlots):
            return None
        offered = self.offered if self.offered is not None else self.choice.slots()
        slots = offered[:max(1, trials)]
        log.info(f"study: {len(slots)} slot{'s' if len(slots) > 1 else ''}, a worker each"
                 + (f" (of {len(offered)}: {trials} trials to run)" if len(slots) < len(offered) else "") + ": "
                 + "; ".join(s.describe() for s in slots))
        uri, started = resolve_uri(config.get("tracking_uri")), self.started
        self.started = None
        if started is not None and (started.slots[:len(slots)], started.backend, started.tracking_uri) == (
                slots, _backend(config), uri):
            return started.trim(len(slots))
        if started is not None:  # started for other slots: not this study's
            started.discard()
        return self._pool(config, slots, uri)

    def discard(self) -> None:
        """The workers started ahead that no study took (done already, or stopped before its trials)."""
        if self.started is not None:
            self.started.discard()
            self.started = None
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
        """The placement the command made (a new one, to be chosen, if it made none)."""
        return _current.get() or Placement()

    def _pool(self, config: Any, slots: list[Any], uri: str) -> Pool:
        launcher = self.choice.launcher if isinstance(self.choice, OnSlots) else None
        return Pool(slots, backend=_backend(config), tracking_uri=uri, launcher=launcher, zygote=self.zygote)


def _backend(config: Any) -> str | None:
    """The backend a study's trials use (its workers import its frameworks before their first trial)."""
    return (config.get("backend") or {}).get("name")
