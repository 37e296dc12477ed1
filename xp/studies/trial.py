"""A study's Optuna side: its storage, sampler and pruner, heartbeats and retries of lost trials, and a run
that is one of its trials (attach, TrialReporter). Optuna is imported lazily: a plain experiment needs none."""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from xp.errors import ConfigError, one_line, redact
from xp.states import INTERRUPTED, VOID, TrialState
from xp.storefiles import first_use
from xp.storefiles import optuna_schema
from xp.studies.study import FINISHED, StudySpec, spec_from

log = logging.getLogger("xp")

SCHEDULER_ATTR = "xp.scheduler"  # a trial's user attribute: host:pid:start of the scheduler running it
DUPLICATE = "duplicate_of"  # user attribute of a proposal dropped because a trial in flight has its parameters


class TrialPruned(Exception):
    """Raised inside a run when the pruner stops the trial."""


def distributions(spec: StudySpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for p in spec.params:
        if p.kind == "categorical":
            out[p.name] = CategoricalDistribution(list(p.choices))
        elif p.kind == "int":
            low, high = p.bounds
            out[p.name] = IntDistribution(int(low), int(high), log=p.log)
        else:
            low, high = p.bounds
            out[p.name] = FloatDistribution(float(low), float(high), log=p.log)
    return out


def trial_seed(spec: StudySpec, number: int) -> int | None:
    """The sampler's seed for the study's proposal `number` (proposal_number): derived from (sampler_seed, number),
    None when the spec asks for a random sampler. (Optuna cannot store a sampler's random state in the study: its
    state is this number and the study's trials, both in the storage.)"""
    if spec.sampler_seed is None:
        return None
    import zlib

    return zlib.crc32(f"{spec.sampler_seed}:{number}".encode())


def replay(trial: Any) -> bool:
    """A trial that runs parameters given to it, not the sampler's: queued (enqueue_trial: a grid, a population,
    a confirmation, a warm start), a lost trial's retry, or a trial given back at a stop and queued again. Each is
    marked so from its creation."""
    return "fixed_params" in trial.system_attrs or "failed_trial" in trial.system_attrs or \
        "interrupted_from" in trial.user_attrs


def proposal_number(study: Any, trial: Any) -> int:
    """Which of the study's sampler proposals `trial` is: its number less the replays numbered below it. A study
    stopped at any moment and run again (its lost and given-back trials retried as replays) proposes the same
    parameters in the same order as the same study never interrupted, with one slot (each proposal then sees the
    same finished trials; a trial whose command was killed while its parameters were drawn is no proposal: VOID);
    proposals are distinct numbers, so sweepers that ask together on one study never draw from the same seed, and
    a resumed study goes on instead of replaying its first proposals."""
    return trial.number - sum(1 for t in study.get_trials(deepcopy=False)
                              if t.number < trial.number and (replay(t) or VOID in t.user_attrs))


def make_sampler(spec: StudySpec) -> Any:
    """The spec's sampler, reseeded for every trial by its proposal number (trial_seed, proposal_number)."""
    import optuna

    factories = {"tpe": lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True),
                 # grid: run_study enqueues every combination (Optuna's GridSampler calls study.stop() when the
                 # grid is exhausted, which only works inside study.optimize(), not with ask-and-tell)
                 "grid": lambda seed: optuna.samplers.RandomSampler(seed=seed),
                 "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
                 "gp": lambda seed: optuna.samplers.GPSampler(seed=seed),
                 "nsga2": lambda seed: optuna.samplers.NSGAIISampler(seed=seed),
                 "cmaes": lambda seed: optuna.samplers.CmaEsSampler(seed=seed)}
    make = factories[spec.sampler]

    class PerTrialSeed(optuna.samplers.BaseSampler):
        """Delegates to a sampler made afresh for each trial, seeded by its proposal number. The samplers keep what they
        learn in the study (its trials, their system attributes), so nothing is lost by making them anew."""

        def __init__(self):
            self.inner = make(trial_seed(spec, 0))

        def before_trial(self, study, trial):
            # who asked, the moment the trial exists (a command killed while it samples leaves no unmarked
            # RUNNING trial, which no later command could tell from another sweeper's: orphaned() finds it)
            study._storage.set_trial_user_attr(trial._trial_id, SCHEDULER_ATTR, scheduler_mark())
            kept = getattr(self.inner, "_search_space", None)  # TPE's search space so far, kept: made afresh, it
            self.inner = make(trial_seed(spec, proposal_number(study, trial)))  # reads every trial again at each ask
            if kept is not None and hasattr(self.inner, "_search_space"):
                self.inner._search_space = kept
            self.inner.before_trial(study, trial)

        def infer_relative_search_space(self, study, trial):
            return self.inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            return self.inner.sample_relative(study, trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self.inner.sample_independent(study, trial, param_name, param_distribution)

        def after_trial(self, study, trial, state, values):
            self.inner.after_trial(study, trial, state, values)

        def reseed_rng(self):
            self.inner.reseed_rng()

    return PerTrialSeed()


def make_pruner(spec: StudySpec) -> Any:
    import optuna

    o = spec.pruner_options
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=o.get("n_startup_trials", 3),
                                           n_warmup_steps=o.get("n_warmup_steps", 2))
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=o.get("min_resource", 1),
                                              reduction_factor=o.get("reduction_factor", 3))
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=o.get("min_resource", 1))
    return optuna.pruners.NopPruner()


