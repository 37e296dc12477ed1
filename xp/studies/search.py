"""How a study searches: one seam. The runners (xp.studies.scheduler's slots, the sweeper's Hydra batches) drive a
`Search` and never ask which one it is: what to run next (`ask`), a result told (`told`), a trial lost (`lost`),
what remains (`remaining`), the best so far (`leader`) and its answer (`answer`, xp.answers).

Implementations side by side: Optuna's sampler and pruner (`Sampled`, here), the population (xp.studies.pbt), the
confirmation across seeds (xp.studies.confirm, around another search), a warm start (xp.studies.warm, around
Optuna's). A study file picks one in one place: xp.studies.searches.search_for.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any, Protocol

from xp.states import TrialState as Told
from xp.answers import Answer, Member, best_of, member, ranked
from xp.studies.study import StudySpec

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import Trial


log = logging.getLogger("xp")


class Search(Protocol):
    def label(self, trial: Trial) -> str:
        """A trial's progress line's first word ("study"; a confirmation's runs: "confirm")."""

    def describe(self) -> str:
        """How it searches, in words: `tpe sampler, median pruner`."""

    def remaining(self) -> int:
        """Trials it has left to start (its budget less those finished and running)."""

    def ask(self) -> Any:
        """The next trial to run (an Optuna trial), or None: none now (the budget is spent, or wait for an end)."""

    def run_settings(self, trial: Trial) -> tuple[dict[str, Any], dict[str, str] | None]:
        """The config values a trial's run is given beside its parameters, and the tags its run carries."""

    def told(self, trial: Trial, state: str, values: list[float], error: str | None = None) -> str:
        """A trial ended: tell the study (COMPLETE with its values, PRUNED, else FAIL); returns the state told."""

    def lost(self, trial: Trial, why: str) -> str:
        """A trial's worker was lost: the study told FAIL; retried as the search sees fit, which it says
        ("retried with the same parameters")."""

    def leader(self) -> Member | None:
        """The best so far by the search's own rule (the answer it would give now), or None."""

    def answer(self) -> Answer:
        """Its answer: the best (one tie-break rule), and what only this search knows (confirmation, lineage)."""


def metrics(spec: StudySpec) -> list[str]:
    return [o.metric for o in spec.objectives]


def maximize(spec: StudySpec) -> bool:
    return spec.objectives[0].direction == "maximize"


def answerable(study: Study) -> list[Any]:
    """The study's complete trials that can be its answer: not a reused copy of an earlier one's result, not a
    proposal dropped as a duplicate, with finite values."""
    from optuna.trial import TrialState

    from xp.states import INTERRUPTED
    from xp.studies.trial import DUPLICATE

    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if DUPLICATE not in t.user_attrs and INTERRUPTED not in t.user_attrs
            and "reused_from_trial" not in t.user_attrs and t.values and all(math.isfinite(v) for v in t.values)]


class Sampled:
    """Optuna's sampler proposes, its pruner stops trials early (in the run, asked over the channel); a lost
    trial is retried with its parameters up to max_retry times."""

    def __init__(self, study: Study, spec: StudySpec):
        from xp.studies.trial import distributions

        self.study, self.spec, self.dists = study, spec, distributions(spec)
        self.n_trials = spec.n_trials
        if spec.sampler == "grid":  # every combination queued once; the grid, at most
            import itertools

            combos = list(itertools.product(*(p.choices for p in spec.params)))
            self.n_trials = min(spec.n_trials, len(combos))
            for combo in combos:
                study.enqueue_trial(dict(zip((p.name for p in spec.params), combo)), skip_if_exists=True)

    def label(self, trial: Trial) -> str:
        return "study"

    def describe(self) -> str:
        return f"{self.spec.sampler} sampler, {self.spec.pruner} pruner"

    def remaining(self) -> int:
        from xp.studies.trial import _counts

        done, running = _counts(self.study)
        return self.n_trials - done - running

    def ask(self) -> Any:
        from xp.studies.proposals import propose

        while self.remaining() > 0:
            self.proposing()
            trials, reused = propose(self.study, self.dists, 1)
            if trials or not reused:  # (reused: an earlier result told at once; none: wait for an end)
                return trials[0] if trials else None
        return None

    def proposing(self) -> None:
        """Before each proposal is asked (a warm start queues its own here: xp.studies.warm)."""

    def run_settings(self, trial: Trial) -> tuple[dict[str, Any], dict[str, str] | None]:
        return {}, None

    def told(self, trial: Trial, state: str, values: list[float], error: str | None = None) -> str:
        return tell(self.study, trial, state, values)

    def lost(self, trial: Trial, why: str) -> str:
        from optuna.trial import TrialState

        from xp.states import VOID
        from xp.studies.trial import replay

        frozen = self.study._storage.get_trial(trial._trial_id)
        if not replay(frozen) and set(frozen.params) != set(self.dists):  # killed while the sampler drew them
            self.study._storage.set_trial_user_attr(trial._trial_id, VOID, why)
            self.study.tell(trial, state=TrialState.FAIL)
            return "killed while its parameters were drawn: the next proposal draws them again"
        self.study.tell(trial, state=TrialState.FAIL)
        again = retry(self.study, self.spec, trial._trial_id)
        return "retried with the same parameters" if again else "failed, retry limit reached"

    def leader(self) -> Member | None:
        if self.spec.multi_objective:
            return None
        best, _ = best_of(answerable(self.study), maximize(self.spec))
        return None if best is None else member(best, metrics(self.spec))

    def answer(self) -> Answer:
        trials = answerable(self.study)
        if self.spec.multi_objective:
            front = {t.number for t in self.study.best_trials}
            best, ties = sorted((t for t in trials if t.number in front), key=lambda t: t.number), []
            order = [*best, *(t for t in trials if t.number not in front)]
        else:
            order = ranked(trials, maximize(self.spec))
            top, tied = best_of(trials, maximize(self.spec))
            best, ties = ([top] if top is not None else []), [t.number for t in tied]
        return Answer(self.spec.study_name, self.describe(),
                      [{"metric": o.metric, "direction": o.direction} for o in self.spec.objectives],
                      [member(t, metrics(self.spec)) for t in best], rule=rule(self.spec), ties=ties,
                      ranking=[t.number for t in order])


def rule(spec: StudySpec) -> str:
    from xp.answers import RULE

    if spec.multi_objective:
        return "the Pareto front: the trials no other beats on every objective"
    return f"the {'highest' if maximize(spec) else 'lowest'} {spec.objectives[0].metric}; {RULE}"


def tell(study: Study, trial: Trial, state: str, values: list[float]) -> str:
    """Tell `study` how `trial` ended: COMPLETE with its values, PRUNED, or FAIL (anything else)."""
    from optuna.trial import TrialState

    if state == Told.COMPLETE:
        study.tell(trial, values)
        return Told.COMPLETE
    if state == Told.PRUNED:
        study.tell(trial, state=TrialState.PRUNED)
        return Told.PRUNED
    study.tell(trial, state=TrialState.FAIL)
    return Told.FAIL


def retry(study: Study, spec: StudySpec, trial_id: int) -> bool:
    """Queue a failed trial again with its parameters (as Optuna's retry of stale trials does), up to
    max_retry times; whether it was queued."""
    import optuna

    frozen = study._storage.get_trial(trial_id)
    before = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.max_retry)(study, frozen)
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))) > before
