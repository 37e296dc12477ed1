"""The study's sweeper: its search (xp.studies.search) asked for trials, each launched as an xp run on the slots
(xp.studies.scheduler) or through Hydra's launcher, and told how it ended, until the search has nothing left to
run; then its answer written once (xp.studies.summary).
(plugins/optuna_sweeper is the Hydra shim that calls run_study.)"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from xp.answers import Member
from xp.errors import redact
from xp.states import INTERRUPTED, RunStatus, TrialState as Told  # (Optuna's TrialState is its own class)
from xp.studies.channel import RunTrial
from xp.studies.pruning import AT
from xp.studies import question
from xp.studies.budget import Budget
from xp.studies.compose import as_override, job_config, plain
from xp.studies.scheduler import Scheduler
from xp.studies.overrides import space_from_overrides
from xp.studies.search import Search
from xp.studies.searches import search_for
from xp.studies.study import StudySpec, spec_from
from xp.studies.summary import BestModel, summarize
from xp.studies.trial import SCHEDULER_ATTR, _counts, heartbeat, open_study, orphaned, retry_dead_trials

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial, Trial


log = logging.getLogger("xp")


def run_study(config: Any, arguments: list[str], launcher: Any, placement: Any,
              at_once: int | None = None) -> list[Any]:
    """Run the study's search (xp.studies.search) until it has nothing left to run; write its answer. Where its
    `placement` (xp.launching.placement) gives it a pool of slots, its scheduler keeps a trial in flight on every
    slot; otherwise (a cluster's Hydra launcher, submitit) trials go to Hydra's `launcher` in batches of
    sweep.parallel (or `at_once`, the jobs a parallel Hydra launcher runs at once, if more)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from xp.tracking.stores import resolve_uri

    space, arguments = space_from_overrides(OverridesParser.create().parse_overrides(arguments))
    spec = placement.spec or _spec_here(config, space, arguments)  # read once, by the command line's preflight
    study = open_study(spec)
    for line in question.settle(study, spec, spec.question or question.question_of(job_config(config), spec)):
        log.warning(line)
    if spec.fixed:
        log.info(f"study {spec.study_name}: {', '.join(spec.fixed)} fixed on the command line: not searched; it "
                 f"searches {', '.join(p.name for p in spec.params)}")
    search = search_for(study, spec, config)  # (the one place that knows which)
    for line in [*retry_dead_trials(study, spec), *retry_orphans(study, spec, search)]:
        log.warning(line)
    # the runs of its failed trials (lost, stopped) that no process ended: an earlier command's, killed, or one whose
    # store did not answer as it stopped (their runs are ended below, once the store is known)
    lost = [t.number for t in study.get_trials(deepcopy=False) if t.state.name == Told.FAIL]
    done, elsewhere = _counts(study)
    remaining = search.remaining()
    log.info(f"study {spec.study_name} ({redact(spec.storage)}): {done} trials done, {elsewhere} running elsewhere, "
             f"{max(0, remaining)} to run ({search.describe()}; objectives "
             + ", ".join(f"{o.direction} {o.metric}" for o in spec.objectives) + ")")
    where = placement.chosen(config, spec)  # the slots of its launcher, or a Hydra launcher's batches
    pool = placement.pool(config, remaining) if remaining > 0 else None
    budget = Budget.of(spec, study, config, hosts=len({s.host for s in pool.slots}) if pool is not None else 1)
    if budget is not None:
        log.info(f"study budget: {budget.line()} spent before this command"
                 + (f" (at ${budget.usd_per_s * 3600:g}/h)" if budget.usd_per_s else ""))
    uri = resolve_uri(config.get("tracking_uri"))
    _end_runs(uri, lost, "its trial failed, its worker or sweeper lost (killed, or gone with its host)",
              RunStatus.FAILED, study=spec.study_name)
    best = BestModel.of(search, spec, uri)  # the registry's alias `best` follows the search's leader as it runs
    parallel = max(where.parallel or 1, at_once or 1)  # a parallel Hydra launcher: as many at a time as it runs
    try:
        if pool is not None:
            with pool:
                returns = [scheduled(study, spec, search, pool, config, arguments, budget, best, uri)]
        else:
            returns = _in_batches(study, spec, search, arguments, launcher, parallel, budget, best) \
                if remaining > 0 else []
    finally:
        if best is not None:
            best.close()
    summarize(study, spec, search, uri)
    return returns


def _in_batches(study: Study, spec: StudySpec, search: Search, arguments: list[str], launcher: Any, parallel: int,
                budget: Any = None, best: BestModel | None = None) -> list[Any]:
    """Ask up to `parallel` trials, launch them as one batch of Hydra jobs, tell, until the search has nothing left
    (or the time or money budget: no batch starts that it would not see to its end, as long as the last one)."""
    from hydra.core.utils import JobStatus

    returns, job, took = [], 0, 0.0
    while (remaining := search.remaining()) > 0:
        if budget is not None and (why := budget.refuses(took)):
            log.info(f"study: no more trials start: {why}")
            break
        started = time.monotonic()
        for line in retry_dead_trials(study, spec):
            log.warning(line)
        trials: list[Any] = []
        while len(trials) < min(parallel, remaining) and (t := search.ask()) is not None:
            trials.append(t)
        if not trials:  # every proposal is another sweeper's running trial: theirs to finish
            log.info("study: every proposal is a trial another sweeper is running: this one ends, they go on")
            break
        jobs = []
        for t in trials:
            settings, _ = search.run_settings(t)
            jobs.append([*arguments, *(as_override(k, v) for k, v in {**t.params, **settings}.items()),
                         f"optuna.study={t.study.study_name}", f"optuna.storage='{spec.storage}'",
                         f"optuna.trial_id={t._trial_id}"])
        with heartbeat(study, trials):
            try:
                results = launcher.launch(jobs, initial_job_idx=job)
            except Exception as e:  # the Hydra launcher's own failure (its cluster, its settings): one line
                from xp.errors import XPError, one_line

                raise XPError(f"hydra/launcher ({type(launcher).__name__}) failed: {one_line(e)[:300]}") from None
        for t, r in zip(trials, results):  # how each ended, as its job returned it (xp.cli: {"state", "values"})
            out = r._return_value if r.status == JobStatus.COMPLETED and isinstance(r._return_value, dict) else {}
            if search.told(t, str(out.get("state")), out.get("values") or []) == Told.COMPLETE and best:
                best.told(search.leader())
        took = time.monotonic() - started
        if budget is not None:
            budget.save(force=True)
        returns.append(results)
        job += len(trials)
    return returns


def _spec_here(config: Any, space: tuple[Any, ...], arguments: list[str]) -> StudySpec:
    """The study's spec from its composed config and the search space on its command line: for a command whose
    config tree xp did not compose (--config-path), which no preflight read."""
    node = plain(config.sweep)
    name = node.get("name") or config.hydra.runtime.choices.get("sweep")  # a user's file has no name field
    return spec_from(node, name, extra=space, overrides=arguments)


def scheduled(study: Study, spec: StudySpec, search: Search, pool: Any, config: Any, arguments: list[str],
              budget: Any = None, best: BestModel | None = None, uri: str | None = None) -> Any:
    """The search's trials kept in flight on the pool's slots (xp.studies.scheduler); returns its tally."""
    from pathlib import Path

    sweep_dir = Path(str(config.hydra.sweep.dir))
    # the user's config folders (--config-dir, hydra.searchpath), as the jobs of a sweep see them
    paths = [f"{s.schema}://{s.path}" for s in config.hydra.runtime.config_sources
             if s.provider in ("command-line", "hydra.searchpath in command-line", "hydra.searchpath in main")]
    searchpath = [f"hydra.searchpath=[{','.join(paths)}]"] if paths else []
    runs = Runs(study, spec, search, uri, os.environ.get("XP_PARENT_RUN_ID"), best,
                [*searchpath, *arguments], arguments, sweep_dir, _base_config(config, arguments, searchpath))
    try:
        tally = Scheduler(pool, search, runs, spec.heartbeat_s, budget=budget).run()
    except BaseException:  # stopped (Ctrl-C), or failed: no long wait for the store
        runs.end_unended(3.0)
        raise
    from xp.tracking.spool import STORE_WAIT_S

    runs.end_unended(STORE_WAIT_S)
    return tally


class Runs:
    """The runs of a study's trials, as the scheduler starts and ends them: each trial's message to its worker and
    who runs it; the registry's `best` told of each complete trial; and the runs that do not end on their own: one
    whose worker was lost, those in flight or held when the study stops early (queued again), the one a gone worker
    finished last. Each one's run is ended in the store where its worker could not (gone, perhaps with its host:
    nothing there may ever start again to end it)."""

    def __init__(self, study: Study, spec: StudySpec, search: Search, uri: str | None, parent: str | None,
                 best: BestModel | None, base: list[str], arguments: list[str], sweep_dir: Any,
                 config: dict[str, Any] | None):
        self.study, self.spec, self.search, self.uri, self.parent, self.best = study, spec, search, uri, parent, best
        self.base, self.arguments, self.sweep_dir, self.config = base, arguments, sweep_dir, config
        self.unended: list[tuple[list[int], str, RunStatus]] = []  # (trials, why, state) whose runs wait to be ended

    def message(self, trial: Trial, job: int) -> RunTrial:
        settings, tags = self.search.run_settings(trial)
        return RunTrial(trial.number, trial.params, trial.study.study_name, self.spec.name, self.base,
                        [*self.arguments, *(as_override(k, v) for k, v in {**trial.params, **settings}.items())],
                        str(self.sweep_dir / str(job)), self.parent, self.config, settings=settings, tags=tags)

    def told(self, trial: Trial, state: str, leader: Member | None) -> None:
        if state == Told.COMPLETE and self.best is not None:
            self.best.told(leader)

    def _end_runs(self, trials: list[Any], why: str, state: RunStatus) -> None:
        if not _end_runs(self.uri, [t.number for t in trials], why, state, parent=self.parent):
            self.unended.append(([t.number for t in trials], why, state))

    def end_unended(self, wait_s: float) -> None:
        """The runs _end_runs could not end (the store was away): ended now, waiting up to wait_s for the store (found
        by benchmarks/chaos.py: a COMPLETE trial's run, its worker gone with its host during a tracking outage,
        stayed RUNNING); what is still left, one line."""
        deadline = time.monotonic() + wait_s
        while self.unended and time.monotonic() < deadline:
            if _end_runs(self.uri, *self.unended[0], parent=self.parent):
                self.unended.pop(0)
            else:
                time.sleep(2.0)
        for numbers, why, _ in self.unended:
            log.warning(f"study: the runs of trials {', '.join(map(str, numbers))} could not be ended ({why}): the "
                        "tracking store did not answer; the next command of the study ends them")

    def lost(self, trial: Trial, why: str) -> None:
        self._end_runs([trial], f"its worker was lost: {why}", RunStatus.FAILED)
        log.warning(f"trial {trial.number} lost its worker ({why}): {self.search.lost(trial, why)}")

    def give_back(self, trials: list[Any], why: str) -> None:
        # (a worker, stopped, did not end its run in time)
        self._end_runs(trials, f"the study was {why}", RunStatus.KILLED)
        for t in trials:
            requeue(t)
        log.warning(f"study {why}: trial{'s' if len(trials) > 1 else ''} "
                    + ", ".join(str(t.number) for t in trials)
                    + " given back to the study (the same command runs them first)")

    def unsettled(self, trial: Trial, state: str | None, why: str) -> None:
        self._end_runs([trial], f"its worker went ({why}) before its records reached the store",
                       RunStatus.FINISHED if state in (Told.COMPLETE, Told.PRUNED) else RunStatus.FAILED)


def _end_runs(uri: str | None, numbers: list[int], why: str, state: RunStatus, parent: str | None = None,
              study: str | None = None) -> bool:
    """End the runs of the trials `numbers` that their workers could not (xp.tracking.ending.end_lost): under the
    parent run (this command's), or the `study`'s under any parent (an earlier command's). False: the store did not
    answer."""
    from xp.tracking.messages import EndLost
    from xp.trackingd import call

    parent = parent or os.environ.get("XP_PARENT_RUN_ID")
    if parent and uri and numbers:  # (by the tracking service: this process imports no MLflow)
        return call(EndLost(uri, parent, numbers, why, state, study)) is not None
    return True


def _base_config(config: Any, arguments: list[str], searchpath: list[str]) -> dict[str, Any]:
    """The config a study's trials set their parameters on, as the workers get it (on other hosts the user's study
    file and config folders may not exist; on this one a worker so needs no Hydra of its own). Where the command
    line held no search space, Hydra composed exactly that for the sweep (less its own node): taken from there, not
    composed again (0.25 s before the first trial)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(arguments))
    if list(config.hydra.overrides.task) == list(arguments) and not any(o.is_sweep_override() for o in parsed):
        base = plain(config, resolve=False)
        base.pop("hydra", None)
        return base
    from hydra import compose

    return plain(compose("config", overrides=[*searchpath, *arguments]), resolve=False)


def requeue(trial: Trial) -> None:
    """A trial the study stops before it ends: FAIL, marked INTERRUPTED (not counted: trial._counts), and queued
    again in its own study with its parameters and what its search noted on it (WAITING: the next ask takes it
    first), not counted against max_retry (the trial did nothing wrong)."""
    import optuna
    from optuna.trial import TrialState

    study = trial.study
    frozen = study._storage.get_trial(trial._trial_id)
    if frozen.state != TrialState.RUNNING:  # told already (the stop came as it was)
        return
    study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
    study.tell(trial, state=TrialState.FAIL)
    noted = {k: v for k, v in frozen.user_attrs.items()  # (a PBT member's lineage; not its epochs' objectives)
             if k not in RUN_ATTRS and not k.startswith(AT)}
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params=frozen.params,
                                              distributions=frozen.distributions,
                                              system_attrs=frozen.system_attrs,
                                              user_attrs={**noted, "interrupted_from": frozen.number}))


RUN_ATTRS = {"mlflow_run_id", SCHEDULER_ATTR, INTERRUPTED, "interrupted_from"}  # a trial's run's, not its search's


UNMARKED_S = 2.0  # a RUNNING trial nobody marked for this long lost its asker (a live one marks it in milliseconds)


def retry_orphans(study: Study, spec: StudySpec, search: Search) -> list[str]:
    """Trials left RUNNING by a scheduler of this host whose process is gone (SIGKILL, out of memory): lost at
    once (the search retries them as it sees fit), without waiting for grace_s. So is a trial still unmarked and
    without parameters UNMARKED_S after it was seen: its asker was killed between Optuna's creating it and the
    sampler's first call, which marks it (xp.studies.trial.make_sampler). (A trial another program asked on the
    same study is left alone once its objective has suggested a parameter.)"""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    def running() -> list[FrozenTrial]:
        return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    unmarked = {t.number for t in running() if SCHEDULER_ATTR not in t.user_attrs and not t.params}
    if unmarked:
        time.sleep(UNMARKED_S)
    lines = []
    for t in running():
        mark = t.user_attrs.get(SCHEDULER_ATTR)
        if orphaned(mark) or (mark is None and not t.params and t.number in unmarked):
            said = "its process is gone" if mark else "its asker was killed as it asked (it has no mark)"
            why = "its sweeper's process is gone" if mark else said
            try:
                lines.append(f"trial {t.number} lost its sweeper ({said}): {search.lost(optuna_trial(study, t), why)}")
            except UpdateFinishedTrialError:  # another command of the study retried it first (found by chaos.py)
                continue
    return lines


def optuna_trial(study: Study, frozen: FrozenTrial) -> Any:
    import optuna

    return optuna.trial.Trial(study, frozen._trial_id)