JOURNAL = "journal:///"  # sweep.storage=journal:///PATH: Optuna's JournalStorage on a file (no database)


def check_storage(url: str) -> None:
    """Connect once, before anything is created: an unreachable database is a usage error."""
    if url.startswith(JOURNAL):
        try:
            open(journal_path(url), "ab").close()
        except OSError as e:
            raise ConfigError(f"sweep.storage={url}: cannot write it ({e.strerror})") from None
        return
    from xp.tracking.stores import check_database

    check_database(url, "storage")


def journal_path(url: str) -> str:
    return url[len(JOURNAL) - 1:]  # journal:///PATH -> /PATH


def storage_of(url: str, spec: StudySpec | None = None) -> Any:
    """The Optuna storage of `url`: a journal file's, or a database's (with `spec`, the heartbeats that let a
    later sweeper retry the trials of a dead one; a journal keeps none: xp.scheduler marks find those)."""
    import optuna

    if url.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(journal_path(url)))
    if spec is None:
        return url

    def make() -> Any:
        return optuna.storages.RDBStorage(
            url, heartbeat_interval=spec.heartbeat_s, grace_period=spec.grace_s,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.max_retry))

    if url.startswith("sqlite:"):  # a file here: it does not go away
        return make()
    from xp.studies import outage  # a database server: its outage ridden out, as long as a tracking store's
    from xp.tracking.spool import STORE_WAIT_S

    return outage.rdb(make, redact(url), STORE_WAIT_S)


