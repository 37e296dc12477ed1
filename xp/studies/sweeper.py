"""The study's sweeper: ask Optuna for trials, launch each as an xp run through Hydra's launcher, tell Optuna how
it ended, until the budget is spent; then report the best trial (or the Pareto front) on the parent run.
(plugins/optuna_sweeper is the Hydra shim that calls run_study.)"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from typing import Any

from xp.errors import redact
from xp.states import RunStatus, TrialState as Told  # (Optuna's TrialState is its own class)
from xp.studies.channel import Done, RunTrial
from xp.studies import question
from xp.studies.budget import Budget
from xp.studies.compose import as_override, job_config, plain
from xp.studies.scheduler import SCHEDULER_ATTR, Scheduler, orphaned, scheduler_mark
from xp.studies.overrides import space_from_overrides
from xp.studies.pbt import PBT_ATTR
from xp.studies.proposals import propose
from xp.studies.study import StudySpec, spec_from
from xp.studies.summary import BestModel, summarize
from xp.studies.trial import INTERRUPTED, _counts, distributions, heartbeat, open_study, retry_dead_trials

log = logging.getLogger("xp")


def run_study(config: Any, arguments: list[str], launcher: Any, placement: Any,
              at_once: int | None = None) -> list[Any]:
    """Run trials until the study has n_trials finished ones; report the best. Where its `placement`
    (xp.launching.placement) gives it a pool of slots, its scheduler keeps a trial in flight on every slot;
    otherwise (a cluster's Hydra launcher, submitit) trials go to Hydra's `launcher` in batches of sweep.parallel
    (or `at_once`, the jobs a parallel Hydra launcher runs at once, if more)."""
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
    for line in [*retry_dead_trials(study, spec), *retry_orphans(study, spec)]:
        log.warning(line)
    done, elsewhere = _counts(study)
    remaining = spec.n_trials - done - elsewhere  # (a population's: its members' intervals to go, a lost one's
    if spec.pbt:  # replacement among them; its failure spent no budget)
        remaining = int(_population(study, spec, config, {}).remaining())
    log.info(f"study {spec.study_name} ({redact(spec.storage)}): {done} trials done, {elsewhere} running elsewhere, "
             f"{max(0, remaining)} to run "
             f"(sampler {spec.sampler}, pruner {spec.pruner}, objectives "
             + ", ".join(f"{o.direction} {o.metric}" for o in spec.objectives) + ")")
    if spec.sampler == "grid":
        import itertools

        combos = list(itertools.product(*(p.choices for p in spec.params)))
        spec = dataclasses.replace(spec, n_trials=min(spec.n_trials, len(combos)))  # the grid, at most
        for combo in combos:
            study.enqueue_trial(dict(zip((p.name for p in spec.params), combo)), skip_if_exists=True)
    where = placement.chosen(config, spec)  # the slots of its launcher, or a Hydra launcher's batches
    pool = placement.pool(config, remaining) if remaining > 0 else None
    budget = Budget.of(spec, study, config, hosts=len({s.host for s in pool.slots}) if pool is not None else 1)
    if budget is not None:
        log.info(f"study budget: {budget.line()} spent before this command"
                 + (f" (at ${budget.usd_per_s * 3600:g}/h)" if budget.usd_per_s else ""))
    uri = resolve_uri(config.get("tracking_uri"))
    best = BestModel.of(study, spec, uri)  # the registry's alias `best` follows the best trial as the study runs
    parallel = max(where.parallel or 1, at_once or 1)  # a parallel Hydra launcher: as many at a time as it runs
    try:
        if pool is not None:
            with pool:
                returns = [scheduled(study, spec, pool, config, arguments, budget, best, uri)]
        else:
            returns = _in_batches(study, spec, arguments, launcher, parallel, budget, best) if remaining > 0 else []
        returns += _confirmations(study, spec, config, arguments, placement, launcher, parallel, budget, uri)
    finally:
        if best is not None:
            best.close()
    summarize(study, spec, uri, base_seed=int(config.get("seed") or 0))
    return returns


def _confirmations(study: Any, spec: StudySpec, config: Any, arguments: list[str], placement: Any, launcher: Any,
                   parallel: int, budget: Any, uri: str | None) -> list[Any]:
    """sweep.confirm=K: the study's best trials retrained with K other seeds (xp.studies.confirm), as the trials of
    its confirming study, on slots (workers started anew: the study's gave theirs back as its budget ran out) or
    in Hydra's batches. A study stopped (Ctrl-C) starts none (its stop ends the command first); a spent time or
    money budget starts none (the budget refuses them as it would a trial)."""
    from xp.studies import confirm

    made = confirm.prepared(study, spec, int(config.get("seed") or 0))
    if made is None:
        return []
    cstudy, cspec = made
    done, running = _counts(cstudy)
    todo = cspec.n_trials - done - running
    if todo <= 0:
        return []
    log.info(f"study {spec.study_name}: its {spec.confirm_top} best trials retrained with {spec.confirm} other "
             f"seeds each ({cspec.study_name}: {todo} runs to go)")
    pool = placement.pool(config, todo)
    if pool is not None:
        with pool:
            return [scheduled(cstudy, cspec, pool, config, arguments, budget, None, uri, label="confirm")]
    return _in_batches(cstudy, cspec, [*arguments, "sweep.pruner=none"], launcher, parallel, budget, None)


def _in_batches(study: Any, spec: StudySpec, arguments: list[str], launcher: Any, parallel: int,
                budget: Any = None, best: BestModel | None = None) -> list[Any]:
    """Ask `parallel` trials, launch them as one batch of Hydra jobs, tell, until the budget is spent (the trials'
    number, or the time or money: no batch starts that it would not see to its end, as long as the last one)."""
    done, elsewhere = _counts(study)
    remaining, returns, job, took = spec.n_trials - done - elsewhere, [], 0, 0.0
    while remaining > 0:
        if budget is not None and (why := budget.refuses(took)):
            log.info(f"study: no more trials start: {why}")
            break
        started = time.monotonic()
        for line in retry_dead_trials(study, spec):
            log.warning(line)
        trials, reused = propose(study, distributions(spec), min(parallel, remaining))
        remaining -= reused
        if not trials and not reused:  # every proposal is another sweeper's running trial: theirs to finish
            log.info("study: every proposal is a trial another sweeper is running: this one ends, they go on")
            break
        if not trials:
            continue
        jobs = [[*arguments, *(as_override(k, v) for k, v in t.params.items()), f"optuna.study={spec.study_name}",
                 f"optuna.storage='{spec.storage}'", f"optuna.trial_id={t._trial_id}"] for t in trials]
        with heartbeat(study, trials):
            try:
                results = launcher.launch(jobs, initial_job_idx=job)
            except Exception as e:  # the Hydra launcher's own failure (its cluster, its settings): one line
                from xp.errors import XPError, one_line

                raise XPError(f"hydra/launcher ({type(launcher).__name__}) failed: {one_line(e)[:300]}") from None
        _tell(study, trials, results, best)
        took = time.monotonic() - started
        if budget is not None:
            budget.save(force=True)
        returns.append(results)
        job += len(trials)
        done, elsewhere = _counts(study)
        remaining = spec.n_trials - done - elsewhere
    return returns


def _spec_here(config: Any, space: tuple[Any, ...], arguments: list[str]) -> StudySpec:
    """The study's spec from its composed config and the search space on its command line: for a command whose
    config tree xp did not compose (--config-path), which no preflight read."""
    node = plain(config.sweep)
    name = node.get("name") or config.hydra.runtime.choices.get("sweep")  # a user's file has no name field
    return spec_from(node, name, extra=space, overrides=arguments)


def scheduled(study: Any, spec: StudySpec, pool: Any, config: Any, arguments: list[str], budget: Any = None,
              best: BestModel | None = None, uri: str | None = None, label: str = "study") -> Any:
    """The study's trials kept in flight on the pool's slots (xp.studies.scheduler); returns its tally."""
    from pathlib import Path

    from optuna.trial import TrialState

    dists, mark = distributions(spec), scheduler_mark()
    sweep_dir = Path(str(config.hydra.sweep.dir))
    # the user's config folders (--config-dir, hydra.searchpath), as the jobs of a sweep see them
    paths = [f"{s.schema}://{s.path}" for s in config.hydra.runtime.config_sources
             if s.provider in ("command-line", "hydra.searchpath in command-line", "hydra.searchpath in main")]
    searchpath = [f"hydra.searchpath=[{','.join(paths)}]"] if paths else []

    base = _base_config(config, arguments, searchpath)
    population = _population(study, spec, config, dists) if spec.pbt else None

    def ask() -> Any:  # (None: the budget is spent, or every proposal is a running trial's: wait for an end)
        if population is not None:
            return population.ask()
        while remaining() > 0:
            trials, reused = propose(study, dists, 1)
            if trials or not reused:
                return trials[0] if trials else None
        return None

    def remaining() -> int:
        if population is not None:
            return int(population.remaining())
        done, running = _counts(study)
        return spec.n_trials - done - running

    def trial_message(trial: Any, job: int) -> RunTrial:
        params = [as_override(k, v) for k, v in trial.params.items()]
        settings = population.settings(trial) if population is not None else {}
        return RunTrial(trial.number, trial.params, spec.study_name, spec.name, [*searchpath, *arguments],
                        [*arguments, *params, *(as_override(k, v) for k, v in settings.items())],
                        str(sweep_dir / str(job)), os.environ.get("XP_PARENT_RUN_ID"), base, settings=settings,
                        tags=population.tags(trial) if population is not None else None)

    def tell(trial: Any, msg: Done) -> str:
        state = msg.state
        if state == Told.COMPLETE:  # (a member's interval that does not end its training is no answer yet)
            _completed(study, trial, msg.values, best if population is None or population.final(trial) else None)
        elif state == Told.PRUNED:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, state=TrialState.FAIL)
            state = Told.FAIL
        if population is not None:
            population.told(trial, state, msg.error)
        return state

    ends = _Unended(study, spec, uri, os.environ.get("XP_PARENT_RUN_ID"), population)
    scheduler = Scheduler(pool, ask, remaining, trial_message, tell, ends.lost, spec.heartbeat_s,
                          None if spec.multi_objective else spec.objectives[0].direction,
                          mark=lambda trial: trial.set_user_attr(SCHEDULER_ATTR, mark), give_back=ends.give_back,
                          unsettled=ends.unsettled, budget=budget, label=label,
                          answers=population.final if population is not None else lambda trial: True)
    return scheduler.run()


class _Unended:
    """The trials that do not end on their own: one whose worker was lost (retried), those in flight or held when
    the study stops early (queued again), the one a gone worker finished last. Each one's run is ended in the store
    where its worker could not (gone, perhaps with its host: nothing there may ever start again to end it)."""

    def __init__(self, study: Any, spec: StudySpec, uri: str | None, parent: str | None, population: Any = None):
        self.study, self.spec, self.uri, self.parent = study, spec, uri, parent
        self.population = population  # search=pbt: a lost member's interval is replaced from the population

    def _end_runs(self, trials: list[Any], why: str, state: RunStatus) -> None:
        from xp.tracking import service
        from xp.tracking.ending import end_lost

        if self.parent and self.uri and trials:  # (by the tracking service: this process imports no MLflow)
            service.call(self.uri, end_lost, parent=self.parent, trial_numbers=[t.number for t in trials], why=why,
                         state=state)

    def lost(self, trial: Any, why: str) -> None:
        from optuna.trial import TrialState

        self._end_runs([trial], f"its worker was lost: {why}", RunStatus.FAILED)
        self.study.tell(trial, state=TrialState.FAIL)
        if self.population is not None:
            self.population.lost(trial)
            return
        again = _retry(self.study, self.spec, trial._trial_id)
        log.warning(f"trial {trial.number} lost its worker ({why}): "
                    + ("retried with the same parameters" if again else "failed, retry limit reached"))

    def give_back(self, trials: list[Any], why: str) -> None:
        # (a worker, stopped, did not end its run in time)
        self._end_runs(trials, f"the study was {why}", RunStatus.KILLED)
        for t in trials:
            requeue(self.study, t)
        log.warning(f"study {why}: trial{'s' if len(trials) > 1 else ''} "
                    + ", ".join(str(t.number) for t in trials)
                    + " given back to the study (the same command runs them first)")

    def unsettled(self, trial: Any, state: str | None, why: str) -> None:
        self._end_runs([trial], f"its worker went ({why}) before its records reached the store",
                      RunStatus.FINISHED if state in (Told.COMPLETE, Told.PRUNED) else RunStatus.FAILED)


def _population(study: Any, spec: StudySpec, config: Any, dists: dict[str, Any]) -> Any:
    """search=pbt: the study's population; its members commit under checkpoint_dir (or checkpoints/pbt-STUDY),
    which every slot's host must reach (a shared file system where the slots are other hosts)."""
    from pathlib import Path

    from xp.studies.pbt import Population
    from xp.studies.pbtspec import check_run

    check_run(spec.pbt, config.get("epochs"), spec.n_trials, f"sweep={spec.name}")
    root = Path(config.get("checkpoint_dir") or Path("checkpoints") / f"pbt-{spec.study_name}").expanduser()
    return Population(study, spec, dists, int(config.epochs), root.absolute(), spec.sampler_seed,
                      (config.get("model") or {}).get("log") != "none")


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


def _retry(study: Any, spec: StudySpec, trial_id: int) -> bool:
    """Queue a failed trial again with its parameters (as Optuna's retry of stale trials does), up to
    max_retry times; whether it was queued."""
    import optuna

    frozen = study._storage.get_trial(trial_id)
    before = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.max_retry)(study, frozen)
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))) > before


def requeue(study: Any, trial: Any) -> None:
    """A trial the study stops before it ends: FAIL, marked INTERRUPTED (not counted: trial._counts), and queued
    again with its parameters (WAITING: the next ask takes it first), not counted against max_retry (the trial did
    nothing wrong)."""
    import optuna
    from optuna.trial import TrialState

    frozen = study._storage.get_trial(trial._trial_id)
    if frozen.state != TrialState.RUNNING:  # told already (the stop came as it was)
        return
    study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
    study.tell(trial, state=TrialState.FAIL)
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params=frozen.params,
                                              distributions=frozen.distributions,
                                              system_attrs=frozen.system_attrs,
                                              user_attrs={"interrupted_from": frozen.number,  # (a PBT member's
                                                          **{k: v for k, v in frozen.user_attrs.items()  # lineage)
                                                             if k == PBT_ATTR}}))


def retry_orphans(study: Any, spec: StudySpec) -> list[str]:
    """Trials left RUNNING by a scheduler of this host whose process is gone (SIGKILL, out of memory): FAIL at
    once, each retried with its parameters (up to max_retry times), without waiting for grace_s."""
    from optuna.trial import TrialState

    lines = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if orphaned(t.user_attrs.get(SCHEDULER_ATTR)):
            study.tell(t.number, state=TrialState.FAIL)
            again = _retry(study, spec, t._trial_id)
            lines.append(f"trial {t.number} lost its sweeper (its process is gone): "
                         + ("retried with the same parameters" if again else "failed, retry limit reached"))
    return lines


def _completed(study: Any, trial: Any, values: list[float], best: BestModel | None) -> None:
    """Tell the study a trial completed, and its registry's alias (BestModel) that it may be the best."""
    study.tell(trial, values)
    if best is not None:
        best.told(trial, values)


def _tell(study: Any, trials: list[Any], results: list[Any], best: BestModel | None = None) -> None:
    """How each launched trial ended, as its job returned it (xp.cli: {"state", "values"})."""
    from hydra.core.utils import JobStatus
    from optuna.trial import TrialState

    for t, r in zip(trials, results):
        out = r._return_value if r.status == JobStatus.COMPLETED and isinstance(r._return_value, dict) else {}
        if out.get("state") == Told.COMPLETE:
            _completed(study, t, out["values"], best)
        elif out.get("state") == Told.PRUNED:
            study.tell(t, state=TrialState.PRUNED)
        else:
            study.tell(t, state=TrialState.FAIL)