def open_study(spec: StudySpec) -> Any:
    """The study, on a storage that records heartbeats and retries the trials of dead sweepers."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_storage(spec.storage)
    with warnings.catch_warnings(), first_use(spec.storage, "sweep.storage", seed=optuna_schema):  # one at a time
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = storage_of(spec.storage, spec)
    study = optuna.create_study(study_name=spec.study_name, storage=storage, sampler=make_sampler(spec),
                                pruner=make_pruner(spec), directions=[o.direction for o in spec.objectives],
                                load_if_exists=True)
    wanted = [o.direction for o in spec.objectives]
    have = [d.name.lower() for d in study.directions]
    if have != wanted:
        raise ConfigError(f"sweep={spec.name}: study {spec.study_name} in {redact(spec.storage)} optimises {have}, "
                          f"the spec says {wanted}; use another study_name")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.metric for o in spec.objectives])  # optuna-dashboard shows these names
    study.set_user_attr("xp.sweep", spec.name)
    return study


def retry_dead_trials(study: Any, spec: StudySpec) -> list[str]:
    """Mark trials without a heartbeat for grace_s FAIL; each is queued again with its parameters
    (up to max_retry times). Returns one line per trial found."""
    import optuna

    before = {t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    retries = {t.system_attrs["retry_history"][-1]: t for t in trials if t.system_attrs.get("retry_history")}
    lines = []
    for t in trials:
        if t.number in before and t.state.name == TrialState.FAIL:
            again = retries.get(t.number)
            lines.append(f"trial {t.number} lost its sweeper (no heartbeat for {spec.grace_s} s): "
                         + (f"retried as trial {again.number} with the same parameters" if again
                            else "failed, retry limit reached"))
    return lines


@contextmanager
def heartbeat(study: Any, trials: list[Any]):
    """Record a heartbeat for `trials` every heartbeat interval while the block runs."""
    storage, stop = study._storage, threading.Event()
    if not hasattr(storage, "record_heartbeat"):  # a journal keeps none
        yield
        return
    interval = storage.get_heartbeat_interval()

    def beat() -> None:
        while True:
            for t in trials:
                try:
                    storage.record_heartbeat(t._trial_id)
                except Exception as e:  # a database hiccup must not end the sweep; the next beat tries again
                    log.warning(f"heartbeat of trial {t.number}: {one_line(e)[:200]}")
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="xp-optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def _counts(study: Any) -> tuple[int, int]:
    """(finished trials that count towards the budget, trials running elsewhere). A failed trial that
    was retried does not count: its retry does."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    done = sum(1 for t in trials if t.state.name in FINISHED and t.number not in retried
               and "duplicate_of" not in t.user_attrs  # a proposal dropped as a duplicate of a running trial
               and INTERRUPTED not in t.user_attrs  # stopped with its study and queued again (sweeper.requeue)
               and VOID not in t.user_attrs)  # killed while its parameters were drawn
    return done, sum(1 for t in trials if t.state.name == TrialState.RUNNING)


# --- the job side: a run that is a trial ------------------------------------------

@dataclass(frozen=True)
class StudyTrial:
    """The trial a run is: Optuna's trial (asked, told) and its study's spec (objectives, recipe); `pruner` is
    told each epoch's objectives and asked whether the trial goes on (xp.studies.pruning.Pruning, or a slot's
    channel to the scheduler that holds the study: xp.launching.trialworker.SlotTrial)."""
    optuna: Any
    spec: StudySpec
    pruner: Any


def attach(settings: Any) -> StudyTrial | None:
    """The trial a run is (the plan's StudySettings, from the sweeper's optuna.* overrides), or None."""
    if settings is None:
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec_from(settings.sweep, settings.sweep.get("name") or settings.study, search=False)
    with first_use(settings.storage, "sweep.storage"):
        study = optuna.load_study(study_name=settings.study, storage=storage_of(settings.storage),
                                  pruner=make_pruner(spec))
    from xp.studies.pruning import Pruning

    trial = optuna.trial.Trial(study, settings.trial_id)
    return StudyTrial(trial, spec, Pruning(trial, spec))


def scheduler_mark() -> str:
    """This scheduler process, as a trial records it: host:pid:start (xp.processes.same_process); made once a
    process (every ask marks its trial with it)."""
    return _mark(os.getpid())


@functools.lru_cache(maxsize=1)
def _mark(pid: int) -> str:  # (by pid: a forked process has its own)
    from xp.processes import started

    return f"{socket.gethostname()}:{pid}:{started(pid):.2f}"


def orphaned(mark: str | None) -> bool:
    """Whether a trial marked by `mark` lost its scheduler: one of this host whose process is gone."""
    from xp.processes import same_process

    if not mark or mark.count(":") < 2:
        return False
    host, pid, start = mark.rsplit(":", 2)
    return host == socket.gethostname() and pid.isdigit() and not same_process(int(pid), start)
